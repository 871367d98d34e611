"""quorumstore.client.batcher: when batches close, and how many are in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from quorumstore.client.batcher import Batcher, BatchLimits


class Sends:
    """A fake send: records (ops, lane) and completes when the test says so."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[int], int]] = []
        self.gates: list[asyncio.Event] = []

    async def __call__(self, ops: list[int], lane: int) -> None:
        gate = asyncio.Event()
        self.sent.append((ops, lane))
        self.gates.append(gate)
        await gate.wait()

    def finish(self, index: int) -> None:
        self.gates[index].set()


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


async def settle(seconds: float = 0.0) -> None:
    """Lets timers and done-callbacks run."""
    await asyncio.sleep(seconds)
    for _ in range(3):
        await asyncio.sleep(0)


def limits(
    linger_ms: float = 1.0, max_ops: int = 100, max_bytes: int = 10_000, inflight: int = 4
) -> BatchLimits:
    return BatchLimits(linger_ms / 1000, max_ops, max_bytes, inflight)


def test_operations_of_one_moment_share_a_batch_sent_after_the_linger() -> None:
    async def test() -> None:
        sends = Sends()
        batcher = Batcher(sends, limits(linger_ms=20))
        for op in range(10):
            batcher.add(op, 1)
        await settle()
        assert sends.sent == []  # still lingering
        await settle(0.05)
        assert sends.sent == [(list(range(10)), 0)]
        sends.finish(0)
        await batcher.drain()

    run(test)


def test_a_linger_of_zero_waits_only_for_the_ready_tasks() -> None:
    async def test() -> None:
        sends = Sends()
        batcher = Batcher(sends, limits(linger_ms=0))

        async def caller(op: int) -> None:
            batcher.add(op, 1)

        await asyncio.gather(*(caller(op) for op in range(5)))
        await settle()
        assert sends.sent == [([0, 1, 2, 3, 4], 0)]
        sends.finish(0)
        await batcher.drain()

    run(test)


def test_a_full_batch_goes_at_once_and_full_batches_use_every_free_lane() -> None:
    async def test() -> None:
        sends = Sends()
        batcher = Batcher(sends, limits(linger_ms=1000, max_ops=3, inflight=2))
        for op in range(9):
            batcher.add(op, 1)
        await settle()
        assert sends.sent == [([0, 1, 2], 0), ([3, 4, 5], 1)]
        sends.finish(1)
        await settle()
        assert sends.sent[2] == ([6, 7, 8], 1)  # the freed lane is reused
        sends.finish(0)
        sends.finish(2)
        await batcher.drain()

    run(test)


def test_max_bytes_closes_a_batch_too() -> None:
    async def test() -> None:
        sends = Sends()
        batcher = Batcher(sends, limits(linger_ms=1000, max_bytes=100))
        batcher.add(1, 60)
        batcher.add(2, 60)
        await settle()
        assert sends.sent == [([1, 2], 0)]
        sends.finish(0)
        await batcher.drain()

    run(test)


def test_only_one_partial_batch_is_in_flight_later_operations_gather_behind_it() -> None:
    async def test() -> None:
        sends = Sends()
        batcher = Batcher(sends, limits(linger_ms=1, inflight=4))
        batcher.add(0, 1)
        await settle(0.02)
        assert sends.sent == [([0], 0)]
        for op in range(1, 6):
            batcher.add(op, 1)
        await settle(0.02)
        assert len(sends.sent) == 1  # lingered, but a partial batch is in flight
        sends.finish(0)
        await settle()
        assert sends.sent[1][0] == [1, 2, 3, 4, 5]
        sends.finish(1)
        await batcher.drain()

    run(test)


def test_the_linger_restarts_while_operations_keep_arriving_up_to_four_times_it() -> None:
    async def test() -> None:
        sent: list[tuple[float, list[int]]] = []
        loop = asyncio.get_running_loop()

        async def send(ops: list[int], lane: int) -> None:
            sent.append((loop.time(), ops))

        batcher = Batcher(send, limits(linger_ms=100))
        start = loop.time()
        for op in range(40):  # one every 20 ms, each within the linger of the last
            batcher.add(op, 1)
            await asyncio.sleep(0.02)
        await batcher.drain()
        first_at, first_ops = sent[0]
        assert first_at - start >= 0.38, first_at - start  # capped at 4 x 100 ms
        assert len(first_ops) > 5

    run(test)


def test_a_lane_carries_one_batch_at_a_time() -> None:
    async def test() -> None:
        in_flight: dict[int, int] = {}
        overlaps: list[int] = []

        async def send(ops: list[int], lane: int) -> None:
            if in_flight.get(lane):
                overlaps.append(lane)
            in_flight[lane] = 1
            await asyncio.sleep(0.001 * (len(ops) % 3))
            in_flight[lane] = 0

        batcher = Batcher(send, limits(linger_ms=0, max_ops=2, inflight=3))
        for op in range(200):
            batcher.add(op, 1)
            if op % 7 == 0:
                await asyncio.sleep(0)
        await batcher.drain()
        assert overlaps == []

    run(test)


def test_jobs_wait_for_a_lane_like_full_batches() -> None:
    async def test() -> None:
        lanes: list[int] = []
        release = asyncio.Event()

        async def job(lane: int) -> None:
            lanes.append(lane)
            await release.wait()

        batcher: Batcher[int] = Batcher(Sends(), limits(inflight=2))
        for _ in range(3):
            batcher.add_job(job)
        await settle()
        assert sorted(lanes) == [0, 1]
        release.set()
        await batcher.drain()
        assert len(lanes) == 3

    run(test)


def test_drain_sends_a_lingering_batch_at_once_and_waits_for_everything() -> None:
    async def test() -> None:
        done: list[list[int]] = []

        async def send(ops: list[int], lane: int) -> None:
            await asyncio.sleep(0.01)
            done.append(ops)

        batcher = Batcher(send, limits(linger_ms=10_000))
        batcher.add(1, 1)
        batcher.add(2, 1)
        await asyncio.wait_for(batcher.drain(), 1)
        assert done == [[1, 2]]

    run(test)


def test_a_send_that_raises_is_logged_and_frees_its_lane(caplog: pytest.LogCaptureFixture) -> None:
    async def test() -> None:
        calls: list[int] = []

        async def send(ops: list[int], lane: int) -> None:
            calls.append(lane)
            raise RuntimeError("boom")

        batcher = Batcher(send, limits(linger_ms=0, max_ops=1, inflight=1))
        batcher.add(1, 1)
        batcher.add(2, 1)
        await batcher.drain()
        assert calls == [0, 0]

    run(test)
    assert "a batch failed outside its own error handling" in caplog.text
