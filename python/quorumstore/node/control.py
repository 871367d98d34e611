"""The `NodeControl` service: how the coordinator drives a node's shard replicas.

It is served on the node's internal port, behind the cluster secret; each message is
checked (`control_checks.py`) before it reaches a replica or creates a directory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol, TypeVar

import grpc

from quorumstore.archive.manifest import ArchiveError
from quorumstore.archive.restore import LatestRestore
from quorumstore.node import control_checks as checks
from quorumstore.node.aborts import abort
from quorumstore.node.shard_host import ShardHost
from quorumstore.node.transport import NodeTransport
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import BecomeLeaderResponse, Message, NewTermResponse, ShardKey
from quorumstore.wire import replication as wire
from quorumstore.wire.auth import COORDINATOR_METADATA_KEY

#: How long a NodeControl call waits for the engine's durable answer.
_REPLY_TIMEOUT_S = 5.0

_R = TypeVar("_R")


class ControlledNode(Protocol):
    """What the service needs of its node (a `Node`)."""

    @property
    def name(self) -> str: ...

    @property
    def hosts(self) -> Mapping[ShardKey, ShardHost]: ...

    @property
    def transport(self) -> NodeTransport: ...

    def open_host(self, shard: ShardKey) -> ShardHost: ...

    def deliver(self, shard: ShardKey, msg: Message) -> None: ...

    def health_report(self, ping_sequence: int) -> pb.HealthReport: ...

    def set_assignments(self, update: pb.ShardAssignmentsUpdate, coordinator: str) -> None: ...

    async def rebuild_from_archive(self, restore: LatestRestore) -> None: ...


async def await_reply(
    future: asyncio.Future[_R], context: grpc.aio.ServicerContext, what: str
) -> _R:
    """The engine's answer to a call, or the call ended as not accepted once
    `_REPLY_TIMEOUT_S` passed without one."""
    try:
        return await asyncio.wait_for(future, _REPLY_TIMEOUT_S)
    except TimeoutError:
        await abort(
            context,
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{what} was not accepted (stale term or wrong state); the coordinator retries with a fresh term",
        )


async def enforce(
    context: grpc.aio.ServicerContext, check: Callable[..., None], *args: Any
) -> None:
    """Runs a message check; a message that fails it is refused with INVALID_ARGUMENT."""
    try:
        check(*args)
    except checks.InvalidControl as e:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"refused: {e}")


class NodeControl(pb_grpc.NodeControlServicer):
    """Serves the coordinator's calls: terms, leadership, followers, status, health and
    the routing table."""

    def __init__(self, node: ControlledNode):
        self.node = node

    async def NewTerm(
        self, request: pb.NewTermRequest, context: grpc.aio.ServicerContext
    ) -> pb.NewTermResponse:
        await enforce(context, checks.check_new_term, request)
        shard = (request.namespace, request.shard)
        host = self.node.hosts.get(shard) or self.node.open_host(shard)
        reply = self.node.transport.expect(NewTermResponse, shard)
        host.step(wire.new_term_from_pb(request))
        response = await await_reply(reply, context, f"NewTerm {request.term} for {shard}")
        return wire.new_term_response_to_pb(response)

    async def BecomeLeader(
        self, request: pb.BecomeLeaderRequest, context: grpc.aio.ServicerContext
    ) -> pb.BecomeLeaderResponse:
        await enforce(context, checks.check_become_leader, request, self.node.name)
        shard = (request.namespace, request.shard)
        host = self.node.hosts.get(shard)
        if host is None:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"shard {shard} is not hosted on {self.node.name}",
            )
        reply = self.node.transport.expect(BecomeLeaderResponse, shard)
        host.step(wire.become_leader_from_pb(request))
        response = await await_reply(reply, context, f"BecomeLeader {request.term} for {shard}")
        return wire.become_leader_response_to_pb(response)

    async def AddFollower(
        self, request: pb.AddFollowerRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddFollowerResponse:
        await enforce(context, checks.check_add_follower, request, self.node.name)
        self.node.deliver((request.namespace, request.shard), wire.add_follower_from_pb(request))
        return pb.AddFollowerResponse()

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatusResponse:
        host = self.node.hosts.get((request.namespace, request.shard))
        if host is None:
            return pb.GetStatusResponse(
                namespace=request.namespace, shard=request.shard, role=pb.NOT_MEMBER, term=-1
            )
        s = wire.shard_status_to_pb(host.replica.status())
        return pb.GetStatusResponse(
            namespace=s.namespace,
            shard=s.shard,
            term=s.term,
            role=s.role,
            head=s.head,
            commit_offset=s.commit_offset,
            followers=s.followers,
        )

    async def Health(
        self, request_iterator: AsyncIterator[pb.HealthPing], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.HealthReport]:
        async for ping in request_iterator:
            if ping.internal_addresses or ping.client_addresses:
                await enforce(context, checks.check_addresses, ping)
                self.node.transport.set_addresses(
                    dict(ping.internal_addresses), dict(ping.client_addresses)
                )
            yield self.node.health_report(ping.ping_sequence)

    async def PushShardAssignments(
        self, request: pb.ShardAssignmentsUpdate, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        await enforce(context, checks.check_assignments, request)
        coordinator = dict(context.invocation_metadata() or ()).get(COORDINATOR_METADATA_KEY, "")
        self.node.set_assignments(request, str(coordinator))
        return pb.Empty()

    async def RebuildFromArchive(
        self, request: pb.RebuildFromArchiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        try:
            restore = LatestRestore.from_json(request.plan, "the restore plan")
        except ArchiveError as e:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"refused: {e}")
        await enforce(context, checks.check_restore, restore.metadata)
        try:
            await self.node.rebuild_from_archive(restore)
        except ArchiveError as e:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.Empty()
