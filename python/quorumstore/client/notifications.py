"""Change notifications: every shard's `GetNotifications` stream, as one iterator.

Each shard streams one batch per log entry that changed something, tagged with the
entry's offset. The subscription follows each shard's leader and, after a failure,
re-opens the shard's stream after the last offset it delivered: the change log is
replicated, so a new leader continues exactly there, with no gap and no repeat. A
large entry comes in several batches, all but the last tagged with the offset before
it (see `quorumstore.node.oxia.notifications`), so a stream broken between them sends the
entry again from its start; the subscription skips the batches it already delivered,
which every leader cuts alike. `offsets` is what to pass as `start_offsets` to resume
in a new subscription (one started between such batches gets the entry whole).
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import NamedTuple, Self

from quorumstore.client.calls import ShardCaller
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto.oxia_client_pb2_grpc import OxiaClientStub
from quorumstore.wire.metadata import LEADER_ROUTING_METADATA

#: Notifications buffered per subscription before the shard streams wait for the reader.
_QUEUE_SIZE = 10_000


class NotificationType(enum.IntEnum):
    KEY_CREATED = pb.KEY_CREATED
    KEY_MODIFIED = pb.KEY_MODIFIED
    KEY_DELETED = pb.KEY_DELETED
    #: [key, key_range_end) was deleted.
    KEY_RANGE_DELETED = pb.KEY_RANGE_DELETED


class Notification(NamedTuple):
    """One change of one key (or key range) by the log entry at `offset` of `shard`."""

    shard: int
    offset: int
    timestamp_ms: int
    type: NotificationType
    key: str
    #: The record's version id after the change; None for deletions.
    version_id: int | None
    #: End (exclusive) of the deleted range, for KEY_RANGE_DELETED.
    key_range_end: str | None


def _notifications(batch: pb.NotificationBatch) -> list[Notification]:
    return [
        Notification(
            batch.shard,
            batch.offset,
            batch.timestamp,
            NotificationType(n.type),
            key,
            n.version_id if n.HasField("version_id") else None,
            n.key_range_last if n.type == pb.KEY_RANGE_DELETED else None,
        )
        for key, n in batch.notifications.items()
    ]


class Subscription:
    """An async iterator of `Notification`s from some shards; close it when done.

    Within a shard notifications come in offset order; shards interleave. The
    iterator raises the error that ended a shard's stream (ServiceUnavailable after
    `request_timeout_s` without a leader, say).
    """

    def __init__(
        self, caller: ShardCaller, shards: list[int], start_offsets: Mapping[int, int]
    ) -> None:
        #: Per shard, the offset of the last entry delivered (or the start position).
        self.offsets: dict[int, int | None] = {s: start_offsets.get(s) for s in shards}
        self._caller = caller
        # Chunks of notifications, the error that ended a shard's stream, or None
        # (closed: wakes a reader waiting on an empty queue).
        self._queue: asyncio.Queue[list[Notification] | BaseException | None] = asyncio.Queue(
            _QUEUE_SIZE
        )
        self._closed = False
        self._pending: deque[Notification] = deque()
        self._positioned: set[int] = set()
        self._ready = asyncio.Event()
        self._failure: BaseException | None = None
        self._tasks = [asyncio.create_task(self._follow(shard)) for shard in shards]

    async def wait_ready(self) -> Self:
        """Returns once every shard's stream has told its start position.

        Every change committed after this is delivered.
        """
        await self._ready.wait()
        if self._failure is not None:
            raise self._failure
        return self

    async def _follow(self, shard: int) -> None:
        # Batches of the entry after offsets[shard] delivered so far (a large entry's
        # parts, which carry that offset), and how many of them a re-opened stream,
        # which sends them again, still has to skip.
        parts = skip = 0

        def open_stream(stub: OxiaClientStub) -> AsyncIterator[pb.NotificationBatch]:
            nonlocal skip
            request = pb.NotificationsRequest(shard=shard)
            start = self.offsets[shard]
            if start is not None:
                request.start_offset_exclusive = start
            skip = parts
            return stub.GetNotifications(request, metadata=LEADER_ROUTING_METADATA)

        try:
            async for batch in self._caller.stream(shard, open_stream, "notifications"):
                if batch.notifications and batch.offset == self.offsets[shard]:
                    if skip:
                        skip -= 1
                        continue
                    parts += 1
                elif batch.offset != self.offsets[shard]:
                    parts = skip = 0
                self.offsets[shard] = batch.offset
                self._positioned.add(shard)
                if len(self._positioned) == len(self.offsets):
                    self._ready.set()
                if batch.notifications:
                    await self._queue.put(_notifications(batch))
        except Exception as e:  # noqa: BLE001 - handed to the reader
            self._failure = e
            self._ready.set()
            await self._queue.put(e)

    async def next_chunk(self) -> list[Notification]:
        """The notifications received so far (at least one; waits for it).

        Raises StopAsyncIteration once the subscription is closed.
        """
        if self._pending:
            chunk = list(self._pending)
            self._pending.clear()
            return chunk
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            await self.aclose()
            raise item
        return item

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Notification:
        if not self._pending:
            self._pending.extend(await self.next_chunk())
        return self._pending.popleft()

    async def aclose(self) -> None:
        """Stops following the shards; iterating then ends."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._queue.empty():
            self._queue.put_nowait(None)

    async def __aenter__(self) -> Self:
        return await self.wait_ready()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
