"""Server interceptors that guard calls: one wrapper for the four shapes of gRPC method.

grpc.aio's interceptors see a call's method and metadata but not its context (peer,
abort). `guarded` wraps a method's handler so that `guard(context)`, an async context
manager, is entered before the servicer runs, in the call's own task, and exited when
the call ends: it may abort the call (a credential check), record who calls (for the
servicer, through a context variable), or count calls in flight (a limit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

Guard = Callable[[grpc.aio.ServicerContext], AbstractAsyncContextManager[None]]


def guarded(handler: grpc.RpcMethodHandler, guard: Guard) -> grpc.RpcMethodHandler:
    """`handler`, with every call run inside `guard(context)`."""
    deserialize, serialize = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        inner_ss = handler.stream_stream

        async def stream_stream(
            requests: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async with guard(context):
                async for response in inner_ss(requests, context):
                    yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, deserialize, serialize)
    if handler.request_streaming:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async with guard(context):
                return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, deserialize, serialize)
    if handler.response_streaming:
        inner_us = handler.unary_stream

        async def unary_stream(
            request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async with guard(context):
                async for response in inner_us(request, context):
                    yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, deserialize, serialize)
    inner_uu = handler.unary_unary

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with guard(context):
            return await inner_uu(request, context)

    return grpc.unary_unary_rpc_method_handler(unary_unary, deserialize, serialize)
