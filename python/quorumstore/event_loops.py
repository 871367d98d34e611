"""The event loop every quorumstore process and private loop thread runs on.

uvloop (libuv underneath) when it is installed, which it is wherever it builds;
asyncio's own loop otherwise (uvloop has no Windows build). grpc.aio works on any
asyncio loop, and a replicated write wakes the loop a dozen times, each wake-up
cheaper on libuv (docs/performance.md has the measurement). A user's own loop, the one an `AsyncClient` runs on, stays the user's
choice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

try:
    import uvloop
except ImportError:  # a platform uvloop does not build for
    uvloop = None  # type: ignore[assignment]

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the best kind available (see the module docstring)."""
    return asyncio.new_event_loop() if uvloop is None else uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a loop from `new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


#: How long a private loop keeps running after cancelling its tasks, before it closes.
#: gRPC's poller hands each completion to the loop its call was made on, and cancelled
#: calls complete a moment after their tasks end. A completion that meets a closed loop
#: fails in whichever loop is handling gRPC's events ("RuntimeError: Event loop is
#: closed", logged with a traceback) and leaves the rest of that batch of completions,
#: live calls' included, waiting for the next one. Measured here: completions came
#: within 2 ms (within 5 ms with both cores busy); 20 ms leaves a margin.
GRPC_SETTLE_S = 0.02


async def cancel_other_tasks() -> None:
    """Cancels the running loop's other tasks, waits for them, closes its async generators
    and lets gRPC settle: a private loop's last step before it stops and closes."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()
    await asyncio.sleep(GRPC_SETTLE_S)


def abandon(future: asyncio.Future[Any] | None) -> None:
    """Drops work nobody will wait for: cancels it, or consumes its outcome if it is
    done, so asyncio does not log an exception as never retrieved. A cancelled task may
    still end with an exception of its own (a gRPC call failing while it unwinds), so
    that outcome is consumed too when it comes."""
    if future is None:
        return
    if not future.done():
        future.cancel()
        future.add_done_callback(_consume)
    elif not future.cancelled():
        future.exception()


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
