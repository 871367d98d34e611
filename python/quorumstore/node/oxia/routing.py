"""Which replica serves a call: the shard map clients follow, and the shard's leader here.

Requests name their shard (clients route by key hash themselves); a node never
re-routes by key. Only the shard's leader serves reads and writes; a call for a shard
led elsewhere is refused with a leader hint or, in gateway mode, relayed to the leader
(`relay.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Protocol

import grpc

from quorumstore.node.auth.access import AccessDenied, authorize
from quorumstore.node.oxia import relay
from quorumstore.node.oxia.errors import RequestError, invalid, not_leader
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import replication_pb2
from quorumstore.storage.reads import ShardReader
from quorumstore.storage.results import EntryResult
from quorumstore.wire.metadata import LEADER_HINT_METADATA_KEY, Routing
from quorumstore.wire.status import OxiaCode

#: How often a relayed call waiting on a leader looks again whether it has changed.
_RECHECK_S = 0.1


class ShardDirectory(Protocol):
    """What a node tells its client API: hosted shards and the routing table."""

    #: This node's client address (`host:port`), as clients reach it.
    address: str

    def shard_host(self, namespace: str, shard: int) -> ShardHostApi | None:
        """The replica of the shard on this node; None when it is not hosted here."""
        ...

    def assignments(self) -> replication_pb2.ShardAssignmentsUpdate:
        """The latest routing table pushed by the coordinator."""
        ...

    async def assignments_changed(self, version: int) -> None:
        """Returns once a table newer than `version` is present."""
        ...

    def now_ms(self) -> int:
        """Wall clock for write timestamps: the leader's clock goes into the entry."""
        ...


class ShardHostApi(Protocol):
    """One shard replica hosted by this node, as the client API needs it."""

    def is_leader(self) -> bool: ...

    def leader_hint(self) -> str | None:
        """Address of the current leader, if known."""
        ...

    async def write(self, payload: bytes) -> EntryResult:
        """Replicate one write batch; resolves once it is committed and applied.

        Entries are appended in call order: write() takes its log position before its
        first suspension, so the writes of one WriteStream, started in request order,
        are applied in request order. Raises NotLeaderError when not the leader.
        """
        ...

    async def read_barrier(self) -> None:
        """Returns once a read of `reader()` is linearizable (see `ShardHost.read_barrier`).
        Raises NotLeaderError when not the leader, or deposed meanwhile."""
        ...

    def reader(self) -> ShardReader:
        """The committed state (the leader's applied KV)."""
        ...

    def changes(self) -> asyncio.Event:
        """Set at the next applied entry, change of role or term, or close; taken before
        reading, so that nothing that happens meanwhile is missed."""
        ...


def client_assignments(
    table: replication_pb2.ShardAssignmentsUpdate, namespace: str, gateway: str | None = None
) -> pb.ShardAssignments:
    """Oxia's view of one namespace of our routing table.

    A shard without a leader yet is kept, with an empty leader, as Oxia's coordinator
    does: leaving it out would make clients that scan every shard (list, range scan,
    delete range) silently skip its keys, while an empty address fails loudly. With a
    `gateway` address, that address stands for every shard's leader.
    """
    for entry in table.namespaces:
        if entry.namespace == namespace:
            shards = [
                pb.ShardAssignment(
                    shard=s.shard,
                    leader=gateway or s.leader,
                    int32_hash_range=pb.Int32HashRange(
                        min_hash_inclusive=s.hash_range.min_hash_inclusive,
                        max_hash_inclusive=s.hash_range.max_hash_inclusive,
                    ),
                )
                for s in entry.shards
            ]
            return pb.ShardAssignments(
                namespaces={
                    namespace: pb.NamespaceShardsAssignment(
                        assignments=shards, shard_key_router=pb.XXHASH3
                    )
                }
            )
    known = sorted(entry.namespace for entry in table.namespaces)
    raise RequestError(
        OxiaCode.NAMESPACE_NOT_FOUND,
        f"{OxiaCode.NAMESPACE_NOT_FOUND.message_prefix}: {namespace!r} (this cluster has {known})",
    )


def shard_index(table: replication_pb2.ShardAssignmentsUpdate) -> dict[int, tuple[str, str]]:
    """shard id -> (namespace, leader address) of every shard in the table."""
    return {
        s.shard: (entry.namespace, s.leader) for entry in table.namespaces for s in entry.shards
    }


def permit(namespace: str) -> None:
    """Refuses, with PERMISSION_DENIED, a call its caller may not make to `namespace`."""
    try:
        authorize(namespace)
    except AccessDenied as e:
        raise RequestError(grpc.StatusCode.PERMISSION_DENIED, str(e)) from None


class Router:
    """Finds the replica of a named shard on this node, or the leader to relay to."""

    def __init__(self, directory: ShardDirectory) -> None:
        self.directory = directory
        # The shard index of the last table seen, rebuilt when the table object changes.
        self._indexed_table: replication_pb2.ShardAssignmentsUpdate | None = None
        self._index: dict[int, tuple[str, str]] = {}

    @property
    def address(self) -> str:
        """This node's client address."""
        return self.directory.address

    async def assignments(
        self, namespace: str, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[pb.ShardAssignments, None]:
        """The namespace's full map now, and again whenever it changes.

        A node that has no table yet holds the stream open until the first one. A new
        table that leaves this namespace's map as it was is not sent. In gateway mode
        the map names this node for every shard, so leader changes never change it.
        """
        try:
            gateway = relay.routing_of(context) is Routing.GATEWAY
        except ValueError as e:
            raise invalid(str(e)) from None
        permit(namespace)
        last_sent: pb.ShardAssignments | None = None
        while True:
            table = self.directory.assignments()
            if table.namespaces:
                address = self.directory.address if gateway else None
                message = client_assignments(table, namespace, address)
                if message != last_sent:
                    yield message
                    last_sent = message
            await self.directory.assignments_changed(table.version)

    def _locate(self, request_shard: int | None) -> tuple[int, str, str]:
        """(shard, namespace, leader address in the routing table) of the named shard."""
        if request_shard is None:
            raise invalid("the request names no shard; quorumstore does not route by key")
        table = self.directory.assignments()
        if table is not self._indexed_table:
            self._index = shard_index(table)
            self._indexed_table = table
        located = self._index.get(request_shard)
        if located is None:
            raise invalid(f"unknown shard {request_shard}: it is in no namespace of this cluster")
        permit(located[0])
        return (request_shard, *located)

    def _leader(self, request_shard: int | None) -> tuple[int, ShardHostApi | None, str | None]:
        """(shard, its replica here if any, its leader's address as this node sees it:
        its own name when it leads, None while no leader is known)."""
        shard, namespace, table_leader = self._locate(request_shard)
        host = self.directory.shard_host(namespace, shard)
        if host is None:
            return shard, None, table_leader or None
        if host.is_leader():
            return shard, host, self.directory.address
        return shard, host, host.leader_hint()

    def leader_host(self, request_shard: int | None) -> ShardHostApi:
        """The leader replica of the named shard on this node, or the error to return."""
        shard, host, leader = self._leader(request_shard)
        if host is None or not host.is_leader():
            raise not_leader(shard, leader)
        return host

    def leader_address(self, shard: int) -> str | None:
        """The shard's leader as this node sees it now (see `_leader`)."""
        return self._leader(shard)[2]

    async def leader_change(self, shard: int, address: str | None) -> None:
        """Returns once this node sees another leader than `address` for the shard (None:
        none known). It wakes on a new routing table and on a new role, term or applied
        entry of the replica here, and looks again every `_RECHECK_S`, because a follower
        learns a new term's leader from its first append, which signals nothing."""
        while True:
            table_version = self.directory.assignments().version
            _, host, leader = self._leader(shard)
            if leader != address:
                return
            wakers: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(self.directory.assignments_changed(table_version))
            ]
            if host is not None:
                wakers.append(asyncio.ensure_future(host.changes().wait()))
            try:
                await asyncio.wait(wakers, timeout=_RECHECK_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waker in wakers:
                    waker.cancel()

    def route(
        self, request_shard: int | None, context: grpc.aio.ServicerContext
    ) -> ShardHostApi | str:
        """The shard's leader replica here, or in gateway mode the address to relay to
        (`relay.UNKNOWN_LEADER` during an election: the relay waits for its leader)."""
        try:
            return self.leader_host(request_shard)
        except RequestError as refused:
            if refused.code is not OxiaCode.NODE_IS_NOT_LEADER:
                raise
            try:
                may_relay = relay.may_relay(context)
            except ValueError as e:
                raise invalid(str(e)) from None
            hint = dict(refused.trailing_metadata).get(LEADER_HINT_METADATA_KEY)
            if not may_relay or hint == self.directory.address:
                raise
            return hint or relay.UNKNOWN_LEADER

    def hosts(self) -> list[tuple[int, ShardHostApi]]:
        """(shard, replica) of every shard in the routing table hosted here."""
        table = self.directory.assignments()
        hosts = []
        for shard, (namespace, _) in shard_index(table).items():
            host = self.directory.shard_host(namespace, shard)
            if host is not None:
                hosts.append((shard, host))
        return hosts
