"""Groups one shard's concurrent operations into batches, several batches in flight.

A batch is one request (for writes: one replicated write, one WAL entry), so the
per-request costs -- a gRPC round trip, a quorum of fsyncs, the server's work per
entry -- are paid once for every operation in it. When a batch goes out:

- a *full* batch (`max_ops` operations or `max_bytes` bytes) as soon as one of the
  `max_inflight` slots is free: bulk load is pipelined;
- a *partial* batch once it has lingered -- until `linger_s` passed without a new
  operation, at most 4 x `linger_s` after its first; with `linger_s` 0, until the
  event loop has run every ready task -- and only while no other partial batch is in
  flight (Nagle's rule). Operations that arrive meanwhile gather into the next
  batch, so the batch size follows the load and the server's latency: one operation
  goes alone, 64 concurrent callers share one write.

Each slot is a numbered *lane*: a batch keeps its lane through all its retries and
the lane carries nothing else meanwhile, so per lane batches are strictly
sequential. Exactly-once writes rely on that (see `writes.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Generic, NamedTuple, TypeVar

log = logging.getLogger(__name__)

#: A partial batch waits until `linger_s` passes without a new operation, but no
#: longer than this many times `linger_s` after its first one.
_MAX_LINGER_FACTOR = 4

Op = TypeVar("Op")
#: Sends one closed batch on the given lane; resolves its operations' futures itself.
Job = Callable[[int], Coroutine[Any, Any, None]]


class BatchLimits(NamedTuple):
    linger_s: float
    max_ops: int
    max_bytes: int
    max_inflight: int


class Batcher(Generic[Op]):
    """The batches of one shard and one kind (writes or reads)."""

    def __init__(
        self, send: Callable[[list[Op], int], Coroutine[Any, Any, None]], limits: BatchLimits
    ) -> None:
        self._send = send
        self._limits = limits
        self._loop = asyncio.get_running_loop()
        self._open: list[Op] = []
        self._open_bytes = 0
        self._lingered = False
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._full: deque[Job] = deque()
        self._free_lanes = list(range(limits.max_inflight - 1, -1, -1))
        self._inflight: set[asyncio.Task[None]] = set()
        self._partial_inflight = False
        self._deadline = 0.0

    def add(self, op: Op, size: int) -> None:
        """Queues one operation; `size` is its approximate encoded size in bytes."""
        self._open.append(op)
        self._open_bytes += size
        if len(self._open) >= self._limits.max_ops or self._open_bytes >= self._limits.max_bytes:
            self._full.append(self._close_open())
        elif not self._lingered:
            linger = self._limits.linger_s
            now = self._loop.time()
            if self._timer is None:
                self._deadline = now + linger * _MAX_LINGER_FACTOR
            elif linger > 0:
                self._timer.cancel()
            else:
                return
            self._timer = (
                self._loop.call_at(min(now + linger, self._deadline), self._linger_over)
                if linger > 0
                else self._loop.call_soon(self._linger_over)
            )
            return
        self._pump()

    def add_job(self, job: Job) -> None:
        """Queues a batch built elsewhere (bulk paths); it counts as a full batch."""
        self._full.append(job)
        self._pump()

    def _linger_over(self) -> None:
        self._timer = None
        self._lingered = True
        self._pump()

    def _close_open(self) -> Job:
        ops = self._open
        self._open, self._open_bytes, self._lingered = [], 0, False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return lambda lane: self._send(ops, lane)

    def _pump(self) -> None:
        while self._free_lanes:
            if self._full:
                self._start(self._full.popleft(), partial=False)
            elif self._open and self._lingered and not self._partial_inflight:
                self._start(self._close_open(), partial=True)
            else:
                return

    def _start(self, job: Job, partial: bool) -> None:
        lane = self._free_lanes.pop()
        self._partial_inflight |= partial
        task = self._loop.create_task(job(lane))
        self._inflight.add(task)
        task.add_done_callback(lambda t: self._job_done(t, lane, partial))

    def _job_done(self, task: asyncio.Task[None], lane: int, partial: bool) -> None:
        self._inflight.discard(task)
        self._free_lanes.append(lane)
        if partial:
            self._partial_inflight = False
        if not task.cancelled() and task.exception() is not None:
            log.error("a batch failed outside its own error handling", exc_info=task.exception())
        self._pump()

    async def drain(self) -> None:
        """Sends everything queued now and returns once no batch is in flight."""
        if self._open:
            self._lingered = True
        self._pump()
        while self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
