"""Sequence updates: the highest key of a sequence, each time it grows.

A sequence-key put (`put_sequence`) stores its record under the prefix plus a
server-assigned, zero-padded suffix per delta. `GetSequenceUpdates` streams the
highest such key of a prefix whenever a put extends the sequence. Only the latest
key matters to a follower of a sequence, so a reader that falls behind gets the
newest key, not a backlog. The stream follows the shard's leader; after a
re-opening the server repeats the current highest key, which is not delivered twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Self

from quorumstore.client.calls import ShardCaller
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto.oxia_client_pb2_grpc import OxiaClientStub
from quorumstore.wire.metadata import LEADER_ROUTING_METADATA


class SequenceSubscription:
    """An async iterator of a sequence's highest key, as it grows; close it when done.

    Iterating raises the error that ended the stream (ServiceUnavailable after
    `request_timeout_s` without a leader, say).
    """

    def __init__(self, caller: ShardCaller, shard: int, prefix_key: str) -> None:
        self.shard = shard
        self.prefix_key = prefix_key
        self._latest: str | None = None
        self._delivered: str | None = None
        self._failure: BaseException | None = None
        self._ended = False
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._follow(caller))

    async def _follow(self, caller: ShardCaller) -> None:
        request = pb.GetSequenceUpdatesRequest(shard=self.shard, key=self.prefix_key)

        def open_stream(stub: OxiaClientStub) -> AsyncIterator[pb.GetSequenceUpdatesResponse]:
            return stub.GetSequenceUpdates(request, metadata=LEADER_ROUTING_METADATA)

        try:
            async for update in caller.stream(self.shard, open_stream, "sequence updates"):
                self._latest = update.highest_sequence_key
                self._changed.set()
        except Exception as e:  # noqa: BLE001 - handed to the reader
            self._failure = e
        finally:
            self._ended = True
            self._changed.set()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> str:
        while True:
            if self._latest is not None and self._latest != self._delivered:
                self._delivered = self._latest
                return self._latest
            if self._ended:
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    raise failure
                raise StopAsyncIteration
            self._changed.clear()
            await self._changed.wait()

    async def aclose(self) -> None:
        """Stops following the sequence; iterating then ends."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._latest = self._delivered
        self._ended = True  # also when the task was cancelled before it started
        self._changed.set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
