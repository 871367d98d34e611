"""Oxia's `WriteStream`: many writes on one stream, started as they arrive, answered in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import grpc

from quorumstore.event_loops import abandon
from quorumstore.node.oxia.errors import RequestError
from quorumstore.node.oxia.validation import next_serial, origin
from quorumstore.node.oxia.writes import Writes
from quorumstore.proto import oxia_client_pb2 as pb

#: Writes of one WriteStream that may be replicating at once before reading pauses.
DEFAULT_MAX_INFLIGHT_STREAM_WRITES = 256


async def write_stream(
    writes: Writes,
    request_iterator: AsyncIterator[pb.WriteRequest],
    context: grpc.aio.ServicerContext,
    max_inflight: int,
) -> AsyncGenerator[pb.WriteResponse, None]:
    """Each request is one write, started as soon as it arrives; answers keep order.

    A refused request ends the stream with its status once the answers before it
    are sent; writes after it that had already started are abandoned, not undone
    (as when a connection drops). With exactly-once metadata, `qs-serial` is the
    serial of the stream's first request and each later one carries the next.
    """
    try:
        first = origin(context)
    except RequestError as e:
        await e.abort(context)
    pending: asyncio.Queue[asyncio.Future[pb.WriteResponse] | None] = asyncio.Queue()
    inflight = asyncio.Semaphore(max_inflight)

    async def start_writes() -> None:
        previous: asyncio.Future[pb.WriteResponse] | None = None
        serial = first
        try:
            async for request in request_iterator:
                await inflight.acquire()
                previous = asyncio.ensure_future(writes.write(request, context, serial, previous))
                pending.put_nowait(previous)
                if serial is not None:
                    serial = next_serial(serial)
        finally:
            pending.put_nowait(None)

    starter = asyncio.create_task(start_writes())
    try:
        while (write := await pending.get()) is not None:
            response = await write
            inflight.release()
            yield response
        await starter  # surfaces a failure to read the request stream
    except RequestError as e:
        await e.abort(context)
    finally:
        starter.cancel()
        while not pending.empty():
            abandon(pending.get_nowait())
