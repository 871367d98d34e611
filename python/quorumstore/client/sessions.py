"""Client sessions: one per shard, holding the ephemeral records put through a client.

An ephemeral record lives as long as its session: the shard deletes it, by a
replicated write, when the session is closed or expires (no keep-alive for the
session timeout). The client opens a shard's session on its first ephemeral put
there, sends a keep-alive every tenth of the timeout, and closes the session when
it closes, which deletes the records.

A session can still expire under a live client, when the client cannot reach the
shard's leader for longer than the timeout. The records are then gone; the client
logs it, and its next ephemeral put on that shard opens a new session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from quorumstore.client.calls import ShardCaller
from quorumstore.client.errors import QuorumStoreError, SessionDoesNotExist
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto.oxia_client_pb2_grpc import OxiaClientStub
from quorumstore.wire.metadata import LEADER_ROUTING_METADATA
from quorumstore.wire.sessions import MAX_SESSION_TIMEOUT_MS, MIN_SESSION_TIMEOUT_MS

log = logging.getLogger(__name__)
R = TypeVar("R")

#: Keep-alives per session timeout.
HEARTBEATS_PER_TIMEOUT = 10
#: How long closing a session is retried at most: a client closed while its cluster is
#: unreachable returns after this, and the session's records go when it expires.
SESSION_CLOSE_TIMEOUT_S = 5.0


def check_session_timeout(timeout_ms: int) -> None:
    """The bounds every Oxia server enforces, checked before any session is opened."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
        raise TypeError(f"session_timeout_ms must be an int, got {type(timeout_ms).__name__}")
    if not MIN_SESSION_TIMEOUT_MS <= timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        raise ValueError(
            f"session_timeout_ms is {timeout_ms}; it must be between "
            f"{MIN_SESSION_TIMEOUT_MS} and {MAX_SESSION_TIMEOUT_MS} ms"
        )


class _Session:
    """One open session and the task that keeps it alive."""

    def __init__(self, shard: int, session_id: int, keeper: asyncio.Task[None]) -> None:
        self.shard = shard
        self.session_id = session_id
        self.keeper = keeper


class ShardSessions:
    """The client's sessions, at most one per shard."""

    def __init__(self, caller: ShardCaller, timeout_ms: int, client_identity: str) -> None:
        self._caller = caller
        self._timeout_ms = timeout_ms
        self._identity = client_identity
        #: Per shard, the session being opened or open; a failed opening is dropped.
        self._sessions: dict[int, asyncio.Future[_Session]] = {}
        self._closed = False

    async def session_id(self, shard: int) -> int:
        """The shard's session, opened on first use (concurrent callers share one)."""
        if self._closed:
            raise QuorumStoreError("the client's sessions are closed")
        opening = self._sessions.get(shard)
        if opening is None:
            opening = asyncio.ensure_future(self._open(shard))
            self._sessions[shard] = opening
        try:
            session = await asyncio.shield(opening)
        except Exception:
            if self._sessions.get(shard) is opening:
                del self._sessions[shard]
            raise
        return session.session_id

    async def _call(
        self,
        shard: int,
        method: Callable[[OxiaClientStub], Callable[..., Awaitable[R]]],
        request: object,
        what: str,
        timeout_s: float | None = None,
    ) -> R:
        """`method` of the shard leader's stub with `request`, retried as every call is."""
        stub = self._caller.channels.stub

        async def attempt(leader: str, attempt_timeout_s: float) -> R:
            return await method(stub(leader))(
                request, metadata=LEADER_ROUTING_METADATA, timeout=attempt_timeout_s
            )

        return await self._caller.call(shard, attempt, what, timeout_s)

    async def _open(self, shard: int) -> _Session:
        request = pb.CreateSessionRequest(
            shard=shard, session_timeout_ms=self._timeout_ms, client_identity=self._identity
        )
        # A retried create may leave an extra, unused session behind; it expires.
        response: pb.CreateSessionResponse = await self._call(
            shard, lambda stub: stub.CreateSession, request, "session create"
        )
        session_id = response.session_id
        keeper = asyncio.create_task(self._keep_alive(shard, session_id))
        return _Session(shard, session_id, keeper)

    async def _keep_alive(self, shard: int, session_id: int) -> None:
        request = pb.SessionHeartbeat(shard=shard, session_id=session_id)
        interval_s = self._timeout_ms / HEARTBEATS_PER_TIMEOUT / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self._call(shard, lambda stub: stub.KeepAlive, request, "session keep-alive")
            except SessionDoesNotExist:
                log.warning(
                    "session %d of shard %d expired (no keep-alive reached the shard for "
                    "%d ms): its ephemeral records were deleted; the next ephemeral put "
                    "there opens a new session",
                    session_id,
                    shard,
                    self._timeout_ms,
                )
                self.lost(shard, session_id)
                return
            except QuorumStoreError as e:
                log.warning("keep-alive of session %d of shard %d failed: %s", session_id, shard, e)

    def lost(self, shard: int, session_id: int) -> None:
        """The shard no longer has `session_id`: the next ephemeral put opens another."""
        opening = self._sessions.get(shard)
        if opening is None or not opening.done() or opening.exception() is not None:
            return
        session = opening.result()
        if session.session_id == session_id:
            del self._sessions[shard]
            if session.keeper is not asyncio.current_task():
                session.keeper.cancel()

    async def close(self) -> None:
        """Closes every session, deleting their ephemeral records."""
        self._closed = True
        openings = list(self._sessions.values())
        self._sessions.clear()
        sessions = [
            s
            for s in await asyncio.gather(*openings, return_exceptions=True)
            if isinstance(s, _Session)
        ]
        for session in sessions:
            session.keeper.cancel()
        await asyncio.gather(*(s.keeper for s in sessions), return_exceptions=True)
        await asyncio.gather(*(self._close(s) for s in sessions))

    async def _close(self, session: _Session) -> None:
        request = pb.CloseSessionRequest(shard=session.shard, session_id=session.session_id)
        try:
            await self._call(
                session.shard,
                lambda stub: stub.CloseSession,
                request,
                "session close",
                min(SESSION_CLOSE_TIMEOUT_S, self._timeout_ms / 1000),
            )
        except SessionDoesNotExist:
            pass  # expired already: its records are gone either way
        except QuorumStoreError as e:
            log.warning(
                "could not close session %d of shard %d (%s); its ephemeral records are "
                "deleted when it expires, %d ms after its last keep-alive",
                session.session_id,
                session.shard,
                e,
                self._timeout_ms,
            )
