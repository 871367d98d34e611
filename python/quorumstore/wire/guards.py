"""Server interceptors that guard calls, and the refusal of requests that do not parse.

grpc.aio's interceptors see a call's method and metadata but not its context (peer,
abort). `guarded` wraps a method's handler so that `guard(context)`, an async context
manager, is entered before the servicer runs, in the call's own task, and exited when
the call ends: it may abort the call (a credential check), record who calls (for the
servicer, through a context variable), or count calls in flight (a limit).

gRPC parses a request before any servicer or guard runs, and answers one that does not
parse with UNKNOWN and an error logged with its traceback, so any caller could fill a
node's log. `RequestParsing` registers a parser that never fails and refuses such a
request inside the call, with INVALID_ARGUMENT.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

log = logging.getLogger(__name__)

#: Callers refused so far are logged once each; at most this many are remembered.
_LOGGED_PEERS_MAX = 1024

Guard = Callable[[grpc.aio.ServicerContext], AbstractAsyncContextManager[None]]
#: Checks one request in its call (may abort it).
RequestCheck = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]


def guarded(handler: grpc.RpcMethodHandler, guard: Guard) -> grpc.RpcMethodHandler:
    """`handler`, with every call run inside `guard(context)`."""
    return _wrapped(handler, guard, handler.request_deserializer, None)


class GuardInterceptor(grpc.aio.ServerInterceptor, abc.ABC):
    """An interceptor that runs each call inside the guard `guard_for` picks from the
    call's method and metadata (None: the call runs as it is)."""

    @abc.abstractmethod
    def guard_for(self, details: grpc.HandlerCallDetails) -> Guard | None: ...

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        guard = None if handler is None else self.guard_for(handler_call_details)
        return handler if guard is None else guarded(handler, guard)


def metadata_value(details: grpc.HandlerCallDetails, key: str) -> str | bytes | None:
    """The last value of `key` in a call's invocation metadata."""
    value = None
    for name, given in details.invocation_metadata or ():
        if name == key:
            value = given
    return value


class RefusalLog:
    """Logs a refused caller's first refusal only, by host, remembering at most
    `_LOGGED_PEERS_MAX` of them: a caller that keeps retrying cannot fill the log."""

    def __init__(self, server_name: Callable[[], str]) -> None:
        self._server_name = server_name
        self._logged: set[str] = set()

    def note(self, peer: str, method: str, reason: str) -> None:
        host = peer.rpartition(":")[0] or peer
        if host in self._logged or len(self._logged) >= _LOGGED_PEERS_MAX:
            return
        self._logged.add(host)
        log.warning(
            "%s: refused %s from %s: %s (further refusals of this caller are not logged)",
            self._server_name(),
            method,
            host,
            reason,
        )


class RequestParsing(grpc.aio.ServerInterceptor):
    """Answers a request that does not parse with INVALID_ARGUMENT (see the module
    docstring). It goes last among a server's interceptors: the credential checks wrap
    it and run first, and `guarded` hands its parser on to gRPC."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return _wrapped(
            handler, _unguarded, _lenient(handler.request_deserializer), _refuse_unparseable
        )


class _Unparseable:
    """What a request that does not parse is handed on as, to be refused in the call."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return data if deserialize is None else deserialize(data)
        except Exception as e:  # noqa: BLE001 - any parse failure is the caller's bad request
            return _Unparseable(e)

    return parse


async def _refuse_unparseable(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, _Unparseable):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request is not a well-formed message of this method ({request.error})",
        )


def _unguarded(context: grpc.aio.ServicerContext) -> AbstractAsyncContextManager[None]:
    return contextlib.nullcontext()


def _wrapped(
    handler: grpc.RpcMethodHandler,
    guard: Guard,
    deserialize: Callable[[bytes], Any] | None,
    check: RequestCheck | None,
) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s shape: its requests parsed by `deserialize` and each
    passed through `check`, every call run inside `guard(context)`."""
    serialize = handler.response_serializer

    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if check is not None:
            await check(request, context)
        return request

    async def checked_stream(
        requests: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for request in requests:
            yield await checked(request, context)

    def requests_of(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return requests if check is None else checked_stream(requests, context)

    if handler.request_streaming and handler.response_streaming:
        inner_ss = handler.stream_stream

        async def stream_stream(
            requests: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async with guard(context):
                async for response in inner_ss(requests_of(requests, context), context):
                    yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, deserialize, serialize)
    if handler.request_streaming:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async with guard(context):
                return await inner_su(requests_of(requests, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, deserialize, serialize)
    if handler.response_streaming:
        inner_us = handler.unary_stream

        async def unary_stream(
            request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async with guard(context):
                async for response in inner_us(await checked(request, context), context):
                    yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, deserialize, serialize)
    inner_uu = handler.unary_unary

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with guard(context):
            return await inner_uu(await checked(request, context), context)

    return grpc.unary_unary_rpc_method_handler(unary_unary, deserialize, serialize)
