"""How the commands that run a server in this process (`standalone`, `node`,
`coordinator`) wait: until SIGINT or SIGTERM, or until the server fails."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable


async def wait_for_signal() -> None:
    """Returns on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve_until_signal(failure: Awaitable[None]) -> None:
    """Returns on SIGINT or SIGTERM; raises what `failure` raises if it ends first (a
    node's ReplicaFailure, a coordinator that another one deposed)."""
    signalled = asyncio.ensure_future(wait_for_signal())
    failed = asyncio.ensure_future(failure)
    done, pending = await asyncio.wait([signalled, failed], return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if failed in done:
        failed.result()
