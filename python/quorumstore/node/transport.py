"""How a node's shard hosts reach their peers and the coordinator over gRPC.

- Append: one long-lived `Replicate` stream per (shard, follower), opened by the leader
  on its first Append; the follower answers with Acks on the same stream.
- Truncate: a unary call; its response is fed back to the leader's engine.
- Snapshots: a `SendSnapshot` client stream of Arrow chunks read from a KV snapshot, one
  per follower at a time (`snapshot_streams.py`).
- Replies to the coordinator (NewTermResponse, BecomeLeaderResponse) complete the
  coordinator's pending unary call; replies to a leader's Truncate complete that call.
A broken stream is simply dropped: the engine's retransmission covers the loss.

Peers are named by their member names; the transport dials their internal addresses,
which the coordinator hands out on the health stream with their client addresses
(`set_addresses`), and every call carries the cluster secret.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Protocol

import grpc

from quorumstore.node import data_format
from quorumstore.node.outbox import Outbox
from quorumstore.node.snapshot_streams import SnapshotSource, SnapshotStreams
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import (
    COORDINATOR,
    Ack,
    Append,
    Message,
    Outbound,
    SendSnapshot,
    ShardKey,
    Truncate,
    TruncateResponse,
)
from quorumstore.wire import replication as wire
from quorumstore.wire.membership import Membership

log = logging.getLogger(__name__)


class LinkedHost(Protocol):
    """A shard replica, told when its messages have left this node (a `ShardHost`)."""

    def appends_written(self) -> None: ...

    def acks_written(self) -> None: ...


class PeerNode(Protocol):
    """What the transport needs of its node (a `Node`): its replicas, and the way in
    for the messages that arrive for them."""

    @property
    def hosts(self) -> Mapping[ShardKey, LinkedHost]: ...

    def deliver(self, shard: ShardKey, msg: Message) -> None: ...


class _ReplicateStream:
    """The leader's side of one `Replicate` stream to one follower for one shard."""

    def __init__(self, transport: NodeTransport, shard: ShardKey, follower: str):
        self.outbox: Outbox[pb.Append] = Outbox(transport.appends_written)
        self._transport = transport
        self._shard = shard
        self._follower = follower
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            stub = pb_grpc.ReplicationStub(self._transport.channel(self._follower))
            call = stub.Replicate(self.outbox.messages(), metadata=self._transport.metadata)
            async for ack in call:
                self._transport.node.deliver(self._shard, wire.ack_from_pb(ack, self._follower))
        except grpc.aio.AioRpcError as e:
            log.debug("replicate stream %s -> %s ended: %s", self._shard, self._follower, e.code())
            self._transport.refusals.note(self._follower, e)
        except UnknownPeer as e:
            log.debug("replicate stream %s -> %s: %s", self._shard, self._follower, e)
        finally:
            self._transport.forget_stream(self._shard, self._follower, self)
            self.outbox.drop()


class UnknownPeer(LookupError):
    """No internal address is known for a peer yet (the coordinator has not said)."""


class NodeTransport:
    def __init__(self, node: PeerNode, membership: Membership):
        self.node = node
        self._membership = membership
        #: The metadata of every call to a peer: the data format, and the secret.
        self.metadata = data_format.REPLICATION_METADATA + membership.metadata
        #: Peer name -> its internal address, and its client address.
        self._internal: dict[str, str] = {}
        self._client: dict[str, str] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[tuple[ShardKey, str], _ReplicateStream] = {}
        #: follower side: (shard, leader) -> the Acks of that leader's stream
        self.inbound: dict[tuple[ShardKey, str], Outbox[pb.Ack]] = {}
        self._waiters: dict[tuple[type, ShardKey, str], list[asyncio.Future[Any]]] = defaultdict(
            list
        )
        self._tasks: set[asyncio.Task[None]] = set()
        #: Followers that refuse this node's data format, warned about now and then.
        self.refusals = data_format.RefusalLog()
        self._snapshots = SnapshotStreams(self.channel, node.deliver, self.refusals, self.metadata)

    def set_addresses(self, internal: Mapping[str, str], client: Mapping[str, str]) -> None:
        """Learns where peers' internal and client ports are; a peer that moved gets a
        new channel."""
        self._client.update(client)
        for name, address in internal.items():
            if self._internal.get(name, address) != address:
                channel = self._channels.pop(name, None)
                if channel is not None:
                    self._spawn(channel.close())
            self._internal[name] = address

    def client_address(self, peer: str | None) -> str | None:
        """Where clients reach `peer`; None while the coordinator has not said."""
        return None if peer is None else self._client.get(peer)

    def channel(self, peer: str) -> grpc.aio.Channel:
        """The channel to `peer`'s internal port; raises UnknownPeer while its address is
        not known."""
        channel = self._channels.get(peer)
        if channel is None:
            address = self._internal.get(peer)
            if address is None:
                raise UnknownPeer(f"no internal address known for {peer} yet")
            channel = self._membership.channel(address)
            self._channels[peer] = channel
        return channel

    def forget_stream(self, shard: ShardKey, follower: str, stream: _ReplicateStream) -> None:
        if self._streams.get((shard, follower)) is stream:
            del self._streams[(shard, follower)]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ replies awaited by RPC handlers

    def expect(self, kind: type, shard: ShardKey, peer: str = COORDINATOR) -> asyncio.Future[Any]:
        """A future completed when the engine of `shard` sends a `kind` message to `peer`."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[(kind, shard, peer)].append(future)
        return future

    def _complete(self, kind: type, shard: ShardKey, peer: str, message: Any) -> bool:
        waiters = self._waiters.pop((kind, shard, peer), [])
        for future in waiters:
            if not future.done():
                future.set_result(message)
        return bool(waiters)

    # ------------------------------------------------------------------ Transport protocol

    def send(self, sender: SnapshotSource, out: Outbound) -> None:
        msg = out.message
        shard = sender.shard
        if out.to == COORDINATOR:
            self._complete(type(msg), shard, COORDINATOR, msg)
        elif isinstance(msg, Append):
            stream = self._streams.get((shard, out.to))
            if stream is None:
                stream = _ReplicateStream(self, shard, out.to)
                self._streams[(shard, out.to)] = stream
            stream.outbox.put(shard, wire.append_to_pb(msg))
        elif isinstance(msg, Ack):
            acks = self.inbound.get((shard, out.to))
            if acks is not None:
                acks.put(shard, wire.ack_to_pb(msg))
        elif isinstance(msg, Truncate):
            self._spawn(self._truncate(shard, out.to, msg))
        elif isinstance(msg, TruncateResponse):
            self._complete(TruncateResponse, shard, out.to, msg)
        else:
            raise TypeError(f"no route for {type(msg).__name__} to {out.to}")

    def appends_written(self, shard: ShardKey) -> None:
        """An outbox of Appends has none of `shard` left to write; once no stream of the
        shard has, its leader may use the wait for Acks (`ShardHost.appends_written`)."""
        if any(s.outbox.unwritten(shard) for (of, _), s in self._streams.items() if of == shard):
            return
        host = self.node.hosts.get(shard)
        if host is not None:
            host.appends_written()

    def acks_in_transit(self, shard: ShardKey) -> bool:
        return any(acks.unwritten(shard) for (of, _), acks in self.inbound.items() if of == shard)

    def acks_written(self, shard: ShardKey) -> None:
        """An outbox of Acks has none of `shard` left to write; a host with none left in
        transit anywhere may apply (`ShardHost._follower_apply`)."""
        if self.acks_in_transit(shard):
            return
        host = self.node.hosts.get(shard)
        if host is not None:
            host.acks_written()

    async def _truncate(self, shard: ShardKey, follower: str, msg: Truncate) -> None:
        try:
            stub = pb_grpc.ReplicationStub(self.channel(follower))
            response = await stub.Truncate(
                wire.truncate_to_pb(msg), timeout=10, metadata=self.metadata
            )
        except grpc.aio.AioRpcError as e:
            log.debug("truncate %s -> %s failed: %s", shard, follower, e.code())
            self.refusals.note(follower, e)
            return
        except UnknownPeer as e:
            log.debug("truncate %s -> %s: %s", shard, follower, e)
            return
        self.node.deliver(shard, wire.truncate_response_from_pb(response, follower))

    def send_snapshot(self, sender: SnapshotSource, request: SendSnapshot) -> None:
        self._snapshots.request(sender, request)

    async def close(self) -> None:
        await self._snapshots.close()
        for stream in list(self._streams.values()):
            stream.outbox.close()
            stream.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
