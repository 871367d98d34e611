"""Which gRPC failures are worth retrying, and how long to wait between attempts.

A shard's leader can change under a running client (a node dies, the coordinator
moves leadership). Requests then fail in one of two transient ways, which the
client retries with backoff until the operation's deadline:

- not leader: the node is up but no longer leads the shard. quorumstore sends Oxia's
  status 106 with the new leader, if known, in a `leader-hint` trailing metadata
  entry. grpcio reports statuses above 16 as UNKNOWN, so the message is what tells
  it apart from other UNKNOWN failures.
- unavailable: the node is down or unreachable (UNAVAILABLE), or the attempt ran
  out of time (DEADLINE_EXCEEDED).

The data service (`proto/quorumstore_data.proto`) says "not leader" with
FAILED_PRECONDITION and the same `leader-hint` entry; it is retried the same way.

Everything else is final and becomes a typed error.
"""

from __future__ import annotations

import random
from typing import NamedTuple

import grpc

from quorumstore.client.errors import (
    InvalidRequest,
    NamespaceNotFound,
    NotSupported,
    PermissionDenied,
    QuorumStoreError,
    SessionDoesNotExist,
    Unauthenticated,
)
from quorumstore.wire.metadata import LEADER_HINT_METADATA_KEY
from quorumstore.wire.status import OxiaCode

_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class Transient(NamedTuple):
    """A failure worth retrying; `leader_hint` is the new leader when the node named one."""

    reason: str
    leader_hint: str | None


def classify(error: grpc.RpcError) -> Transient | QuorumStoreError:
    """A retriable failure, or the error to raise to the caller (of a blocking or an
    asyncio call: both carry the code, details and trailing metadata)."""
    code, details = error.code(), error.details() or ""
    if code in _TRANSIENT:
        return Transient(f"{code.name}: {details}", None)
    if code == grpc.StatusCode.FAILED_PRECONDITION or (
        code == grpc.StatusCode.UNKNOWN
        and details.startswith(OxiaCode.NODE_IS_NOT_LEADER.message_prefix)
    ):
        hint = None
        for key, value in error.trailing_metadata() or ():
            if key == LEADER_HINT_METADATA_KEY:
                hint = value if isinstance(value, str) else value.decode()
        return Transient(details, hint)
    if code == grpc.StatusCode.UNKNOWN and details.startswith(
        OxiaCode.NAMESPACE_NOT_FOUND.message_prefix
    ):
        return NamespaceNotFound(details)
    if code == grpc.StatusCode.UNKNOWN and details.startswith(
        OxiaCode.SESSION_NOT_FOUND.message_prefix
    ):
        return SessionDoesNotExist(None, details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(f"the server refused the request: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(f"the cluster refused the call's credentials: {details}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(details)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return NotSupported(f"the server does not support this: {details}")
    return QuorumStoreError(f"request failed with {code.name}: {details}")


class Backoff:
    """Exponential backoff with jitter: spreads the retries of many clients (the
    asyncio client's and the data service client's). Supervisors that restart
    something on their own machine wait by `quorumstore.backoff.DoublingBackoff`
    instead: no crowd to spread there, and a run that lasted starts the waits over.

    >>> b = Backoff(initial_s=0.01, max_s=0.04)
    >>> [round(b.limit, 2) for _ in range(4) if b.next_delay() >= 0]
    [0.02, 0.04, 0.04, 0.04]
    """

    def __init__(self, initial_s: float = 0.005, max_s: float = 0.5) -> None:
        self.limit = initial_s
        self._max_s = max_s

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt; the bound doubles each time."""
        delay = random.uniform(self.limit / 2, self.limit)
        self.limit = min(self.limit * 2, self._max_s)
        return delay
