"""One request to a shard's leader, retried across leader changes until a deadline.

Every data request (a write batch, a read batch, a scan) names its shard and must
reach that shard's current leader. `ShardCaller` looks the leader up in the
directory's latest map for each attempt; after a transient failure (see
`retry.py`) it backs off -- waking early when a new map arrives or following the
not-leader error's hint at once -- and tries again until `request_timeout_s` has
passed without success. An attempt still waiting when the map names another leader
for its shard is given up and sent there at once: a paused or cut-off leader never
answers, and the client's channels notice a dead connection only by their keepalive
pings (about 2 s, `wire/channels.py`). Retrying is safe as for any transient
failure: writes carry exactly-once serials (`writes.py`), reads change nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from quorumstore.client.discovery import Channels, Directory
from quorumstore.client.errors import ServiceUnavailable
from quorumstore.client.retry import Backoff, Transient, classify
from quorumstore.event_loops import abandon
from quorumstore.proto.oxia_client_pb2_grpc import OxiaClientStub

T = TypeVar("T")
M = TypeVar("M")

#: A single attempt gives up after this long, so a leader that hangs (partitioned,
#: overloaded) is retried like one that is down.
ATTEMPT_TIMEOUT_S = 10.0


class ShardCaller:
    """Sends requests to shard leaders with the retry policy above."""

    def __init__(self, directory: Directory, channels: Channels, request_timeout_s: float) -> None:
        self._directory = directory
        self._channels = channels
        self._timeout_s = request_timeout_s

    @property
    def channels(self) -> Channels:
        return self._channels

    async def call(
        self,
        shard: int,
        attempt: Callable[[str, float], Awaitable[T]],
        what: str,
        timeout_s: float | None = None,
    ) -> T:
        """`attempt(leader_address, timeout_s)`, retried until it succeeds.

        Raises the typed error of a final failure, or ServiceUnavailable at the deadline:
        `timeout_s` from now, the client's `request_timeout_s` by default.
        """
        loop = asyncio.get_running_loop()
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        deadline = loop.time() + timeout_s
        backoff = Backoff()
        while True:
            leader = self._directory.map.leader(shard)
            hinted = False
            if leader is None:
                reason = f"shard {shard} has no leader (an election is running)"
            else:
                timeout = min(ATTEMPT_TIMEOUT_S, max(deadline - loop.time(), 0.001))
                answer = asyncio.ensure_future(attempt(leader, timeout))
                moved = asyncio.ensure_future(self._directory.leader_moved(shard, leader))
                try:
                    await asyncio.wait([answer, moved], return_when=asyncio.FIRST_COMPLETED)
                    if answer.done():
                        return answer.result()
                    reason, hinted = f"{leader}: shard {shard}'s leader changed", True
                except grpc.aio.AioRpcError as e:
                    reason, hinted = self._transient(e, shard, leader)
                finally:
                    abandon(moved)
                    abandon(answer)
            await self._pause(what, shard, reason, deadline, timeout_s, backoff, hinted)

    async def stream(
        self, shard: int, open_stream: Callable[[OxiaClientStub], AsyncIterator[M]], what: str
    ) -> AsyncIterator[M]:
        """The messages of a server stream, re-opened after transient failures.

        `open_stream` is called again for each attempt, so it must resume where the
        messages already yielded end. An attempt that delivered messages before it
        failed restarts the deadline: only failures without progress run it out.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        backoff = Backoff()
        while True:
            leader = self._directory.map.leader(shard)
            hinted = False
            if leader is None:
                reason = f"shard {shard} has no leader (an election is running)"
            else:
                progressed = False
                try:
                    async for message in open_stream(self._channels.stub(leader)):
                        progressed = True
                        yield message
                    return
                except grpc.aio.AioRpcError as e:
                    if progressed:
                        deadline = loop.time() + self._timeout_s
                        backoff = Backoff()
                    reason, hinted = self._transient(e, shard, leader)
            await self._pause(what, shard, reason, deadline, self._timeout_s, backoff, hinted)

    def _transient(self, e: grpc.aio.AioRpcError, shard: int, leader: str) -> tuple[str, bool]:
        """Why an attempt failed and whether the error named a new leader (now in the
        directory), for a failure worth retrying; raises the typed error of any other."""
        failure = classify(e)
        if not isinstance(failure, Transient):
            raise failure from None
        reason, hint = f"{leader}: {failure.reason}", failure.leader_hint
        if not hint or hint == leader:
            return reason, False
        self._directory.hint(shard, hint)
        return reason, True

    async def _pause(
        self,
        what: str,
        shard: int,
        reason: str,
        deadline: float,
        timeout_s: float,
        backoff: Backoff,
        hinted: bool,
    ) -> None:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise ServiceUnavailable(
                f"{what} on shard {shard} did not succeed within {timeout_s:g} s; "
                f"last error: {reason}"
            )
        delay = min(backoff.next_delay(), remaining)
        if hinted:
            await asyncio.sleep(delay)
        else:
            await self._directory.wait_for_change(delay)
