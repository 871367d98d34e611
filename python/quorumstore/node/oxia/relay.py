"""Gateway routing: a node relays a client's calls for shards it does not lead.

Oxia's routing has the client follow the shard map: requests go to each shard's
leader, and a client told "not leader" refreshes its map. The official Python client
0.2.1 cannot follow a map that changes: after its first map, its discovery thread
waits on its start-up barrier after every map it applies, so it applies one more map
and then never reads another (and `Client.close()` hangs joining that thread).
Ending the stream does not help: a re-opened stream's first map blocks the same way.

So a client can be served in gateway mode instead: its map names the node it asked,
for every shard, and never changes (the client never sees a second map), and that
node relays each call for a shard led elsewhere to the leader it knows. A leader
change is then invisible to the client, apart from calls failing while the shard has
no reachable leader, which the application retries (the official Python client never
retries a call).

The mode of a call is the `qs-routing` metadata entry ("leader" or "gateway"); without
it, clients built on grpc-python (the official Python client among them) get gateway
mode and all others Oxia's leader mode. A relayed call carries `qs-forwarded` and is
never relayed again, so nodes with stale views cannot bounce a call between them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import grpc

from quorumstore.node.oxia.errors import RequestError
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.wire.channels import RELAY_CHANNEL_OPTIONS
from quorumstore.wire.metadata import (
    CLIENT_ID_METADATA_KEY,
    FORWARDED_METADATA_KEY,
    LEADER_HINT_METADATA_KEY,
    ROUTING_METADATA_KEY,
    SERIAL_METADATA_KEY,
    ClientSerial,
    Routing,
)
from quorumstore.wire.status import OxiaCode

_GATEWAY_USER_AGENT_PREFIX = "grpc-python"


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {m.key: m.value for m in context.invocation_metadata() or ()}


def routing_of(context: grpc.aio.ServicerContext) -> Routing:
    """The routing mode the call asks for (see the module docstring); ValueError if unknown."""
    metadata = _metadata(context)
    asked = metadata.get(ROUTING_METADATA_KEY)
    if asked is not None:
        try:
            return Routing(asked)
        except ValueError:
            known = [r.value for r in Routing]
            raise ValueError(f"{ROUTING_METADATA_KEY} {asked!r} is not one of {known}") from None
    if metadata.get("user-agent", "").startswith(_GATEWAY_USER_AGENT_PREFIX):
        return Routing.GATEWAY
    return Routing.LEADER


def may_relay(context: grpc.aio.ServicerContext) -> bool:
    """Whether a call for a shard led elsewhere is relayed rather than refused."""
    return (
        FORWARDED_METADATA_KEY not in _metadata(context) and routing_of(context) is Routing.GATEWAY
    )


def _relay_metadata(carried: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Metadata of a relayed call: the mark that it was relayed, and what the call
    carries on to the leader (a write's exactly-once client id and serial)."""
    return [(FORWARDED_METADATA_KEY, "1"), *carried]


def _serial_metadata(origin: ClientSerial | None) -> list[tuple[str, str]]:
    """The exactly-once metadata of a write with `origin` (none without one)."""
    if origin is None:
        return []
    return [(CLIENT_ID_METADATA_KEY, origin.client_id), (SERIAL_METADATA_KEY, str(origin.serial))]


def _relay_error(address: str, shard: int, error: grpc.aio.AioRpcError) -> RequestError:
    """The status a relayed call failed with, as this node's answer to the client."""
    details = error.details() or ""
    hint = tuple(
        (key, value)
        for key, value in error.trailing_metadata() or ()
        if key == LEADER_HINT_METADATA_KEY and isinstance(value, str)
    )
    if details.startswith(OxiaCode.NODE_IS_NOT_LEADER.message_prefix):
        return RequestError(OxiaCode.NODE_IS_NOT_LEADER, details, hint)
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        details = f"leader {address} of shard {shard} is unreachable: {details}"
    return RequestError(error.code(), details, hint)


class Relays:
    """One channel per leader address, reused by every relayed call; a relayed call's
    failure becomes this node's `RequestError`."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> oxia_client_pb2_grpc.OxiaClientStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=RELAY_CHANNEL_OPTIONS)
            self._channels[address] = channel
        return oxia_client_pb2_grpc.OxiaClientStub(channel)

    async def unary(
        self,
        address: str,
        method: str,
        request: Any,
        shard: int,
        context: grpc.aio.ServicerContext,
        origin: ClientSerial | None = None,
    ) -> Any:
        """`method` on the leader at `address`; `origin` is a write's exactly-once serial
        (a WriteStream's request's own, not the stream's first)."""
        call = getattr(self.stub(address), method)
        try:
            return await call(
                request,
                metadata=_relay_metadata(_serial_metadata(origin)),
                timeout=context.time_remaining(),
            )
        except grpc.aio.AioRpcError as e:
            raise _relay_error(address, shard, e) from None

    async def stream(
        self, address: str, method: str, request: Any, shard: int
    ) -> AsyncGenerator[Any, None]:
        """The responses of the server-streaming `method` on the leader at `address`."""
        call = getattr(self.stub(address), method)(request, metadata=_relay_metadata())
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as e:
            raise _relay_error(address, shard, e) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()
