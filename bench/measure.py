"""Store-agnostic write measurements shared by the etcd and quorumstore benchmarks.

Every function takes the store only as callables, so both sides of the comparison
run exactly the same loop, key scheme, value size and timing code:

* ``put(key, value)`` -- an async function that returns once the store acknowledged
  the write (durably, as the store defines it) and raises on failure.
* ``kill_leader()`` -- a blocking function that kill -9s the current leader and
  returns once it is dead; it runs in a worker thread so that writes keep flowing
  while it works.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
from collections.abc import Awaitable, Callable

Put = Callable[[bytes, bytes], Awaitable[object]]

VALUE_BYTES = 100


def _value() -> bytes:
    """A 100-byte incompressible value: neither store may win by compressing it."""
    return os.urandom(VALUE_BYTES)


async def measure_latency(
    put: Put, n: int = 2000, *, warmup: int = 50, prefix: bytes = b"bench/lat/"
) -> tuple[float, float]:
    """(p50, p99) latency in ms of `n` sequential puts from one client, distinct keys.

    One request at a time isolates the per-write cost (round trip, replication,
    fsync) from any batching a store can do under concurrency. The `warmup` puts
    before the timed ones open connections and fill caches and are not counted.
    """
    if n < 100:
        raise ValueError(f"n={n}: a p99 needs at least 100 samples")
    value = _value()
    for i in range(warmup):
        await put(b"%swarm/%08d" % (prefix, i), value)
    samples_ms: list[float] = []
    for i in range(n):
        key = b"%s%08d" % (prefix, i)
        start = time.perf_counter()
        await put(key, value)
        samples_ms.append((time.perf_counter() - start) * 1000.0)
    cuts = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return cuts[49], cuts[98]


async def measure_throughput(
    put: Put,
    inflight: int = 64,
    seconds: float = 10.0,
    *,
    warmup_s: float = 1.0,
    prefix: bytes = b"bench/tput/",
) -> float:
    """Acknowledged puts per second with `inflight` requests outstanding at all times.

    `inflight` workers share the caller's single client (so one channel), each
    issuing its next put as soon as the previous one is acknowledged, every put to a
    fresh key. Only puts that complete inside the timed window after `warmup_s`
    count; any failed put fails the measurement, since a throughput that includes
    errors is not comparable.
    """
    if inflight < 1 or seconds <= 0:
        raise ValueError(f"inflight={inflight}, seconds={seconds}: both must be positive")
    value = _value()
    counter = itertools.count()
    loop = asyncio.get_running_loop()
    window_start = loop.time() + warmup_s
    window_end = window_start + seconds
    completed = 0

    async def worker() -> None:
        nonlocal completed
        while loop.time() < window_end:
            await put(b"%s%010d" % (prefix, next(counter)), value)
            now = loop.time()
            if window_start <= now <= window_end:
                completed += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(inflight):
            group.create_task(worker())
    return completed / seconds


async def measure_failover(
    put: Put,
    kill_leader: Callable[[], object],
    *,
    warmup_s: float = 1.0,
    interval_s: float = 0.01,
    attempt_timeout_s: float = 2.0,
    give_up_s: float = 60.0,
    prefix: bytes = b"bench/failover/",
) -> float:
    """Seconds from the leader's kill -9 until the first write issued after it succeeds.

    After `warmup_s` of sequential writes (all of which must succeed, so the store
    is known healthy), writes to fresh keys start at a steady pace, one every
    `interval_s`, each on its own with `attempt_timeout_s`, and keep going through
    the kill. Pacing them rather than retrying one write at a time keeps the
    resolution at `interval_s`: a write parked on a leaderless member may stay
    parked until its timeout even after a new leader is up, and a sequential
    retrier would add that wait to the result. The clock starts when `kill_leader`
    returns, i.e. once the leader is dead; a write issued before then does not
    count even if it completes later, because the old leader may have committed
    it. Failed writes are simply superseded by the next paced one; the put callable
    itself is expected to move to another endpoint when its current one is gone.
    """
    if interval_s <= 0 or attempt_timeout_s <= 0:
        raise ValueError("interval_s and attempt_timeout_s must be positive")
    value = _value()
    counter = itertools.count()
    loop = asyncio.get_running_loop()

    async def attempt() -> bool:
        try:
            await asyncio.wait_for(
                put(b"%s%010d" % (prefix, next(counter)), value), attempt_timeout_s
            )
        except Exception:  # noqa: BLE001 - any failure, the attempt's timeout included
            return False
        return True

    warm_end = loop.time() + warmup_s
    while loop.time() < warm_end:
        if not await attempt():
            raise RuntimeError("a put failed before the leader was killed: store not healthy")

    killed_at: float | None = None
    recovered: asyncio.Future[float] = loop.create_future()

    async def paced_write() -> None:
        started = loop.time()
        ok = await attempt()
        if ok and killed_at is not None and started >= killed_at and not recovered.done():
            recovered.set_result(loop.time() - killed_at)

    async def pace() -> None:
        while True:
            writes.add(loop.create_task(paced_write()))
            await asyncio.sleep(interval_s)
            writes.difference_update({w for w in writes if w.done()})

    writes: set[asyncio.Task[None]] = set()
    pacer = loop.create_task(pace())
    try:
        await asyncio.to_thread(kill_leader)
        killed_at = loop.time()
        done, _ = await asyncio.wait([recovered], timeout=give_up_s)
        if not done:
            raise TimeoutError(f"no write succeeded within {give_up_s} s of the kill")
        return recovered.result()
    finally:
        pacer.cancel()
        for write in writes:
            write.cancel()
        await asyncio.gather(pacer, *writes, return_exceptions=True)
