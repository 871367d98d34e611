"""How the Oxia service refuses a request: a status code, a message, trailing metadata.

Error statuses follow Oxia's server (oxia-db/oxia `common/constant`), because that is
what the official clients react to:

- a shard this node does not lead: Oxia's code 106 (`CodeNodeIsNotLeader`), which the
  Go client's `isRetriable` treats as "refresh assignments and retry on the new leader";
  the message names the shard, and a known leader is added to the message and to the
  `leader-hint` trailing metadata entry;
- an unknown namespace in `GetShardAssignments`: Oxia's code 110
  (`CodeNamespaceNotFound`), with the namespaces that do exist in the message;
- `KeepAlive` or `CloseSession` of a session the shard does not have: Oxia's code 108
  (`CodeSessionNotFound`); a session timeout outside [2 s, 5 min]: Oxia's code 109
  (`CodeInvalidSessionTimeout`); a put naming such a session: the put's status
  SESSION_DOES_NOT_EXIST, as in Oxia;
- malformed requests (empty or oversized keys, oversized values, inverted ranges,
  unknown shards, malformed sequence-key puts, bad exactly-once metadata):
  INVALID_ARGUMENT, before anything of the request is written;
- notifications asked from an offset whose changes are past their retention:
  OUT_OF_RANGE (Oxia would silently skip them).

Codes 106 to 110 are outside gRPC's 0-16. grpc.aio takes a status code as
`code.value[0]`, exactly as for `grpc.StatusCode` members, and puts the number on the
wire unchanged: Go and Java clients see 106-110, while C-core based clients (Python's
grpcio, hence the `oxia` package) can only report them as UNKNOWN, with our message.
"""

from __future__ import annotations

from typing import NoReturn

import grpc

from quorumstore.node.aborts import abort
from quorumstore.wire.metadata import leader_hint_metadata
from quorumstore.wire.status import OxiaCode, not_leader_message


class RequestError(Exception):
    """A refused request, with the gRPC status it is refused with.

    Raised by the validation and routing helpers, which know nothing of the RPC,
    and turned into the RPC's status by `abort`.
    """

    def __init__(
        self,
        code: grpc.StatusCode | OxiaCode,
        message: str,
        trailing_metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailing_metadata = trailing_metadata

    async def abort(self, context: grpc.aio.ServicerContext) -> NoReturn:
        await abort(context, self.code, self.message, self.trailing_metadata)


def invalid(message: str) -> RequestError:
    """A malformed request: INVALID_ARGUMENT."""
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_leader(shard: int, leader_hint: str | None) -> RequestError:
    """A call for a shard this node does not lead, naming its leader when known."""
    return RequestError(
        OxiaCode.NODE_IS_NOT_LEADER,
        not_leader_message(shard, leader_hint),
        leader_hint_metadata(leader_hint),
    )


def session_not_found(shard: int, session_id: int) -> RequestError:
    return RequestError(
        OxiaCode.SESSION_NOT_FOUND,
        f"{OxiaCode.SESSION_NOT_FOUND.message_prefix}: {session_id} on shard {shard}",
    )
