"""The etcd benchmark peer's measurement loops, against in-memory fakes, and the checks its
cluster makes before starting any etcd."""

from __future__ import annotations

import asyncio
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
