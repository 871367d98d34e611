"""How a client that cannot find a cluster says so: at once when it can tell, and with
the last failure's cause when it waited."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from quorumstore import AsyncClient
from quorumstore.client import QuorumStoreError, ServiceUnavailable
from quorumstore.wire.channels import SERVER_OPTIONS, listen

pytestmark = pytest.mark.integration


def test_a_grpc_server_that_is_not_a_node_fails_fast() -> None:
    async def scenario() -> float:
        server = grpc.aio.server(options=SERVER_OPTIONS)  # serves nothing: UNIMPLEMENTED
        port = listen(server, "127.0.0.1", 0)
        await server.start()
        began = time.monotonic()
        try:
            with pytest.raises(QuorumStoreError, match="answers gRPC but not Oxia's client API"):
                async with AsyncClient(f"127.0.0.1:{port}", connect_timeout_s=20):
                    pass
            return time.monotonic() - began
        finally:
            await server.stop(None)

    assert asyncio.run(scenario()) < 5


def test_nothing_listening_names_the_cause_after_the_timeout() -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario() -> None:
        with pytest.raises(ServiceUnavailable, match=r"within 3 s \(last attempt: 127\.0\.0\.1:"):
            async with AsyncClient(f"127.0.0.1:{port}", connect_timeout_s=3):
                pass

    asyncio.run(scenario())
