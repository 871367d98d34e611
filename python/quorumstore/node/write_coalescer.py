"""Merges concurrent Oxia `Write`s of one shard into one replicated entry.

Oxia's clients send each write batch as its own request, and many callers' requests
arrive at once; as separate entries each would pay the whole per-entry cost (encode,
WAL record, replication round, apply on every replica). The coalescer queues them and
sends everything queued as ONE entry, with at most `max_inflight` such entries in
flight per shard: a lone request goes out on the next turn of the event loop, and under
load the requests that arrive while entries are in flight share the next one (Nagle's
rule, as the client's batcher applies it).

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
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.state_machine import EntryResult

#: Merged entries of one shard in flight at once.
MAX_INFLIGHT = 2
#: A merged entry closes at either bound (a single larger request still goes alone).
MAX_OPS = 4096
MAX_BYTES = 4 << 20


class _Queued(NamedTuple):
    request: pb.WriteRequest
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


class WriteCoalescer:
    """The merged writes of one shard replica (while it leads)."""

    def __init__(
        self,
        replicate: Callable[[Sequence[pb.WriteRequest]], Awaitable[EntryResult]],
        *,
        max_inflight: int = MAX_INFLIGHT,
        max_ops: int = MAX_OPS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self._replicate = replicate
        self._max_inflight = max_inflight
        self._max_ops = max_ops
        self._max_bytes = max_bytes
        self._queue: deque[_Queued] = deque()
        self._inflight = 0
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def write(self, request: pb.WriteRequest) -> EntryResult:
        """Replicates `request` (in a merged entry); its own results, in batch order."""
        future: asyncio.Future[EntryResult] = asyncio.get_running_loop().create_future()
        self._queue.append(
            _Queued(
                request, operation_count(request), request.ByteSize(), _named_keys(request), future
            )
        )
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
            group = [self._queue.popleft()]
            ops, size, keys = group[0].ops, group[0].size, group[0].keys
            while self._queue and keys is not None:
                head = self._queue[0]
                if (
                    head.keys is None
                    or not keys.isdisjoint(head.keys)
                    or ops + head.ops > self._max_ops
                    or size + head.size > self._max_bytes
                ):
                    break
                group.append(self._queue.popleft())
                ops += head.ops
                size += head.size
                keys |= head.keys
            live = [queued for queued in group if not queued.future.done()]  # callers gone
            if not live:
                continue
            self._inflight += 1
            task = loop.create_task(self._send(live))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, group: list[_Queued]) -> None:
        try:
            result = await self._replicate([queued.request for queued in group])
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
                    queued.future.set_result(EntryResult(result.offset, mine, result.duplicate))
                start += queued.ops
        finally:
            self._inflight -= 1
            self._schedule_flush()
