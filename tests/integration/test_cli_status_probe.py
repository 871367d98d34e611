"""`quorumstore status` pointed at a gRPC server that is no coordinator: one line on stderr,
exit 2."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from quorumstore import cli
from quorumstore.wire.channels import SERVER_OPTIONS, listen

pytestmark = pytest.mark.integration


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("quorumstore: error: ") and err.count("\n") == 1, err
    return err


def test_status_pointed_at_something_else_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> str:
        server = grpc.aio.server(options=SERVER_OPTIONS)  # no status service: UNIMPLEMENTED
        port = listen(server, "127.0.0.1", 0)
        await server.start()
        try:
            return await asyncio.to_thread(
                _fails, ["status", "--coordinator", f"127.0.0.1:{port}"], capsys
            )
        finally:
            await server.stop(None)

    assert "is no coordinator's status port" in asyncio.run(scenario())
