"""How the data service refuses a request: a gRPC status, a message, a leader hint."""

from __future__ import annotations

from typing import NoReturn

import grpc

from quorumstore.node.aborts import abort
from quorumstore.wire.metadata import leader_hint_metadata


class Refused(Exception):
    """A request refused with a gRPC status; `abort` turns it into the RPC's status."""

    def __init__(self, code: grpc.StatusCode, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.leader = leader

    async def abort(self, context: grpc.aio.ServicerContext) -> NoReturn:
        await abort(context, self.code, self.message, leader_hint_metadata(self.leader))


def invalid(message: str) -> Refused:
    """A malformed request: INVALID_ARGUMENT."""
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)
