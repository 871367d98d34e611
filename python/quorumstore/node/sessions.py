"""The leader's session clocks: heartbeats in memory, expiry as a replicated write.

Sessions themselves are replicated state (`storage/sessions.py`); when a session was
last heard of is not, because wall-clock time has no place in the state machine.
Only a shard's leader keeps these clocks. When it finds a session silent for longer
than its timeout it proposes the session's close, a replicated write that deletes the
session's ephemeral records with it. A leader of a new term cannot know when the
sessions last heartbeated to its predecessor, so it starts every session's clock
afresh: each gets its full timeout as grace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from quorumstore.storage.state_machine import ShardReader

log = logging.getLogger(__name__)


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

    def start(self, session_id: int, timeout_ms: int, now_ms: int) -> None:
        self.timeouts[session_id] = timeout_ms
        self.deadlines[session_id] = now_ms + timeout_ms

    def forget(self, session_id: int) -> None:
        self.timeouts.pop(session_id, None)
        self.deadlines.pop(session_id, None)
        self.closing.discard(session_id)


class SessionKeeper:
    """Session clocks of every shard this node leads, keyed by the shard's host object."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self._clocks: dict[int, _Clocks] = {}
        self._closing: set[asyncio.Future[None]] = set()

    def _for(self, host: LeaderShard) -> _Clocks:
        """The clocks of a shard led here, restarted when its leader's term changed."""
        reader = host.reader()
        term = reader.applied_position.term
        clocks = self._clocks.get(id(host))
        if clocks is None or clocks.term != term:
            clocks = _Clocks(term)
            now = self._now_ms()
            for info in reader.open_sessions():
                clocks.start(info.session_id, info.timeout_ms, now)
            self._clocks[id(host)] = clocks
        return clocks

    def started(self, host: LeaderShard, session_id: int, timeout_ms: int) -> None:
        """A session this leader just created."""
        self._for(host).start(session_id, timeout_ms, self._now_ms())

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
            clocks.forget(session_id)

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
            del self._clocks[key]
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
        clocks.forget(session_id)
