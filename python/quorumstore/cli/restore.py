"""`quorumstore restore`: a cluster's data directory rebuilt from its archive, at a point
in time, at given offsets, or at the last archived entries; and the same restore that
`standalone` and `cluster` run when they start with an archive and no data."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from quorumstore.archive.manifest import ArchiveError
from quorumstore.archive.restore import archived_metadata, holds_cluster_data, restore_cluster
from quorumstore.archive.store import ArchiveStore
from quorumstore.cli.errors import CliError
from quorumstore.protocol.messages import ShardKey
from quorumstore.wire.metadata import DEFAULT_NAMESPACE

HELP = "rebuild a cluster's data directory from its archive, as it was at a point"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--archive-url", required=True, help="the archive's path or fsspec URL")
    p.add_argument(
        "--data-dir",
        required=True,
        help="where to build the data (a new directory): start `standalone` or `cluster` on it",
    )
    p.add_argument(
        "--at",
        type=restore_point,
        default=(None, {}),
        help="an ISO 8601 time (UTC unless it names a zone), or shard=offset,... naming the "
        "last entry to keep per shard (namespace/shard or shard of the default namespace; "
        "shards not named: their last archived entry); default: the last archived entries",
    )


def restore_point(value: str) -> tuple[int | None, dict[ShardKey, int]]:
    """An argparse type: (time in ms, None) or (None, offsets by shard)."""
    if "=" not in value:
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an ISO 8601 time or shard=offset,..., got {value!r}"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return int(when.timestamp() * 1000), {}
    offsets: dict[ShardKey, int] = {}
    for item in value.split(","):
        shard, _, offset = item.partition("=")
        namespace, _, index = shard.strip().rpartition("/")
        if not index.isdigit() or not offset.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(
                f"expected shard=offset (e.g. default/0=1200 or 0=1200), got {item!r}"
            )
        offsets[(namespace or DEFAULT_NAMESPACE, int(index))] = int(offset)
    return None, offsets


def run(args: argparse.Namespace) -> None:
    time_ms, offsets = args.at
    data_dir = Path(args.data_dir).resolve()
    try:
        metadata = restore_cluster(
            _store(args.archive_url), data_dir, time_ms=time_ms, offsets=offsets, progress=_say
        )
    except ArchiveError as e:
        raise CliError(str(e)) from None
    nodes = {node for shard in metadata.shards.values() for node in shard.ensemble}
    command = "standalone" if len(nodes) == 1 else f"cluster --nodes {len(nodes)}"
    _say(
        f"restored {len(metadata.shards)} shards into {data_dir}; start it with "
        f"`quorumstore {command} --data-dir {data_dir}`"
        + ("" if time_ms is None and not offsets else " and archive to another URL")
    )


def restore_on_start(archive_url: str | None, data_dir: Path) -> None:
    """Restores `data_dir` from the archive at its last entries if it holds no cluster
    data and the archive holds a cluster; a new cluster's empty archive restores nothing."""
    if archive_url is None or holds_cluster_data(data_dir):
        return
    store = _store(archive_url)
    try:
        if archived_metadata(store) is None:
            return
        _say(f"no data in {data_dir}: restoring it from the archive at {archive_url}")
        restore_cluster(store, data_dir, progress=_say)
    except ArchiveError as e:
        raise CliError(str(e)) from None


def _store(url: str) -> ArchiveStore:
    try:
        return ArchiveStore(url)
    except ArchiveError as e:
        raise CliError(str(e)) from None


def _say(line: str) -> None:
    print(f"restore: {line}", flush=True)
