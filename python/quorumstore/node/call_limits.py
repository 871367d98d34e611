"""The client port's interceptor of limits: calls in progress per connection, long-lived
streams per client, and the refusal of any call a servicer found past a limit.

A call counts from its start until it ends, a stream for as long as it stays open, so
a connection cannot hold more than `max_calls_per_connection` calls at once (one HTTP/2
connection is one `context.peer()`). The streams that stay open for as long as their
client wants and are fed with every change of their shard (`LONG_LIVED_STREAMS`)
count, besides, against their client's `max_streams_per_client`. Scans and change
reads of the data service end once their rows are sent, and a `WriteStream` is driven
by its client's requests: those count as calls only.

Servicers raise `LimitExceeded` for the limits they count (ops per request, sessions,
staged bytes); this interceptor ends such a call with RESOURCE_EXHAUSTED and logs
the refusal (once a minute per limit, as a client past a limit tends to retry).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc

from quorumstore.node.limits import LimitExceeded, RequestLimits, Tally, client_of
from quorumstore.wire.guards import Guard, GuardInterceptor

log = logging.getLogger(__name__)

#: Counted per client, besides per connection (see the module docstring).
LONG_LIVED_STREAMS = frozenset(
    f"/io.streamnative.oxia.proto.OxiaClient/{name}"
    for name in ("GetShardAssignments", "GetNotifications", "GetSequenceUpdates")
)
#: Refusals of one limit are logged at most once in this long.
_LOG_INTERVAL_S = 60.0


class CallLimits(GuardInterceptor):
    """Counts the calls of the client port and refuses those past a limit (see the
    module docstring)."""

    def __init__(self, limits: RequestLimits, server_name: Callable[[], str]) -> None:
        self._server_name = server_name
        self._calls = Tally(
            limits,
            "max_calls_per_connection",
            lambda peer, held: (
                f"connection {peer} would have {held} calls in progress with this one"
            ),
        )
        self._streams = Tally(
            limits,
            "max_streams_per_client",
            lambda client, held: (
                f"client {client} would have {held} notification, shard "
                "assignment and sequence update streams open on this node with this one"
            ),
        )
        self._logged_at: dict[str, float] = {}

    def guard_for(self, details: grpc.HandlerCallDetails) -> Guard:
        return lambda context: self._limit(details.method, context)

    @asynccontextmanager
    async def _limit(self, method: str, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        try:
            with contextlib.ExitStack() as held:
                held.enter_context(self._calls.holding(context.peer()))
                if method in LONG_LIVED_STREAMS:
                    held.enter_context(self._streams.holding(client_of(context)))
                yield
        except LimitExceeded as e:
            self._note(method, context, e)
            await e.abort(context)

    def _note(self, method: str, context: grpc.aio.ServicerContext, refusal: LimitExceeded) -> None:
        now = time.monotonic()
        if now - self._logged_at.get(refusal.limit, -_LOG_INTERVAL_S) < _LOG_INTERVAL_S:
            return
        self._logged_at[refusal.limit] = now
        log.warning(
            "%s: refused %s from %s: %s (further refusals past %s are not logged for %g s)",
            self._server_name(),
            method,
            context.peer(),
            refusal.message,
            refusal.limit,
            _LOG_INTERVAL_S,
        )
