"""The Oxia client protocol (`io.streamnative.oxia.proto.OxiaClient`) served over a node's shards.

The servicer is thin: for each call it finds the shard's leader here (`routing.py`),
checks the request (`validation.py`), relays it in gateway mode (`relay.py`) and hands
it to the module of its job: writes (`writes.py`, `write_streams.py`), reads
(`reads.py`), sessions (`sessions.py`), streams of changes (`streams.py`). Where the
Oxia semantics live (versions, conditional ops, hierarchical order) is the storage
layer; Oxia's error behaviour is in `errors.py`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from typing import Any, TypeVar

import grpc

from quorumstore.node.limits import RequestLimits, client_of
from quorumstore.node.oxia.errors import RequestError, invalid
from quorumstore.node.oxia.reads import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_RESPONSE_ITEMS,
    Reads,
)
from quorumstore.node.oxia.relay import DEFAULT_RELAY_TIMEOUT_MS, LeaderHere, Relays
from quorumstore.node.oxia.routing import Router, ShardDirectory, ShardHostApi
from quorumstore.node.oxia.sessions import DEFAULT_SESSION_CHECK_INTERVAL_S, Sessions, monotonic_ms
from quorumstore.node.oxia.streams import DEFAULT_STREAM_RECHECK_INTERVAL_S, ChangeStreams
from quorumstore.node.oxia.validation import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    Validator,
    origin,
)
from quorumstore.node.oxia.write_streams import DEFAULT_MAX_INFLIGHT_STREAM_WRITES, write_stream
from quorumstore.node.oxia.writes import Writes
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.wire.metadata import DEFAULT_NAMESPACE
from quorumstore.wire.tls import TlsConfig

_T = TypeVar("_T")


class OxiaClientServicer(oxia_client_pb2_grpc.OxiaClientServicer):
    """Serves the Oxia client protocol for the shards of one node.

    Create it on the event loop that serves it: it starts the task that expires
    sessions there (`close()` stops it).
    """

    def __init__(
        self,
        directory: ShardDirectory,
        *,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_response_items: int = DEFAULT_MAX_RESPONSE_ITEMS,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_inflight_stream_writes: int = DEFAULT_MAX_INFLIGHT_STREAM_WRITES,
        session_check_interval_s: float = DEFAULT_SESSION_CHECK_INTERVAL_S,
        stream_recheck_interval_s: float = DEFAULT_STREAM_RECHECK_INTERVAL_S,
        session_clock_ms: Callable[[], int] = monotonic_ms,
        relay_timeout_s: float = DEFAULT_RELAY_TIMEOUT_MS / 1000,
        relay_tls: TlsConfig | None = None,
        request_limits: RequestLimits = RequestLimits(),
    ) -> None:
        limits = {
            "max_key_bytes": max_key_bytes,
            "max_value_bytes": max_value_bytes,
            "max_response_items": max_response_items,
            "max_response_bytes": max_response_bytes,
            "max_inflight_stream_writes": max_inflight_stream_writes,
            "session_check_interval_s": session_check_interval_s,
            "stream_recheck_interval_s": stream_recheck_interval_s,
        }
        for name, value in limits.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self._max_inflight_stream_writes = max_inflight_stream_writes
        self._router = Router(directory)
        self._relays = Relays(self._router, relay_timeout_s, relay_tls)
        self._validator = Validator(max_key_bytes, max_value_bytes)
        self._request_limits = request_limits
        self._writes = Writes(self._router, self._relays, self._validator, request_limits)
        self._reads = Reads(max_response_items, max_response_bytes)
        self._sessions = Sessions(
            self._router, session_clock_ms, session_check_interval_s, request_limits
        )
        self._streams = ChangeStreams(self._router, stream_recheck_interval_s)

    async def close(self) -> None:
        """Stops expiring sessions and closes the channels of relayed calls."""
        self._sessions.close()
        await self._relays.close()

    async def _unary(
        self, answer: Callable[[], Awaitable[_T]], context: grpc.aio.ServicerContext
    ) -> _T:
        """A unary call's answer; answered again (here, as it routes now) when its relay
        finds that this node has come to lead the shard."""
        while True:
            try:
                return await answer()
            except LeaderHere:
                continue
            except RequestError as e:
                await e.abort(context)

    async def _streamed(
        self,
        method: str,
        request: Any,
        shard: int | None,
        context: grpc.aio.ServicerContext,
        check: Callable[[], None],
        answer: Callable[[ShardHostApi], AsyncGenerator[_T, None] | Iterator[_T]],
    ) -> AsyncGenerator[_T, None]:
        """A server-streaming call: routed, checked, then relayed to the leader in gateway
        mode or answered here by `answer` from the shard's leader replica (also when its
        relay finds that this node has come to lead the shard)."""
        try:
            target = self._router.route(shard, context)
            check()
            while isinstance(target, str):
                relayed = self._relays.stream(target, method, request, request.shard)
                try:
                    async with aclosing(relayed):
                        async for response in relayed:
                            yield response
                    return
                except LeaderHere:
                    target = self._router.route(shard, context)
            answers = answer(target)
            if isinstance(answers, Iterator):
                for response in answers:
                    yield response
                return
            async with aclosing(answers):
                async for response in answers:
                    yield response
        except RequestError as e:
            await e.abort(context)

    # ------------------------------------------------------------ routing

    async def GetShardAssignments(
        self, request: pb.ShardAssignmentsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ShardAssignments]:
        try:
            updates = self._router.assignments(request.namespace or DEFAULT_NAMESPACE, context)
            async with aclosing(updates):
                async for message in updates:
                    yield message
        except RequestError as e:
            await e.abort(context)

    # -------------------------------------------------------------- writes

    async def Write(
        self, request: pb.WriteRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteResponse:
        return await self._unary(
            lambda: self._writes.write(request, context, origin(context)), context
        )

    async def WriteStream(
        self, request_iterator: AsyncIterator[pb.WriteRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WriteResponse]:
        responses = write_stream(
            self._writes, request_iterator, context, self._max_inflight_stream_writes
        )
        async with aclosing(responses):
            async for response in responses:
                yield response

    # --------------------------------------------------------------- reads

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadResponse]:
        def check() -> None:
            self._request_limits.check_ops(len(request.gets))
            self._validator.check_gets(request.gets)

        responses = self._streamed(
            "Read",
            request,
            request.shard if request.HasField("shard") else None,
            context,
            check,
            lambda host: self._reads.read(host, request.shard, request.gets),
        )
        async with aclosing(responses):
            async for response in responses:
                yield response

    async def List(
        self, request: pb.ListRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListResponse]:
        responses = self._streamed(
            "List",
            request,
            request.shard if request.HasField("shard") else None,
            context,
            lambda: self._validator.check_scan(request),
            lambda host: self._reads.list(host, request),
        )
        async with aclosing(responses):
            async for response in responses:
                yield response

    async def RangeScan(
        self, request: pb.RangeScanRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RangeScanResponse]:
        responses = self._streamed(
            "RangeScan",
            request,
            request.shard if request.HasField("shard") else None,
            context,
            lambda: self._validator.check_scan(request),
            lambda host: self._reads.range_scan(host, request),
        )
        async with aclosing(responses):
            async for response in responses:
                yield response

    # ------------------------------------------------------------ sessions

    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateSessionResponse:
        async def answer() -> pb.CreateSessionResponse:
            target = self._router.route(request.shard, context)
            self._validator.check_create_session(request)
            if isinstance(target, str):
                return await self._relays.unary(
                    target, "CreateSession", request, request.shard, context
                )
            return await self._sessions.create(target, request, client_of(context))

        return await self._unary(answer, context)

    async def KeepAlive(
        self, request: pb.SessionHeartbeat, context: grpc.aio.ServicerContext
    ) -> pb.KeepAliveResponse:
        async def answer() -> pb.KeepAliveResponse:
            target = self._router.route(request.shard, context)
            if isinstance(target, str):
                return await self._relays.unary(
                    target, "KeepAlive", request, request.shard, context
                )
            return self._sessions.keep_alive(target, request)

        return await self._unary(answer, context)

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseSessionResponse:
        async def answer() -> pb.CloseSessionResponse:
            target = self._router.route(request.shard, context)
            if isinstance(target, str):
                return await self._relays.unary(
                    target, "CloseSession", request, request.shard, context
                )
            return await self._sessions.close_session(target, request)

        return await self._unary(answer, context)

    # --------------------------------------------------- streams of changes

    async def GetSequenceUpdates(
        self, request: pb.GetSequenceUpdatesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetSequenceUpdatesResponse]:
        """Sequence updates (`streams.py`); the stream ends with a not-leader error when
        this node stops leading the shard."""
        responses = self._streamed(
            "GetSequenceUpdates",
            request,
            request.shard,
            context,
            lambda: self._validator.check_key(request.key, "key"),
            lambda _: self._streams.sequence_updates(request),
        )
        async with aclosing(responses):
            async for response in responses:
                yield response

    async def GetNotifications(
        self, request: pb.NotificationsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.NotificationBatch]:
        start = (
            request.start_offset_exclusive if request.HasField("start_offset_exclusive") else None
        )

        def check() -> None:
            if start is not None and start < -1:
                raise invalid(f"start_offset_exclusive is {start}; offsets start at -1")

        responses = self._streamed(
            "GetNotifications",
            request,
            request.shard,
            context,
            check,
            lambda host: self._streams.notifications(host, request.shard, start),
        )
        async with aclosing(responses):
            async for response in responses:
                yield response
