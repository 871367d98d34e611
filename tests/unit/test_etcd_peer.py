"""The etcd benchmark peer: cluster lifecycle, the gRPC client, and the measurement loops.

The measurement loops are checked against in-memory fakes (fast); the cluster and
client against a real 3-member etcd on loopback (slow, and skipped where the
Debian ``etcd-server`` package is not installed).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import etcd_peer
import measure
import pytest


class FakeStore:
    """An in-memory store whose puts take `delay_s` and fail while it is `down`."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.data: dict[bytes, bytes] = {}
        self.delay_s = delay_s
        self.down = False

    async def put(self, key: bytes, value: bytes) -> None:
        await asyncio.sleep(self.delay_s)
        if self.down:
            raise ConnectionError("leader is gone")
        self.data[key] = value


def test_latency_times_sequential_puts_of_100_bytes() -> None:
    store = FakeStore(delay_s=0.001)
    p50, p99 = asyncio.run(measure.measure_latency(store.put, n=100, warmup=5))
    assert 1.0 <= p50 <= p99 < 500.0  # generous: CI machines are shared
    assert len(store.data) == 105  # every put a distinct key
    assert {len(v) for v in store.data.values()} == {measure.VALUE_BYTES}


def test_throughput_keeps_the_requested_puts_in_flight() -> None:
    in_flight = peak = 0

    async def put(key: bytes, value: bytes) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1

    rate = asyncio.run(measure.measure_throughput(put, inflight=8, seconds=0.5, warmup_s=0.1))
    assert peak == 8
    assert 100 <= rate <= 800  # 8 in flight x 10 ms each = 800/s at most


def test_failover_counts_from_the_kill_to_the_first_later_success() -> None:
    store = FakeStore(delay_s=0.001)

    async def scenario() -> float:
        loop = asyncio.get_running_loop()

        def kill_leader() -> None:
            store.down = True
            loop.call_soon_threadsafe(loop.call_later, 0.3, setattr, store, "down", False)

        return await measure.measure_failover(store.put, kill_leader, warmup_s=0.1)

    assert 0.25 <= asyncio.run(scenario()) < 1.0


def test_failover_refuses_an_unhealthy_store() -> None:
    store = FakeStore()
    store.down = True
    with pytest.raises(RuntimeError, match="before the leader was killed"):
        asyncio.run(measure.measure_failover(store.put, lambda: None, warmup_s=0.1))


def test_cluster_refuses_to_run_without_fsync(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        etcd_peer.EtcdCluster(tmp_path, fsync=False)


def _processes_under(directory: Path) -> list[int]:
    """Pids of processes whose command line mentions `directory` (this test's own etcds)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(directory).encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("etcd") is None and not os.environ.get("CI"),
    reason="etcd not installed (apt-get install etcd-server; scripts/test.sh does when root, "
    "and CI runs this test always)",
)
def test_etcd_cluster_put_get_failover_restart_and_clean_stop(tmp_path: Path) -> None:
    async def write_until_accepted(client: etcd_peer.EtcdClient, key: bytes, value: bytes) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                await client.put(key, value)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def scenario(cluster: etcd_peer.EtcdCluster) -> None:
        endpoints = cluster.client_endpoints()
        async with etcd_peer.EtcdClient(endpoints, timeout_s=2.0) as client:
            revision = await client.put(b"greeting", b"hello")
            assert revision > 0
            assert await client.get(b"greeting") == b"hello"
            assert await client.get(b"missing") is None

            cluster.start_rss_sampling()
            killed = cluster.kill_leader()
            assert killed not in cluster.pids()
            await write_until_accepted(client, b"after-kill", b"still writable")
            assert await client.get(b"after-kill") == b"still writable"
            assert cluster.leader_index() != killed
            rss = cluster.stop_rss_sampling()
            assert set(rss) == {0, 1, 2} and all(10 < mb < 2048 for mb in rss.values())

            cluster.restart(killed)
        # The restarted member caught up on what was written while it was down.
        async with etcd_peer.EtcdClient([endpoints[killed]], timeout_s=5.0) as client:
            assert await client.get(b"after-kill") == b"still writable"

    with etcd_peer.EtcdCluster(tmp_path, members=3) as cluster:
        cluster.wait_ready()
        for pid in cluster.pids().values():
            assert b"--unsafe-no-fsync" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        asyncio.run(scenario(cluster))
        assert all(count > 0 for count in cluster.wal_fsync_counts().values())
        pids = list(cluster.pids().values())
    assert len(pids) == 3
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"etcd pid {pid} survived the cluster"
    assert _processes_under(tmp_path) == []
