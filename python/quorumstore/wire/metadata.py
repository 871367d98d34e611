"""gRPC metadata keys and the names every client and server share."""

from __future__ import annotations

import enum
from typing import NamedTuple

#: Namespace of a request that names none (as in Oxia).
DEFAULT_NAMESPACE = "default"

#: Invocation metadata of an exactly-once write: the client's id and the write's serial.
#: On a `WriteStream`, the serial is the first request's; each later request has the next.
CLIENT_ID_METADATA_KEY = "qs-client-id"
SERIAL_METADATA_KEY = "qs-serial"
#: Longest client id of an exactly-once write, in UTF-8 bytes.
MAX_CLIENT_ID_BYTES = 256


class ClientSerial(NamedTuple):
    """Identifies one logical write of one client: retries carry the same pair."""

    client_id: str
    serial: int


#: Invocation metadata of a call's credentials: `Bearer <token>`, as in Oxia.
AUTHORIZATION_METADATA_KEY = "authorization"
BEARER_PREFIX = "Bearer "


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata that presents `token`."""
    return ((AUTHORIZATION_METADATA_KEY, f"{BEARER_PREFIX}{token}"),)


#: Trailing metadata of a not-leader error that names the shard's current leader.
LEADER_HINT_METADATA_KEY = "leader-hint"

#: The routing mode a call asks for (see `Routing`).
ROUTING_METADATA_KEY = "qs-routing"
#: Marks a call one node relayed to another; it is never relayed again.
FORWARDED_METADATA_KEY = "qs-forwarded"


class Routing(enum.Enum):
    """How a node serves a call for a shard it does not lead.

    LEADER: Oxia's routing; the client follows the shard map and is told "not leader".
    GATEWAY: the node relays the call to the leader it knows.
    """

    LEADER = "leader"
    GATEWAY = "gateway"


#: Metadata with which a client asks for Oxia's leader routing.
LEADER_ROUTING_METADATA = ((ROUTING_METADATA_KEY, Routing.LEADER.value),)


def leader_hint_metadata(leader_hint: str | None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of a not-leader error: the leader's address, when known."""
    return ((LEADER_HINT_METADATA_KEY, leader_hint),) if leader_hint else ()
