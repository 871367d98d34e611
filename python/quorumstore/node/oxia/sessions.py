"""The leader's session clocks: heartbeats in memory, expiry as a replicated write.

Sessions themselves are replicated state (`storage/sessions.py`); when a session was
last heard of is not, because wall-clock time has no place in the state machine.
Only a shard's leader keeps these clocks. When it finds a session silent for longer
than its timeout it proposes the session's close, a replicated write that deletes the
session's ephemeral records with it. A leader of a new term cannot know when the
sessions last heartbeated to its predecessor, so it starts every session's clock
afresh: each gets its full timeout as grace.

The leader also counts the sessions it created per client (`max_sessions_per_client`,
docs/limits.md), from the create until the session is closed or expires, or until the
leader loses its clocks; sessions a leader did not create itself count against nobody.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from quorumstore.node.limits import RequestLimits, Tally
from quorumstore.node.oxia.errors import session_not_found
from quorumstore.node.oxia.routing import Router, ShardHostApi
from quorumstore.node.oxia.writes import replicate
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.reads import ShardReader
from quorumstore.storage.results import Status
from quorumstore.storage.write_batch import WriteBatchBuilder

log = logging.getLogger(__name__)

#: How often the leader looks for expired sessions.
DEFAULT_SESSION_CHECK_INTERVAL_S = 0.1


def monotonic_ms() -> int:
    """Session clocks: a wall-clock jump must not expire sessions."""
    return time.monotonic_ns() // 1_000_000


class LeaderShard(Protocol):
    def is_leader(self) -> bool: ...

    def reader(self) -> ShardReader: ...


@dataclass
class _Clocks:
    """The session deadlines of one shard during one term of its leader."""

    term: int
    timeouts: dict[int, int] = field(default_factory=dict)
    deadlines: dict[int, int] = field(default_factory=dict)
    closing: set[int] = field(default_factory=set)
    #: The client each session this leader created counts against (`limits.client_of`).
    owners: dict[int, str] = field(default_factory=dict)

    def start(self, session_id: int, timeout_ms: int, now_ms: int) -> None:
        self.timeouts[session_id] = timeout_ms
        self.deadlines[session_id] = now_ms + timeout_ms

    def forget(self, session_id: int) -> str | None:
        """Drops the session's clock; returns the client it counted against, if any."""
        self.timeouts.pop(session_id, None)
        self.deadlines.pop(session_id, None)
        self.closing.discard(session_id)
        return self.owners.pop(session_id, None)


class SessionKeeper:
    """Session clocks of every shard this node leads, keyed by the shard's host object,
    and the sessions each client has open among them."""

    def __init__(self, now_ms: Callable[[], int], limits: RequestLimits = RequestLimits()) -> None:
        self._now_ms = now_ms
        self._clocks: dict[int, _Clocks] = {}
        self._closing: set[asyncio.Future[None]] = set()
        #: Sessions per client: taken before a create is replicated, given back when the
        #: clock that records its owner is dropped.
        self.per_client = Tally(
            limits,
            "max_sessions_per_client",
            lambda client, held: (
                f"client {client} would have {held} sessions open on the "
                "shards this node leads with this one"
            ),
        )

    def _for(self, host: LeaderShard) -> _Clocks:
        """The clocks of a shard led here, restarted when its leader's term changed."""
        reader = host.reader()
        term = reader.applied_position.term
        clocks = self._clocks.get(id(host))
        if clocks is None or clocks.term != term:
            if clocks is not None:
                self._drop(clocks)
            clocks = _Clocks(term)
            now = self._now_ms()
            for info in reader.open_sessions():
                clocks.start(info.session_id, info.timeout_ms, now)
            self._clocks[id(host)] = clocks
        return clocks

    def started(self, host: LeaderShard, session_id: int, timeout_ms: int, owner: str) -> None:
        """A session this leader just created for `owner`, already counted in `per_client`."""
        clocks = self._for(host)
        clocks.start(session_id, timeout_ms, self._now_ms())
        clocks.owners[session_id] = owner

    def heartbeat(self, host: LeaderShard, session_id: int) -> bool:
        """Restarts the session's clock; False if the shard has no such open session."""
        clocks = self._for(host)
        timeout = clocks.timeouts.get(session_id)
        if timeout is None:
            # Created since the clocks were loaded, and not through this node's API.
            info = host.reader().session_info(session_id)
            if info is None:
                return False
            timeout = info.timeout_ms
        clocks.start(session_id, timeout, self._now_ms())
        return True

    def forget(self, host: LeaderShard, session_id: int) -> None:
        clocks = self._clocks.get(id(host))
        if clocks is not None:
            self._forget(clocks, session_id)

    def _forget(self, clocks: _Clocks, session_id: int) -> None:
        owner = clocks.forget(session_id)
        if owner is not None:
            self.per_client.give_back(owner)

    def _drop(self, clocks: _Clocks) -> None:
        """Gives back the sessions of clocks no longer kept (a closing one may still
        finish and forget its session: it is no longer counted)."""
        for owner in clocks.owners.values():
            self.per_client.give_back(owner)
        clocks.owners.clear()

    def expire(
        self, hosts: list[LeaderShard], close: Callable[[LeaderShard, int], Awaitable[None]]
    ) -> None:
        """Starts closing (with `close`) every session past its deadline on the shards led here.

        Each close runs as a task of its own, so a write that cannot commit (a leader
        cut off from its followers) holds up nothing else. Shards no longer led here
        lose their clocks; a later leadership starts afresh.
        """
        led = {id(h) for h in hosts if h.is_leader()}
        for key in [k for k in self._clocks if k not in led]:
            self._drop(self._clocks.pop(key))
        now = self._now_ms()
        for host in hosts:
            if id(host) not in led:
                continue
            clocks = self._for(host)
            for session_id, deadline in clocks.deadlines.items():
                if deadline <= now and session_id not in clocks.closing:
                    clocks.closing.add(session_id)
                    task = asyncio.ensure_future(self._close(host, clocks, session_id, close))
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)

    def cancel(self) -> None:
        """Abandons the closes in flight (the next leader's clocks expire them again)."""
        for task in list(self._closing):
            task.cancel()

    async def _close(
        self,
        host: LeaderShard,
        clocks: _Clocks,
        session_id: int,
        close: Callable[[LeaderShard, int], Awaitable[None]],
    ) -> None:
        try:
            await close(host, session_id)
        except Exception as e:  # noqa: BLE001 - retried on the next sweep, or by the next leader
            log.info("closing expired session %d failed (%s); retrying later", session_id, e)
            clocks.closing.discard(session_id)
            return
        log.info("session %d expired and was closed", session_id)
        self._forget(clocks, session_id)


class Sessions:
    """The sessions of the shards led here: their create, heartbeat and close writes,
    and the task that closes the expired ones. Create it on the event loop that serves
    it: it starts that task there (`close()` stops it)."""

    def __init__(
        self,
        router: Router,
        clock_ms: Callable[[], int],
        check_interval_s: float,
        limits: RequestLimits,
    ) -> None:
        self._router = router
        self._check_interval_s = check_interval_s
        self._keeper = SessionKeeper(clock_ms, limits)
        self._expiry = asyncio.get_running_loop().create_task(self._expire())

    def close(self) -> None:
        """Stops expiring sessions and abandons the closes in flight."""
        self._expiry.cancel()
        self._keeper.cancel()

    async def create(
        self, host: ShardHostApi, request: pb.CreateSessionRequest, client: str
    ) -> pb.CreateSessionResponse:
        """Creates a session counted against `client` (refused past its limit)."""
        timeout = request.session_timeout_ms
        batch = WriteBatchBuilder()
        batch.add_create_session(timeout, request.client_identity)
        now_ms = self._router.directory.now_ms()
        self._keeper.per_client.take(client)
        try:
            result = await replicate(host, request.shard, batch.build(now_ms))
        except BaseException:
            self._keeper.per_client.give_back(client)
            raise
        session_id = result.results[0].session_id
        assert session_id is not None, "a session create returned no session id"
        self._keeper.started(host, session_id, timeout, client)
        return pb.CreateSessionResponse(session_id=session_id)

    def keep_alive(self, host: ShardHostApi, request: pb.SessionHeartbeat) -> pb.KeepAliveResponse:
        if not self._keeper.heartbeat(host, request.session_id):
            raise session_not_found(request.shard, request.session_id)
        return pb.KeepAliveResponse()

    async def close_session(
        self, host: ShardHostApi, request: pb.CloseSessionRequest
    ) -> pb.CloseSessionResponse:
        """Closes the session; its ephemeral records are deleted by the same write."""
        if not await self._close(host, request.shard, request.session_id):
            raise session_not_found(request.shard, request.session_id)
        return pb.CloseSessionResponse()

    async def _close(self, host: ShardHostApi, shard: int, session_id: int) -> bool:
        """Replicates the session's close; False if the shard had no such session."""
        batch = WriteBatchBuilder()
        batch.add_close_session(session_id)
        result = await replicate(host, shard, batch.build(self._router.directory.now_ms()))
        self._keeper.forget(host, session_id)
        return result.results[0].status == Status.OK

    async def _expire(self) -> None:
        """Forever: close the sessions whose leader here heard nothing for their timeout."""
        while True:
            await asyncio.sleep(self._check_interval_s)
            try:
                hosts = self._router.hosts()
                shards = {id(host): shard for shard, host in hosts}
                close = functools.partial(self._close_expired, shards)
                self._keeper.expire([host for _, host in hosts], close)
            except Exception:  # the sweep must go on; the next one retries
                log.exception("session expiry sweep failed")

    async def _close_expired(self, shards: dict[int, int], host: Any, session_id: int) -> None:
        await self._close(host, shards[id(host)], session_id)
