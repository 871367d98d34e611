"""Merges concurrent Oxia `Write`s of one shard into one replicated entry.

Oxia's clients send each write batch as its own request, and many callers' requests
arrive at once; as separate entries each would pay the whole per-entry cost (encode,
WAL record, replication round, apply on every replica). The coalescer queues them and
sends everything queued as ONE entry, by Nagle's rule as the client's batcher applies
it: a lone request goes out on the next turn of the event loop, and while a *partial*
entry is in flight, the requests that arrive share the next one. Only *full* entries
(cut at `max_ops` / `max_bytes`) may overlap it, up to `max_inflight` in all. With one
partial entry in flight, more requests share each entry, and the leader's fixed cost
per entry is paid less often.

An entry applies its operations in order, so requests merged in arrival order behave
exactly as if each were its own entry, one after the other: each still sees its puts
applied before its deletes and delete ranges, and the effects of the requests before
it. Each caller gets the slice of the entry's results that belongs to its request.

What is not merged: exactly-once writes (one entry carries one serial); requests with
delete ranges; and a request naming a key that an earlier request of the entry also
names. The change log, and so notifications, record one change per key per entry, so
merging those would hide an intermediate version that separate entries would show.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.results import EntryResult

#: Merged entries of one shard in flight at once (at most one of them not full).
MAX_INFLIGHT = 2
#: A merged entry closes at either bound (a single larger request still goes alone).
MAX_OPS = 4096
MAX_BYTES = 4 << 20


T = TypeVar("T")


class _Queued(NamedTuple, Generic[T]):
    request: pb.WriteRequest
    prepared: T
    ops: int
    size: int
    #: The keys its puts and deletes name; None when it has delete ranges (goes alone).
    keys: frozenset[str] | None
    future: asyncio.Future[EntryResult]


def operation_count(request: pb.WriteRequest) -> int:
    return len(request.puts) + len(request.deletes) + len(request.delete_ranges)


def _named_keys(request: pb.WriteRequest) -> frozenset[str] | None:
    if request.delete_ranges:
        return None
    return frozenset([put.key for put in request.puts] + [d.key for d in request.deletes])


class WriteCoalescer(Generic[T]):
    """The merged writes of one shard replica (while it leads).

    `T` is what the caller prepared for each request when it checked it (the leader:
    its plain puts); `replicate` gets it back beside the requests, so that nothing is
    computed twice.
    """

    def __init__(
        self,
        replicate: Callable[[Sequence[pb.WriteRequest], Sequence[T]], Awaitable[EntryResult]],
        *,
        max_inflight: int = MAX_INFLIGHT,
        max_ops: int = MAX_OPS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self._replicate = replicate
        self._max_inflight = max_inflight
        self._max_ops = max_ops
        self._max_bytes = max_bytes
        self._queue: deque[_Queued[T]] = deque()
        self._queued_ops = 0
        self._queued_bytes = 0
        self._inflight = 0
        self._partial_inflight = False
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def write(self, request: pb.WriteRequest, prepared: T) -> EntryResult:
        """Replicates `request` (in a merged entry); its own results, in batch order."""
        future: asyncio.Future[EntryResult] = asyncio.get_running_loop().create_future()
        queued = _Queued(
            request,
            prepared,
            operation_count(request),
            request.ByteSize(),
            _named_keys(request),
            future,
        )
        self._queue.append(queued)
        self._queued_ops += queued.ops
        self._queued_bytes += queued.size
        self._schedule_flush()
        return await future

    def _schedule_flush(self) -> None:
        if self._queue and not self._flush_scheduled and self._inflight < self._max_inflight:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        loop = asyncio.get_running_loop()
        while self._queue and self._inflight < self._max_inflight:
            if self._partial_inflight and (
                self._queued_ops < self._max_ops and self._queued_bytes < self._max_bytes
            ):
                return  # cannot fill an entry: the partial one's completion flushes again
            count, full = self._next_group()
            if not full and self._partial_inflight:
                return
            group = [self._queue.popleft() for _ in range(count)]
            for queued in group:
                self._queued_ops -= queued.ops
                self._queued_bytes -= queued.size
            live = [queued for queued in group if not queued.future.done()]  # callers gone
            if not live:
                continue
            self._inflight += 1
            if not full:
                self._partial_inflight = True
            task = loop.create_task(self._send(live, partial=not full))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _next_group(self) -> tuple[int, bool]:
        """How many queued requests the next entry takes, and whether it is full (cut at
        `max_ops` / `max_bytes`); one cut at a request that cannot join is not."""
        first = self._queue[0]
        ops, size, keys = first.ops, first.size, first.keys
        count = 1
        for head in itertools.islice(self._queue, 1, None):
            if keys is None or head.keys is None or not keys.isdisjoint(head.keys):
                break
            if ops + head.ops > self._max_ops or size + head.size > self._max_bytes:
                return count, True
            count += 1
            ops += head.ops
            size += head.size
            keys = keys | head.keys
        return count, ops >= self._max_ops or size >= self._max_bytes

    async def _send(self, group: list[_Queued[T]], *, partial: bool) -> None:
        try:
            result = await self._replicate(
                [queued.request for queued in group], [queued.prepared for queued in group]
            )
        except asyncio.CancelledError:  # the node is stopping
            for queued in group:
                queued.future.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - every failure goes to the waiting callers
            for queued in group:
                if not queued.future.done():
                    queued.future.set_exception(e)
        else:
            start = 0
            for queued in group:
                if not queued.future.done():
                    mine = result.results[start : start + queued.ops]
                    # An entry that could not be applied at all has no per-op results:
                    # every caller learns why.
                    invalid = result.invalid if not result.results else None
                    queued.future.set_result(
                        EntryResult(result.offset, mine, result.duplicate, invalid=invalid)
                    )
                start += queued.ops
        finally:
            self._inflight -= 1
            if partial:
                self._partial_inflight = False
            self._schedule_flush()
