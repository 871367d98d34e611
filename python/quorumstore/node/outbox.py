"""The messages a node queued on one gRPC stream, counted per shard until gRPC wrote them.

Sending on a `grpc.aio` stream only queues: gRPC writes a message on a later turn of the
event loop, when it resumes the generator that yielded it. Work that should start only
once a shard's messages are on the wire (a leader preparing the apply it waits on Acks
for, a follower applying after its Acks) asks whether any are still unwritten, and is
told when the last one is.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from quorumstore.protocol.messages import ShardKey

M = TypeVar("M")


class Outbox(Generic[M]):
    """Messages for one stream. `written(shard)` is called whenever no message of `shard`
    is left unwritten here: the last one was written, or the stream ended (`drop`)."""

    def __init__(self, written: Callable[[ShardKey], None]):
        self._queue: asyncio.Queue[tuple[ShardKey, M] | None] = asyncio.Queue()
        self._unwritten: Counter[ShardKey] = Counter()
        self._written = written
        self._dropped = False

    def put(self, shard: ShardKey, message: M) -> None:
        """Queues `message`; after `drop` it is lost with the stream, as a message of a
        broken stream is (the engine's retransmission covers that)."""
        if self._dropped:
            return
        self._queue.put_nowait((shard, message))
        self._unwritten[shard] += 1

    def unwritten(self, shard: ShardKey) -> bool:
        return self._unwritten[shard] > 0

    def close(self) -> None:
        """Ends `messages` once the messages queued before are written."""
        self._queue.put_nowait(None)

    async def messages(self) -> AsyncIterator[M]:
        """The stream's requests or responses, in order, until `close`."""
        while (item := await self._queue.get()) is not None:
            shard, message = item
            yield message  # resumed once gRPC wrote it
            if self._dropped:
                return
            left = self._unwritten[shard] - 1
            if left:
                self._unwritten[shard] = left
            else:
                del self._unwritten[shard]
                self._written(shard)

    def drop(self) -> None:
        """The stream ended: what is still queued will never be written, nor anything
        put later; `messages` ends, whether it waits for a message or for gRPC."""
        self._dropped = True
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(None)
        shards = list(self._unwritten)
        self._unwritten.clear()
        for shard in shards:
            self._written(shard)
