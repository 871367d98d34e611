"""Write batches sent on one long-lived Oxia `WriteStream` per shard and lane.

A unary `Write` pays a gRPC call's setup on both ends for every batch; a message on an
open stream does not, so replicated writes are answered sooner. A lane carries one batch at a time (`batcher.py`), so its stream holds at most
one request, and the answer read next is that request's.

Exactly-once: a stream opened with `qs-client-id` and `qs-serial` metadata gives its
first request that serial and each later one the next (quorumstore's extension to
`WriteStream`, docs/oxia-compatibility.md). A lane's serials count up by one
(`writes.WriteSender`), so its stream serves them in turn; a batch whose serial is not
the stream's next one (a retry after a failure, a batch after a `put_many` took a
serial) goes on a new stream that starts at it. Any failure drops the stream: its
next answer could be out of step with the next request.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import grpc

from quorumstore.client.discovery import Channels
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.wire.metadata import (
    CLIENT_ID_METADATA_KEY,
    LEADER_ROUTING_METADATA,
    SERIAL_METADATA_KEY,
)


class _LaneStream(NamedTuple):
    leader: str
    call: grpc.aio.StreamStreamCall
    #: The serial the stream gives its next request (None: no exactly-once).
    next_serial: int | None


class WriteStreams:
    """The open write streams of one client, by (shard, lane)."""

    def __init__(self, channels: Channels) -> None:
        self._channels = channels
        self._open: dict[tuple[int, int], _LaneStream] = {}

    async def write(
        self,
        shard: int,
        lane: int,
        leader: str,
        request: pb.WriteRequest,
        origin: tuple[str, int] | None,
        timeout_s: float,
    ) -> pb.WriteResponse:
        """`request` on the lane's stream to `leader`, with exactly-once `origin` (client
        id, serial) if given; raises the stream's AioRpcError like a unary call would."""
        key = (shard, lane)
        serial = None if origin is None else origin[1]
        stream = self._open.get(key)
        if stream is None or stream.leader != leader or stream.next_serial != serial:
            self._drop(key)
            metadata: tuple[tuple[str, str], ...] = LEADER_ROUTING_METADATA
            if origin is not None:
                metadata += (
                    (CLIENT_ID_METADATA_KEY, origin[0]),
                    (SERIAL_METADATA_KEY, str(serial)),
                )
            call = self._channels.stub(leader).WriteStream(metadata=metadata)
            stream = self._open[key] = _LaneStream(leader, call, serial)
        try:
            response = await asyncio.wait_for(_exchange(stream.call, request), timeout_s)
        except TimeoutError:
            self._drop(key)
            # What a unary call's deadline raises, so that it is retried the same way.
            raise _rpc_error(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no answer on the write stream to {leader} within {timeout_s:g} s",
            ) from None
        except BaseException:
            self._drop(key)
            raise
        self._open[key] = stream._replace(next_serial=None if serial is None else serial + 1)
        return response

    def _drop(self, key: tuple[int, int]) -> None:
        stream = self._open.pop(key, None)
        if stream is not None:
            stream.call.cancel()

    def close(self) -> None:
        for key in list(self._open):
            self._drop(key)


async def _exchange(call: grpc.aio.StreamStreamCall, request: pb.WriteRequest) -> pb.WriteResponse:
    await call.write(request)
    response = await call.read()
    if response is grpc.aio.EOF:  # the server ends a stream only with an error status
        raise _rpc_error(
            grpc.StatusCode.UNAVAILABLE, "the server ended the write stream without answering"
        )
    return response


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)
