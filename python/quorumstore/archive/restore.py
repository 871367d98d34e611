"""A cluster's data directory rebuilt from its archive, as it was at a point: what
`quorumstore restore` does, and `standalone` and `cluster` when they start with an
archive and no data.

Each shard is rebuilt once (its kept snapshot at or before the point, then the archived
entries after it up to the point, each checked to chain from the one before) and copied
to every member of its ensemble, in the layout `standalone` (one node: `node/`) and
`cluster` (`node0/`, `node1/`, ... by port) use, with the coordinator's metadata in
`coordinator/metadata.pb`.

The restored cluster is a new epoch (docs/protocol.md, "Restored clusters"): every
replica of a shard holds the same restored log position under a new incarnation, and
the metadata saves no incarnation, the restored offset as the known commit offset and
no term below the archived one. The coordinator then counts every member, records the
incarnation each first reports, and elects in a term above the restored one.

Everything is built in `<dir>.restoring` and moved into place at the end, so an
interrupted restore leaves no data directory that a node could start from.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from quorumstore.archive.manifest import ArchiveError, RestorePlan, plan_restore
from quorumstore.archive.objects import check_chain, decode_segment, read_framed_chunks
from quorumstore.archive.store import ArchiveStore
from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import ClusterMetadata, ShardState, placed_nodes
from quorumstore.protocol.messages import ShardKey
from quorumstore.protocol.types import LogPosition
from quorumstore.storage.durable_files import replace_durably
from quorumstore.storage.replica_files import new_incarnation, replica_dir, save_term
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.snapshot import install_snapshot
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.wal import Wal
from quorumstore.wire import replication as wire
from quorumstore.wire.addresses import host_of

#: Where `standalone` and `cluster` keep the coordinator's metadata in their data directory.
METADATA_PATH = Path("coordinator") / "metadata.pb"
#: Entries applied per call while restoring.
_APPLY_BATCH = 256


def node_dirs(metadata: ClusterMetadata) -> dict[str, Path]:
    """Each node's directory (relative to the data directory): `node` for a standalone
    server's one node; `node<i>` in port order for a `cluster`, whose node i listens on
    its base port + i."""
    nodes = sorted(placed_nodes(metadata), key=lambda n: (host_of(n), int(n.rpartition(":")[2])))
    if len(nodes) == 1:
        return {nodes[0]: Path("node")}
    return {node: Path(f"node{i}") for i, node in enumerate(nodes)}


def holds_cluster_data(data_dir: Path) -> bool:
    """Whether `data_dir` holds node data or coordinator metadata of the layout."""
    return (data_dir / METADATA_PATH).exists() or any(data_dir.glob("node*/shards"))


def archived_metadata(store: ArchiveStore) -> ClusterMetadata | None:
    """The coordinator metadata last archived; None if nothing was archived there yet."""
    with store_errors(store):
        raw = store.load_metadata()
    return None if raw is None else wire.metadata_from_pb(pb.CoordinatorMetadata.FromString(raw))


def restore_cluster(
    store: ArchiveStore,
    data_dir: Path,
    *,
    time_ms: int | None = None,
    offsets: Mapping[ShardKey, int] | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> ClusterMetadata:
    """Builds `data_dir` from the archive at `time_ms`, at `offsets` (shard -> last offset;
    shards not named: their last archived entry), or at the last archived entries."""
    offsets = dict(offsets or {})
    metadata = archived_metadata(store)
    if metadata is None:
        raise ArchiveError(f"nothing is archived at {store.url} (no cluster metadata there)")
    unknown = sorted(set(offsets) - set(metadata.shards))
    if unknown:
        raise ArchiveError(
            f"the archive at {store.url} holds no shard {', '.join(f'{n}/{i}' for n, i in unknown)}; "
            f"its shards are {', '.join(f'{n}/{i}' for n, i in sorted(metadata.shards))}"
        )
    if holds_cluster_data(data_dir):
        raise ArchiveError(
            f"{data_dir} already holds cluster data; restore into a new directory (a restore "
            "never mixes with data it did not write)"
        )
    with store_errors(store):
        plans = {}
        for key in sorted(metadata.shards):
            manifest = store.load_manifest(key)
            if manifest is None:
                raise ArchiveError(
                    f"shard {key[0]}/{key[1]} has nothing in the archive at {store.url}"
                )
            plans[key] = plan_restore(manifest, offsets.get(key), time_ms)
        staging = data_dir.with_name(data_dir.name + ".restoring")
        shutil.rmtree(staging, ignore_errors=True)
        dirs = node_dirs(metadata)
        shards = {}
        for key, plan in plans.items():
            shard = metadata.shards[key]
            work = staging / "work"
            position = _rebuild_shard(store, key, plan, work / "kv", progress)
            term = max(position.term, shard.term)
            for member in shard.ensemble:
                directory = replica_dir(staging / dirs[member], key)
                shutil.copytree(work / "kv", directory / "kv")
                with Wal.open(directory / "wal") as wal:
                    wal.reset(position)
                save_term(directory, term)
                new_incarnation(directory)
            shutil.rmtree(work)
            shards[key] = replace(
                shard,
                term=term,
                leader=None,
                state=ShardState.ELECTION,
                eligible=frozenset(shard.ensemble),
                known_commit_offset=position.offset,
                incarnations={},
            )
            progress(f"shard {key[0]}/{key[1]}: restored at offset {position.offset}")
    restored = ClusterMetadata(metadata.version + 1, shards)
    replace_durably(staging / METADATA_PATH, wire.metadata_to_pb(restored).SerializeToString())
    data_dir.mkdir(parents=True, exist_ok=True)
    for child in staging.iterdir():
        os.replace(child, data_dir / child.name)
    staging.rmdir()
    return restored


@contextlib.contextmanager
def store_errors(store: ArchiveStore) -> Iterator[None]:
    """Turns the filesystem's own errors while reading the archive into an ArchiveError
    naming the URL (an unreachable object store, a missing bucket)."""
    try:
        yield
    except ArchiveError:
        raise
    except Exception as e:  # any filesystem's failure to read, said plainly
        raise ArchiveError(
            f"cannot read the archive at {store.url}: {type(e).__name__}: {e}"
        ) from e


def _rebuild_shard(
    store: ArchiveStore,
    key: ShardKey,
    plan: RestorePlan,
    kv_path: Path,
    progress: Callable[[str], None],
) -> LogPosition:
    name = f"{key[0]}/{key[1]}"
    kv = RocksKv(kv_path)
    try:
        with store.open(key, plan.snapshot.name) as f:
            position = install_snapshot(kv, read_framed_chunks(f, plan.snapshot.name))
        if position != plan.snapshot.position:
            raise ArchiveError(
                f"archived snapshot {plan.snapshot.name} of shard {name} holds {position}, "
                f"not {plan.snapshot.position} as its manifest says"
            )
        progress(
            f"shard {name}: snapshot at offset {position.offset} loaded "
            f"({plan.snapshot.size / (1 << 20):.1f} MiB)"
        )
        machine = ShardStateMachine(kv)
        for segment in plan.segments:
            entries, times = decode_segment(store.get(key, segment.name), segment.name)
            wanted = [
                entry
                for entry, time_ms in zip(entries, times)
                if position.offset < entry.offset <= plan.target_offset
                and (plan.time_ms is None or time_ms <= plan.time_ms)
            ]
            position = check_chain(position, wanted, segment.name)
            for start in range(0, len(wanted), _APPLY_BATCH):
                machine.apply(wanted[start : start + _APPLY_BATCH])
            progress(f"shard {name}: applied entries up to {position.offset}")
            if position.offset < segment.last.offset:
                break  # the point lies inside this segment
        kv.flush()
        return position
    finally:
        kv.close()
