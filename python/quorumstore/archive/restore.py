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

import base64
import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import fsspec

from quorumstore.archive.manifest import ArchiveError, Manifest, RestorePlan, plan_restore
from quorumstore.archive.objects import check_chain, decode_segment, read_framed_chunks
from quorumstore.archive.store import ArchiveStore
from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import (
    ClusterMetadata,
    ShardMetadata,
    ShardState,
    placed_nodes,
)
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
#: The file naming the `LatestRestore` that built a node's directory.
RESTORE_MARKER = "restored-by"
#: Beside the coordinator's metadata, the restore under way (`save_pending`).
_PENDING_SUFFIX = ".restore-plan"
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
    if holds_cluster_data(data_dir):
        raise ArchiveError(
            f"{data_dir} already holds cluster data; restore into a new directory (a restore "
            "never mixes with data it did not write)"
        )
    metadata, plans = plan_point(store, time_ms, dict(offsets or {}))
    staging = data_dir.with_name(data_dir.name + ".restoring")
    shutil.rmtree(staging, ignore_errors=True)
    dirs = node_dirs(metadata)
    shards = {}
    with store_errors(store):
        for key, plan in plans.items():
            shard = metadata.shards[key]
            replicas = [replica_dir(staging / dirs[member], key) for member in shard.ensemble]
            position = install_replicas(store, key, plan, replicas, shard.term, progress)
            shards[key] = restored_shard(shard, position)
    restored = ClusterMetadata(metadata.version + 1, shards)
    replace_durably(staging / METADATA_PATH, wire.metadata_to_pb(restored).SerializeToString())
    data_dir.mkdir(parents=True, exist_ok=True)
    for child in staging.iterdir():
        os.replace(child, data_dir / child.name)
    staging.rmdir()
    return restored


@dataclass(frozen=True)
class LatestRestore:
    """A restore of a whole cluster at its last archived entries, planned in one place
    and carried out on every node's own host (a Spark-hosted cluster's nodes run on
    executors the driver cannot write to).

    The plan pins each shard's snapshot, segments and last offset, so every replica of
    a shard is rebuilt at the same position wherever it is rebuilt; `metadata` is the
    restored cluster's (the same new epoch `restore_cluster` writes)."""

    archive_url: str
    #: Names this restore in the directories it builds, so that a node that restarts
    #: after its restore does not restore again over newer writes.
    restore_id: str
    metadata: ClusterMetadata
    plans: Mapping[ShardKey, RestorePlan]

    @staticmethod
    def plan(store: ArchiveStore) -> LatestRestore:
        """The restore of the archive at `store` at its last archived entries."""
        metadata, manifests, plans = _point(store, None, {})
        shards = {key: restored_shard(metadata.shards[key], manifests[key].head) for key in plans}
        return LatestRestore(
            store.url, uuid.uuid4().hex, ClusterMetadata(metadata.version + 1, shards), plans
        )

    def rebuild_member(
        self, member: str, node_dir: Path, progress: Callable[[str], None] = lambda line: None
    ) -> None:
        """Builds `node_dir` (which must not exist) as `member`'s data after the restore:
        a replica of every shard whose ensemble holds it. Built beside it and moved into
        place at the end, as `restore_cluster` does."""
        store = ArchiveStore(self.archive_url)
        staging = node_dir.with_name(node_dir.name + ".restoring")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with store_errors(store):
            for key, plan in self.plans.items():
                shard = self.metadata.shards[key]
                if member not in shard.ensemble:
                    continue
                replica = replica_dir(staging, key)
                position = install_replicas(store, key, plan, [replica], shard.term, progress)
                if position.offset != shard.known_commit_offset:
                    raise ArchiveError(
                        f"shard {key[0]}/{key[1]} was rebuilt at offset {position.offset}, not "
                        f"at {shard.known_commit_offset} as planned"
                    )
        replace_durably(staging / RESTORE_MARKER, self.restore_id.encode())
        os.replace(staging, node_dir)

    def rebuilt(self, node_dir: Path) -> bool:
        """Whether `node_dir` is this restore's work (its node restarted since)."""
        try:
            return (node_dir / RESTORE_MARKER).read_text() == self.restore_id
        except OSError:
            return False

    def rebuild_running_member(
        self, member: str, data_dir: Path, progress: Callable[[str], None] = lambda line: None
    ) -> None:
        """`rebuild_member` for a node that already runs on `data_dir` holding no replica:
        the replicas are built beside its shards, then moved in. Carries on a rebuild a
        crash interrupted; does nothing if this restore built `data_dir` already."""
        if self.rebuilt(data_dir):
            return
        built = data_dir / f".restore-{self.restore_id}"
        shards = data_dir / "shards"
        if not (built / RESTORE_MARKER).exists():
            if shards.exists() and any(shards.iterdir()):
                raise ArchiveError(
                    f"{data_dir} holds replicas already; a restore never mixes with data it "
                    "did not write"
                )
            self.rebuild_member(member, built, progress)
        if (built / "shards").exists():
            if shards.exists():
                shards.rmdir()  # empty, checked above
            os.replace(built / "shards", shards)
        os.replace(built / RESTORE_MARKER, data_dir / RESTORE_MARKER)
        built.rmdir()

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "archive_url": self.archive_url,
                "restore_id": self.restore_id,
                "metadata": base64.b64encode(
                    wire.metadata_to_pb(self.metadata).SerializeToString()
                ).decode(),
                "plans": [
                    {"shard": [key[0], key[1]], "plan": plan.to_json()}
                    for key, plan in sorted(self.plans.items())
                ],
            }
        ).encode()

    @staticmethod
    def from_json(data: bytes, where: str) -> LatestRestore:
        """The restore `to_json` wrote; ArchiveError naming `where` if it is not one."""
        try:
            raw: Any = json.loads(data)
            metadata = wire.metadata_from_pb(
                pb.CoordinatorMetadata.FromString(base64.b64decode(raw["metadata"], validate=True))
            )
            plans = {
                (str(p["shard"][0]), int(p["shard"][1])): RestorePlan.from_json(p["plan"])
                for p in raw["plans"]
            }
            restore = LatestRestore(
                str(raw["archive_url"]), str(raw["restore_id"]), metadata, plans
            )
        except Exception as e:  # any way the bytes fail to be a plan, said once
            raise ArchiveError(f"{where} holds no restore plan: {type(e).__name__}: {e}") from e
        if set(plans) != set(metadata.shards) or not restore.restore_id.isalnum():
            raise ArchiveError(f"{where} holds no restore plan: its shards or id do not match")
        return restore


def load_pending(metadata_url: str) -> LatestRestore | None:
    """The restore planned beside the coordinator metadata at `metadata_url` and not yet
    done (a start that stopped halfway carries it on); None if there is none."""
    fs, path = fsspec.core.url_to_fs(metadata_url + _PENDING_SUFFIX)
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        return None
    return LatestRestore.from_json(data, metadata_url + _PENDING_SUFFIX)


def save_pending(metadata_url: str, restore: LatestRestore) -> None:
    """Keeps `restore` beside the metadata until `forget_pending`."""
    fs, path = fsspec.core.url_to_fs(metadata_url + _PENDING_SUFFIX)
    fs.makedirs(path.rpartition("/")[0], exist_ok=True)
    fs.pipe_file(path, restore.to_json())


def forget_pending(metadata_url: str) -> None:
    """Drops the plan once the restored cluster's metadata is saved and its nodes rebuilt."""
    fs, path = fsspec.core.url_to_fs(metadata_url + _PENDING_SUFFIX)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path)


def restored_shard(shard: ShardMetadata, position: LogPosition) -> ShardMetadata:
    """`shard` as a restore at `position` leaves it: a new epoch (docs/protocol.md) whose
    every member holds `position` and is counted, with no incarnation recorded yet."""
    return replace(
        shard,
        term=max(position.term, shard.term),
        leader=None,
        state=ShardState.ELECTION,
        eligible=frozenset(shard.ensemble),
        known_commit_offset=position.offset,
        incarnations={},
    )


def install_replicas(
    store: ArchiveStore,
    key: ShardKey,
    plan: RestorePlan,
    replicas: Sequence[Path],
    term: int,
    progress: Callable[[str], None],
) -> LogPosition:
    """Rebuilds shard `key` once by `plan` and makes each of `replicas` (replica
    directories, not existing yet) a copy of it at the rebuilt position, in a term of
    at least `term`, under a new incarnation; returns the position."""
    work = replicas[0].parent / f".{replicas[0].name}.rebuilding"
    shutil.rmtree(work, ignore_errors=True)
    try:
        position = rebuild_shard(store, key, plan, work, progress)
        for directory in replicas:
            shutil.copytree(work, directory / "kv")
            with Wal.open(directory / "wal") as wal:
                wal.reset(position)
            save_term(directory, max(position.term, term))
            new_incarnation(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"shard {key[0]}/{key[1]}: restored at offset {position.offset}")
    return position


def plan_point(
    store: ArchiveStore, time_ms: int | None, offsets: Mapping[ShardKey, int]
) -> tuple[ClusterMetadata, dict[ShardKey, RestorePlan]]:
    """The archived metadata and each shard's plan at the point."""
    metadata, _, plans = _point(store, time_ms, offsets)
    return metadata, plans


def _point(
    store: ArchiveStore, time_ms: int | None, offsets: Mapping[ShardKey, int]
) -> tuple[ClusterMetadata, dict[ShardKey, Manifest], dict[ShardKey, RestorePlan]]:
    """`plan_point`, with the manifests each shard's plan was made from (read once)."""
    metadata = archived_metadata(store)
    if metadata is None:
        raise ArchiveError(f"nothing is archived at {store.url} (no cluster metadata there)")
    unknown = sorted(set(offsets) - set(metadata.shards))
    if unknown:
        raise ArchiveError(
            f"the archive at {store.url} holds no shard {', '.join(f'{n}/{i}' for n, i in unknown)}; "
            f"its shards are {', '.join(f'{n}/{i}' for n, i in sorted(metadata.shards))}"
        )
    with store_errors(store):
        manifests = {key: _manifest(store, key) for key in sorted(metadata.shards)}
        plans = {
            key: plan_restore(manifest, offsets.get(key), time_ms)
            for key, manifest in manifests.items()
        }
    return metadata, manifests, plans


def _manifest(store: ArchiveStore, key: ShardKey) -> Manifest:
    manifest = store.load_manifest(key)
    if manifest is None:
        raise ArchiveError(f"shard {key[0]}/{key[1]} has nothing in the archive at {store.url}")
    return manifest


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


def rebuild_shard(
    store: ArchiveStore,
    key: ShardKey,
    plan: RestorePlan,
    kv_path: Path,
    progress: Callable[[str], None],
) -> LogPosition:
    """Builds shard `key`'s KV at `kv_path` as `plan` says (its snapshot, then the entries
    after it, each checked to chain from the one before) and returns its log position;
    the KV is closed on return. Restores and `delta_export.py` share it."""
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
