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

import enum
from collections.abc import Sequence

import grpc

from quorumstore.proto import oxia_client_pb2_grpc

ROUTING_METADATA_KEY = "qs-routing"
FORWARDED_METADATA_KEY = "qs-forwarded"
_GATEWAY_USER_AGENT_PREFIX = "grpc-python"


class Routing(enum.Enum):
    LEADER = "leader"
    GATEWAY = "gateway"


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


def relay_metadata(carried: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Metadata of a relayed call: the mark that it was relayed, and what the call
    carries on to the leader (a write's exactly-once client id and serial)."""
    return [(FORWARDED_METADATA_KEY, "1"), *carried]


#: Relayed messages may be as large as the client's; a leader that was down is retried
#: soon after it is back (gRPC's default backoff grows to two minutes, which would
#: outlast a restarted node's return to leadership).
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Relays:
    """One channel per leader address, reused by every relayed call."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> oxia_client_pb2_grpc.OxiaClientStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
            self._channels[address] = channel
        return oxia_client_pb2_grpc.OxiaClientStub(channel)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()
