"""quorumstore's own loops run on uvloop where it is installed (as it is here)."""

from __future__ import annotations

import asyncio

import uvloop

from quorumstore import event_loops
from quorumstore.client.loop_thread import LoopThread


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_run_runs_the_coroutine_on_a_uvloop_loop_and_returns_its_result() -> None:
    assert event_loops.run(_loop_type()) is uvloop.Loop


def test_the_sync_clients_loop_thread_runs_uvloop() -> None:
    thread = LoopThread("test-loop")
    try:
        assert thread.call(_loop_type()) is uvloop.Loop
    finally:
        thread.stop()
