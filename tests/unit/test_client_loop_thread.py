"""quorumstore.client.loop_thread: hand-offs from caller threads to the client's loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from quorumstore.client.errors import ClientClosed
from quorumstore.client.loop_thread import LoopThread


@pytest.fixture
def runner() -> Iterator[LoopThread]:
    runner = LoopThread("test-loop")
    yield runner
    if not runner.stopped:
        runner.stop()


def test_submit_returns_the_futures_result_to_every_calling_thread(runner: LoopThread) -> None:
    def start(x: int) -> asyncio.Future[int]:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.001, future.set_result, x * x)
        return future

    results: dict[int, int] = {}

    def caller(i: int) -> None:
        for j in range(50):
            results[i * 1000 + j] = runner.submit(start, i * 1000 + j)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 16 * 50
    assert results == {k: k * k for k in results}


def test_errors_reach_the_caller_whether_raised_by_start_or_by_the_future(
    runner: LoopThread,
) -> None:
    def refuse() -> asyncio.Future[None]:
        raise ValueError("bad argument")

    def fail_later() -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(KeyError("gone"))
        return future

    def cancelled() -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        return future

    with pytest.raises(ValueError, match="bad argument"):
        runner.submit(refuse)
    with pytest.raises(KeyError, match="gone"):
        runner.submit(fail_later)
    with pytest.raises(ClientClosed, match="cancelled"):
        runner.submit(cancelled)


def test_a_call_from_the_loop_thread_is_refused_instead_of_deadlocking(runner: LoopThread) -> None:
    async def nested() -> str:
        try:
            runner.call(asyncio.sleep(0))
        except RuntimeError as e:
            return str(e)
        return "no error"

    assert "would deadlock" in runner.call(nested())


def test_calls_after_stop_raise_client_closed(runner: LoopThread) -> None:
    runner.stop()
    with pytest.raises(ClientClosed):
        runner.submit(lambda: asyncio.get_running_loop().create_future())
    with pytest.raises(ClientClosed):
        runner.call(asyncio.sleep(0))
