"""The event loop every quorumstore process and private loop thread runs on.

uvloop (libuv underneath) when it is installed, which it is wherever it builds;
asyncio's own loop otherwise (uvloop has no Windows build). grpc.aio works on any
asyncio loop, and a replicated write wakes the loop a dozen times, each wake-up
cheaper on libuv: the nodes' CPU per put fell by about a tenth (ARCHITECTURE.md,
"Servers"). A user's own loop, the one an `AsyncClient` runs on, stays the user's
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
