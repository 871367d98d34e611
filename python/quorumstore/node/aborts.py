"""Ending a server RPC with a status, typed as never returning.

`ServicerContext.abort` always raises, but grpcio ships its type hints without a py.typed
marker, so type checkers cannot see that; code after an abort would look reachable.
"""

from __future__ import annotations

from typing import NoReturn

import grpc


async def abort(
    context: grpc.aio.ServicerContext,
    code: grpc.StatusCode,
    details: str,
    trailing_metadata: tuple[tuple[str, str], ...] = (),
) -> NoReturn:
    """Ends the RPC with `code` and `details` (`context.abort`)."""
    await context.abort(code, details, trailing_metadata)
    raise AssertionError("context.abort returned")
