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
retries a call, and sets no deadline).

A relayed call therefore follows leadership itself rather than wait on a leader that
may never answer (paused, cut off): it is abandoned once this node sees another
leader for the shard, or once the leader has not answered within the relay timeout.
What happens next depends on whether repeating it is safe:

- reads, `KeepAlive` and writes with exactly-once metadata (`qs-client-id`,
  `qs-serial`) are retried at the new leader (or answered here, `LeaderHere`), which
  answers a write it already applied from its serials; so are they after the leader
  refused them as not leader or could not be reached;
- any other write (`Write` without that metadata, `CreateSession`, `CloseSession`)
  may have reached the old leader, so it fails with UNAVAILABLE and a message saying
  its outcome is unknown, as a write of a deposed leader fails with "not leader";
- a stream that has answered (a long scan, notifications, sequence updates) ends
  with UNAVAILABLE, so the client opens it again.

Relay channels send keepalive pings (`wire/channels.py`), so a dead or paused leader
also fails its pending calls within a couple of seconds.

The mode of a call is the `qs-routing` metadata entry ("leader" or "gateway"); without
it, clients built on grpc-python (the official Python client among them) get gateway
mode and all others Oxia's leader mode. A relayed call carries `qs-forwarded` and is
never relayed again, so nodes with stale views cannot bounce a call between them.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncGenerator, Awaitable, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from quorumstore.event_loops import abandon
from quorumstore.node.auth.access import relayed_credentials
from quorumstore.node.oxia.errors import RequestError, not_leader
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
from quorumstore.wire.tls import TlsConfig, open_aio_channel

_GATEWAY_USER_AGENT_PREFIX = "grpc-python"

#: How long a relayed call waits for the leader's answer (each message of a scan), and
#: for a new leader once the old one is gone: the coordinator's default failure timeout
#: (500 ms) plus time to elect a leader and tell the nodes.
DEFAULT_RELAY_TIMEOUT_MS = 1500
#: The address to relay to while this node knows no leader of the shard: the relay
#: first waits, up to the relay timeout, for one to be known.
UNKNOWN_LEADER = ""
#: Unary calls that may be repeated without harm (besides exactly-once writes).
_IDEMPOTENT = frozenset({"KeepAlive"})
#: Streams that may rightly stay silent for long: no timeout between their messages.
_LONG_LIVED = frozenset({"GetNotifications", "GetSequenceUpdates"})

_T = TypeVar("_T")


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
    carries on to the leader (the caller's credentials, a write's exactly-once client id
    and serial)."""
    return [(FORWARDED_METADATA_KEY, "1"), *relayed_credentials(), *carried]


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


def _leader_gone(error: RequestError) -> bool:
    """Whether a relayed call's failure says the shard's leader is elsewhere or down."""
    return error.code in (grpc.StatusCode.UNAVAILABLE, OxiaCode.NODE_IS_NOT_LEADER)


class LeaderHere(RequestError):
    """A retriable relayed call whose shard this node now leads: the caller answers it
    here. Where it cannot (a write stream), it ends the call with UNAVAILABLE."""

    def __init__(self, shard: int) -> None:
        super().__init__(
            grpc.StatusCode.UNAVAILABLE,
            f"the leadership of shard {shard} moved to this node while the call was relayed; "
            "retry it",
        )


class Leaders(Protocol):
    """This node's view of shard leadership (`routing.Router`)."""

    @property
    def address(self) -> str:
        """This node's client address: the leader's when it leads the shard."""
        ...

    def leader_address(self, shard: int) -> str | None:
        """The shard's leader as this node sees it; None while none is known."""
        ...

    async def leader_change(self, shard: int, address: str | None) -> None:
        """Returns once this node sees another leader than `address` for the shard."""
        ...


class _Abandoned(enum.Enum):
    """Why a relayed call stopped waiting for its leader's answer."""

    MOVED = enum.auto()  # this node sees another leader (or none) for the shard
    TIMED_OUT = enum.auto()  # the leader did not answer within the relay timeout


class Relays:
    """One channel per leader address, reused by every relayed call; a relayed call's
    failure becomes this node's `RequestError`. Calls follow the shard's leader as the
    module docstring says, within `timeout_s` per answer."""

    def __init__(self, leaders: Leaders, timeout_s: float, tls: TlsConfig | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"the relay timeout must be positive, got {timeout_s}")
        self._leaders = leaders
        self._timeout_s = timeout_s
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> oxia_client_pb2_grpc.OxiaClientStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_aio_channel(address, RELAY_CHANNEL_OPTIONS, self._tls)
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
        """`method` on the shard's leader, first the one at `address` (the first one known,
        for `UNKNOWN_LEADER`); `origin` is a write's exactly-once serial (a WriteStream's
        request's own, not the stream's first). Raises `LeaderHere` when the call is to
        be answered by this node."""
        retriable = origin is not None or method in _IDEMPOTENT
        metadata = _relay_metadata(_serial_metadata(origin))
        if address == UNKNOWN_LEADER:
            address = await self._next_leader(shard, address, not_leader(shard, None), wait=True)
        while True:
            call = getattr(self.stub(address), method)(
                request, metadata=metadata, timeout=context.time_remaining()
            )
            try:
                answer = await self._answer(call, shard, address, bounded=True)
            except grpc.aio.AioRpcError as e:
                error = _relay_error(address, shard, e)
                if not (retriable and _leader_gone(error)):
                    raise error from None
                address = await self._next_leader(shard, address, error, wait=True)
                continue
            finally:
                call.cancel()
            if not isinstance(answer, _Abandoned):
                return answer
            failure = self._abandoned_error(answer, method, address, shard, retriable)
            if not retriable:
                raise failure
            address = await self._next_leader(
                shard, address, failure, wait=answer is _Abandoned.MOVED
            )

    async def stream(
        self, address: str, method: str, request: Any, shard: int
    ) -> AsyncGenerator[Any, None]:
        """The responses of the server-streaming `method` on the shard's leader, first the
        one at `address` (as for `unary`). Until its first response it is retried as a
        read (`LeaderHere` when this node now leads); after, it ends with UNAVAILABLE."""
        bounded = method not in _LONG_LIVED
        answered = False
        if address == UNKNOWN_LEADER:
            address = await self._next_leader(shard, address, not_leader(shard, None), wait=True)
        while True:
            call = getattr(self.stub(address), method)(request, metadata=_relay_metadata())
            try:
                while True:
                    try:
                        response = await self._answer(call.read(), shard, address, bounded)
                    except grpc.aio.AioRpcError as e:
                        failure = _relay_error(address, shard, e)
                        if answered or not _leader_gone(failure):
                            raise failure from None
                        wait = True
                        break
                    if response is grpc.aio.EOF:
                        return
                    if isinstance(response, _Abandoned):
                        failure = self._abandoned_error(response, method, address, shard, True)
                        if answered:
                            raise failure
                        wait = response is _Abandoned.MOVED
                        break
                    answered = True
                    yield response
            finally:
                call.cancel()
            address = await self._next_leader(shard, address, failure, wait)

    async def _answer(
        self, reply: Awaitable[_T], shard: int, address: str, bounded: bool
    ) -> _T | _Abandoned:
        """`reply` (a relayed call's answer or next message), unless the shard's leader
        moves from `address` or, when `bounded`, the relay timeout passes first."""
        replied = asyncio.ensure_future(reply)
        moved = asyncio.ensure_future(self._leaders.leader_change(shard, address))
        try:
            done, _ = await asyncio.wait(
                [replied, moved],
                timeout=self._timeout_s if bounded else None,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if replied in done:
                return replied.result()
            return _Abandoned.MOVED if moved in done else _Abandoned.TIMED_OUT
        finally:
            abandon(moved)
            abandon(replied)

    def _abandoned_error(
        self, why: _Abandoned, method: str, address: str, shard: int, retriable: bool
    ) -> RequestError:
        """UNAVAILABLE for a relayed call given up on; a write's outcome is unknown."""
        if why is _Abandoned.MOVED:
            reason = f"the leader of shard {shard} changed from {address}"
        else:
            reason = (
                f"leader {address} of shard {shard} did not answer within "
                f"{self._timeout_s * 1000:g} ms (relay timeout)"
            )
        outcome = (
            ""
            if retriable
            else f"; the relayed {method} may or may not have been applied (outcome unknown)"
        )
        return RequestError(grpc.StatusCode.UNAVAILABLE, reason + outcome)

    async def _next_leader(
        self, shard: int, address: str, failure: RequestError, wait: bool
    ) -> str:
        """The leader to retry at: the shard's leader as this node sees it now, once it is
        neither `address` nor unknown, waiting up to the relay timeout if `wait`; else
        `failure` is raised. Raises `LeaderHere` when this node leads the shard."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._timeout_s if wait else 0)
        while (leader := self._leaders.leader_address(shard)) in (address, None):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise failure
            try:
                await asyncio.wait_for(self._leaders.leader_change(shard, leader), remaining)
            except TimeoutError:
                raise failure from None
        if leader == self._leaders.address:
            raise LeaderHere(shard)
        return leader

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()
