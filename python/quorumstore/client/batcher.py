"""Groups one shard's concurrent operations into batches, several batches in flight.

A batch is one request (for writes: one replicated write, one WAL entry), so the
per-request costs -- a gRPC round trip, a quorum of fsyncs -- are paid once for
every operation in it. A batch closes when it holds `max_ops` operations or
`max_bytes` bytes, or `linger_s` after its first operation; closed batches are sent
while fewer than `max_inflight` are in flight. While every slot is busy the open
batch keeps growing past its linger, so the busier the shard, the larger its batches.

Each in-flight slot is a numbered *lane*: a batch keeps its lane through all its
retries and the lane sends nothing else meanwhile, so per lane batches are strictly
sequential. Exactly-once writes rely on that (see `writes.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, NamedTuple, TypeVar

log = logging.getLogger(__name__)

Op = TypeVar("Op")
#: Sends one closed batch on the given lane; resolves its operations' futures itself.
Job = Callable[[int], Awaitable[None]]


class BatchLimits(NamedTuple):
    linger_s: float
    max_ops: int
    max_bytes: int
    max_inflight: int


class Batcher(Generic[Op]):
    """The batches of one shard and one kind (writes or reads)."""

    def __init__(
        self, send: Callable[[list[Op], int], Awaitable[None]], limits: BatchLimits
    ) -> None:
        self._send = send
        self._limits = limits
        self._loop = asyncio.get_running_loop()
        self._open: list[Op] = []
        self._open_bytes = 0
        self._lingered = False
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._ready: deque[Job] = deque()
        self._free_lanes = list(range(limits.max_inflight - 1, -1, -1))
        self._inflight: set[asyncio.Task[None]] = set()

    def add(self, op: Op, size: int) -> None:
        """Queues one operation; `size` is its approximate encoded size in bytes."""
        self._open.append(op)
        self._open_bytes += size
        if len(self._open) >= self._limits.max_ops or self._open_bytes >= self._limits.max_bytes:
            self._close_open()
        elif self._timer is None and not self._lingered:
            linger = self._limits.linger_s
            self._timer = (
                self._loop.call_later(linger, self._linger_over)
                if linger > 0
                else self._loop.call_soon(self._linger_over)
            )
        self._pump()

    def add_job(self, job: Job) -> None:
        """Queues a batch built elsewhere (bulk paths): it waits for a lane like any other."""
        self._ready.append(job)
        self._pump()

    def _linger_over(self) -> None:
        self._timer = None
        self._lingered = True
        self._pump()

    def _close_open(self) -> None:
        ops = self._open
        self._open, self._open_bytes, self._lingered = [], 0, False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._ready.append(lambda lane: self._send(ops, lane))

    def _pump(self) -> None:
        while self._free_lanes:
            if not self._ready:
                if not (self._open and self._lingered):
                    return
                self._close_open()
            job = self._ready.popleft()
            lane = self._free_lanes.pop()
            task = self._loop.create_task(job(lane))
            self._inflight.add(task)
            task.add_done_callback(lambda t, lane=lane: self._job_done(t, lane))

    def _job_done(self, task: asyncio.Task[None], lane: int) -> None:
        self._inflight.discard(task)
        self._free_lanes.append(lane)
        if not task.cancelled() and task.exception() is not None:
            log.error("a batch failed outside its own error handling", exc_info=task.exception())
        self._pump()

    async def drain(self) -> None:
        """Sends everything queued now and returns once no batch is in flight."""
        if self._open:
            self._close_open()
        self._pump()
        while self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
