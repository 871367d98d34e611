"""Where `SyncRunner` runs a group commit: a follower's on the loop while that is cheap,
everything else on the node's io threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from quorumstore.node.syncs import SyncRunner
from quorumstore.protocol.types import make_entry
from quorumstore.storage.wal import Wal
from quorumstore.storage.wal_sync import SyncTicket


class SlowTicket(SyncTicket):
    """A real group commit (`ticket`'s) on a disk that takes `delay_s` longer (or until
    `release`)."""

    def __init__(self, ticket: SyncTicket, delay_s: float = 0.0) -> None:
        super().__init__(ticket.head, [], ticket.path)
        self._real = ticket
        self.delay_s = delay_s
        self.release = threading.Event()
        if not delay_s:
            self.release.set()
        self.thread = 0

    def run(self) -> None:
        self.thread = threading.get_ident()
        started = time.perf_counter()
        self.release.wait(5)
        time.sleep(self.delay_s)
        self._real.run()
        self.error = self._real.error
        self.seconds = time.perf_counter() - started  # the disk's slowness included


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[Wal]:
    wal = Wal.open(tmp_path / "wal", sync=True)
    yield wal
    wal.close()


def _ticket(wal: Wal, delay_s: float = 0.0) -> SlowTicket:
    """A ticket covering one more appended entry."""
    wal.append([make_entry(wal.head, 1, b"x" * 100)])
    return SlowTicket(wal.prepare_sync(), delay_s)


class Recorder:
    """Collects `done` calls: the thread each ran on."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def done(self) -> None:
        self.calls.append(threading.get_ident())

    async def called(self) -> None:
        """Returns once `done` was called (by a later turn of the loop)."""
        async with asyncio.timeout(5):
            while not self.calls:
                await asyncio.sleep(0.001)


def test_a_follower_syncs_on_the_loop_and_a_leader_on_a_thread(wal: Wal) -> None:
    async def scenario() -> None:
        loop_thread = threading.get_ident()
        with ThreadPoolExecutor(1) as io:
            runner = SyncRunner(io, inline_max_s=10.0)
            follower, leader = Recorder(), Recorder()
            ticket = _ticket(wal)
            runner.run(ticket, True, follower.done)
            assert follower.calls == [loop_thread], "done before run returned, on the loop"
            assert ticket.thread == loop_thread and ticket.seconds > 0
            ticket = _ticket(wal)
            runner.run(ticket, False, leader.done)
            assert leader.calls == []
            await leader.called()
            assert leader.calls == [loop_thread] and ticket.thread != loop_thread

    asyncio.run(scenario())


def test_after_a_slow_fsync_a_follower_syncs_on_a_thread_until_one_is_quick(wal: Wal) -> None:
    async def scenario() -> None:
        loop_thread = threading.get_ident()
        with ThreadPoolExecutor(1) as io:
            runner = SyncRunner(io, inline_max_s=0.02)
            slow = _ticket(wal, delay_s=0.05)
            runner.run(slow, True, Recorder().done)  # on the loop: no slow one seen yet
            assert slow.thread == loop_thread and slow.seconds >= 0.05
            threaded, recorder = _ticket(wal), Recorder()
            runner.run(threaded, True, recorder.done)
            await recorder.called()
            assert threaded.thread != loop_thread and threaded.seconds < 0.02
            quick = _ticket(wal)
            runner.run(quick, True, Recorder().done)
            assert quick.thread == loop_thread

    asyncio.run(scenario())


def test_a_follower_syncs_on_a_thread_while_another_fsync_runs_on_one(wal: Wal) -> None:
    async def scenario() -> None:
        loop_thread = threading.get_ident()
        with ThreadPoolExecutor(2) as io:
            runner = SyncRunner(io, inline_max_s=10.0)
            leaders, followers = Recorder(), Recorder()
            held = _ticket(wal)
            held.release.clear()
            runner.run(held, False, leaders.done)
            second = _ticket(wal)
            runner.run(second, True, followers.done)
            assert followers.calls == [], "the follower's fsync did not wait on the loop"
            await followers.called()
            assert second.thread != loop_thread and leaders.calls == []
            held.release.set()
            await leaders.called()
            third = _ticket(wal)
            runner.run(third, True, followers.done)
            assert third.thread == loop_thread, "back on the loop once no fsync is on a thread"

    asyncio.run(scenario())
