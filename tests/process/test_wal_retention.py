"""WAL retention on real nodes: applied entries leave the WAL, and nothing is lost for it.

Tiny segments, a short keep window and a fast trim interval make every replica trim
many times in a few seconds. Then a follower that was down for longer than the kept
window comes back (it can only catch up by snapshot), and the leader is killed and
restarted from a trimmed log; every acknowledged write must still read back.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import pyarrow as pa
import pytest

from cluster_harness import LocalCluster, WriteLoad, poll_until
from quorumstore import Client
from quorumstore.client.data_service import DataClient

MakeCluster = Callable[..., LocalCluster]
MakeLoad = Callable[..., WriteLoad]
Measure = Callable[[str], None]

pytestmark = [pytest.mark.process, pytest.mark.slow]

KEEP_ENTRIES = 20
RETENTION_FLAGS = [
    "--wal-segment-bytes", "4096",
    "--wal-keep-entries", str(KEEP_ENTRIES),
    "--wal-trim-interval", "0.2",
]  # fmt: skip
_SEGMENT = re.compile(r"^(\d{20})\.wal$")


def wal_segments(cluster: LocalCluster, node: str) -> list[int]:
    """First offsets of a node's WAL segments of shard 0 (from the file names)."""
    wal_dir = cluster.node_dir(node) / "shards" / "default" / "0" / "wal"
    found = (_SEGMENT.match(p.name) for p in wal_dir.iterdir()) if wal_dir.is_dir() else ()
    return sorted(int(m.group(1)) for m in found if m)


def wait_trimmed_past(cluster: LocalCluster, leader: str, follower: str) -> None:
    """Waits until the leader's WAL starts past everything the stopped follower holds."""
    poll_until(
        lambda: (
            wal_segments(cluster, leader)[0] > max(wal_segments(cluster, follower), default=0)
            or None
        ),
        30,
        "the leader to trim past everything the stopped follower holds",
    )


@pytest.mark.timeout(240)
def test_wal_is_trimmed_and_replicas_still_recover(
    make_cluster: MakeCluster, write_load: MakeLoad, measure: Measure
) -> None:
    cluster = make_cluster(shards=1, node_args=RETENTION_FLAGS)
    load = write_load(cluster, clients=4, rate=40.0)
    load.wait_for_write_after(time.monotonic(), 0, 30, count=300)

    def all_trimmed() -> dict[str, list[int]] | None:
        segments = {node: wal_segments(cluster, node) for node in cluster.nodes}
        return segments if all(s and s[0] > 0 for s in segments.values()) else None

    trimmed = poll_until(all_trimmed, 30, "every replica to trim its WAL")
    head = cluster.node_status(cluster.shard_metadata(0).leader, 0).head.offset
    segments = ", ".join(f"first segment at {s[0]}, {len(s)} segments" for s in trimmed.values())
    measure(
        f"WAL retention: after {head} entries every replica's WAL starts past offset 0 ({segments})"
    )

    # A follower down for far longer than the kept window rejoins (by snapshot).
    meta = cluster.shard_metadata(0)
    follower = next(n for n in meta.ensemble if n != meta.leader)
    killed_at = cluster.kill9(follower)
    load.wait_for_write_after(killed_at, 0, 30, count=10 * KEEP_ENTRIES)
    wait_trimmed_past(cluster, meta.leader, follower)
    cluster.restart(follower)
    cluster.wait_following(follower, 0)
    cluster.wait_caught_up(follower, 0)

    # The leader restarts from a trimmed log.
    leader = cluster.shard_metadata(0).leader
    killed_at = cluster.kill9(leader)
    load.wait_for_write_after(killed_at, 0, 30, count=50)
    cluster.restart(leader)
    cluster.wait_following(leader, 0)
    cluster.wait_caught_up(leader, 0)
    load.stop()
    measure(
        "  a follower behind the kept window and a restarted leader caught up; " + load.verify()
    )


def _staging_streams(cluster: LocalCluster, node: str) -> set[int]:
    """Sequence numbers of the snapshot streams a node is staging for shard 0 right now."""
    shard_dir = cluster.node_dir(node) / "shards" / "default" / "0"
    return {int(p.name.rpartition("-")[2]) for p in shard_dir.glob("snapshot-staging-*")}


@pytest.mark.timeout(240)
def test_a_follower_behind_the_window_gets_a_large_snapshot_as_one_stream(
    make_cluster: MakeCluster, measure: Measure
) -> None:
    """The leader's engine asks for the snapshot again about every second until the follower
    acks it. Each request used to start a stream of its own, which sent the whole KV again
    (6 overlapping streams for 124 MB in a probe), so a large shard caught up ever slower."""
    cluster = make_cluster(
        shards=1, fsync=False, node_args=[*RETENTION_FLAGS, "--log-level", "INFO"]
    )
    meta = cluster.shard_metadata(0)
    follower = next(n for n in meta.ensemble if n != meta.leader)
    value = b"v" * 100
    with Client(meta.leader) as client:
        for start in range(0, 600_000, 100_000):
            client.put_many({f"/big/{i:09d}": value for i in range(start, start + 100_000)})
        cluster.kill9(follower)
        for i in range(10 * KEEP_ENTRIES):
            client.put(f"/after/{i}", b"x")
    wait_trimmed_past(cluster, meta.leader, follower)
    cluster.restart(follower)
    streams: set[int] = set()

    def installed() -> bool | None:
        streams.update(_staging_streams(cluster, follower))
        return "received a snapshot" in cluster.log_text(follower) or None

    poll_until(installed, 120, "the follower to install a snapshot", interval_s=0.05)
    cluster.wait_caught_up(follower, 0)
    assert streams == {1}, f"snapshot streams staged on the follower: {sorted(streams)}"
    # The leader logs the stream's end just after the follower installed it.
    (sent,) = poll_until(
        lambda: (
            re.findall(
                r"snapshot of shard default/0 to \S+ at offset \d+: sent, .*",
                cluster.log_text(meta.leader),
            )
            or None
        ),
        10,
        "the leader to log the snapshot stream's end",
    )
    measure(f"one snapshot stream to the follower: {sent}")


def _wal_bytes(cluster: LocalCluster, node: str) -> int:
    wal_dir = cluster.node_dir(node) / "shards" / "default" / "0" / "wal"
    return sum(p.stat().st_size for p in wal_dir.glob("*.wal"))


@pytest.mark.timeout(240)
def test_bulk_writes_keep_no_more_wal_than_the_byte_bound(
    make_cluster: MakeCluster, measure: Measure
) -> None:
    """Retention counted entries only, so a bulk write's large entries all stayed in the WAL
    (513 MB of WAL beside 357 MB of KV after five 100 MB writes, in a probe)."""
    keep_bytes = 8 << 20
    cluster = make_cluster(
        shards=1,
        fsync=False,
        node_args=[
            "--wal-keep-bytes", str(keep_bytes),
            "--wal-segment-bytes", str(1 << 20),
            "--wal-trim-interval", "0.2",
        ],
    )  # fmt: skip
    value = os.urandom(1000)
    with DataClient(cluster.nodes[0]) as data:
        for w in range(5):  # five entries of about 10 MB each
            keys = pa.array([f"/bulk/{w}/{i:06d}" for i in range(10_000)])
            data.write(0, pa.table({"key": keys, "value": pa.array([value] * 10_000, pa.binary())}))

    def bounded() -> dict[str, int] | None:
        sizes = {node: _wal_bytes(cluster, node) for node in cluster.nodes}
        # What is kept, plus the active segment: here the last entry, about 10 MB.
        return sizes if all(size < keep_bytes + (12 << 20) for size in sizes.values()) else None

    sizes = poll_until(bounded, 30, "every replica to trim its WAL to the byte bound")
    with Client(cluster.nodes[0]) as client:
        assert client.get("/bulk/0/000000").value == value
    measure(
        "WAL after 5 bulk entries of ~10 MB with --wal-keep-bytes 8 MiB: "
        + ", ".join(f"{size / (1 << 20):.1f} MiB" for size in sizes.values())
    )
