"""Binding servers: bind errors that say why."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from quorumstore.wire.channels import SERVER_OPTIONS, listen

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.0.0.1", "Address already in use"),  # the first server's port
        ("198.51.100.7", "Cannot assign requested address"),  # TEST-NET-2: not ours
    ],
)
def test_a_failed_bind_is_an_os_error_saying_why(host: str, why: str) -> None:
    async def bind_twice() -> None:
        first, second = (grpc.aio.server(options=SERVER_OPTIONS) for _ in range(2))
        port = listen(first, "127.0.0.1", 0)
        try:
            with pytest.raises(OSError, match=rf"^cannot listen on {host}:{port}: {why}$"):
                listen(second, host, port)
        finally:
            await first.stop(None)
            await second.stop(None)

    asyncio.run(bind_twice())
