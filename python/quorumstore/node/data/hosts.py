"""Which replica of a shard serves a data call, and its KV snapshot.

Reads (scans, changes, offsets) may be served by any replica that is asked to
(`allow_follower`) or that has applied what is asked for (changes); writes and
staging only by the shard's leader. A scan its leader serves is linearizable: it reads
a snapshot taken after a read barrier (`leader_snapshot`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc

from quorumstore.node.auth.access import AccessDenied, authorize
from quorumstore.node.data.errors import Refused, invalid
from quorumstore.proto import replication_pb2
from quorumstore.protocol.replica import NotLeaderError
from quorumstore.storage.kv import KvClosedError, KvSnapshot, KvStore
from quorumstore.storage.results import EntryResult
from quorumstore.wire.status import not_leader_message


class DataShardHost(Protocol):
    """One shard replica on this node, as the data service uses it (a `ShardHost`)."""

    @property
    def kv(self) -> KvStore: ...

    def is_leader(self) -> bool: ...

    def leader_hint(self) -> str | None: ...

    async def write(self, payload: bytes) -> EntryResult: ...

    async def read_barrier(self) -> None: ...


class DataNode(Protocol):
    """What the service needs of its node (a `Node`)."""

    def shard_host(self, namespace: str, shard: int) -> DataShardHost | None: ...

    def assignments(self) -> replication_pb2.ShardAssignmentsUpdate: ...

    def led_hosts(self) -> Sequence[DataShardHost]: ...

    def now_ms(self) -> int: ...


def permit(namespace: str) -> None:
    """Refuses, with PERMISSION_DENIED, a call its caller may not make to `namespace`."""
    try:
        authorize(namespace)
    except AccessDenied as e:
        raise Refused(grpc.StatusCode.PERMISSION_DENIED, str(e)) from None


def find_host(node: DataNode, namespace: str, shard: int, *, leader: bool) -> DataShardHost:
    """The shard's replica here (its leader if `leader`), or the refusal to answer with."""
    permit(namespace)
    host = node.shard_host(namespace, shard)
    if host is None:
        known = any(
            ns.namespace == namespace and any(s.shard == shard for s in ns.shards)
            for ns in node.assignments().namespaces
        )
        if not known:
            raise invalid(f"unknown shard {namespace}/{shard}")
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"shard {namespace}/{shard} has no replica on this node",
            _table_leader(node, namespace, shard),
        )
    if leader and not host.is_leader():
        hint = host.leader_hint()
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            not_leader_message(f"{namespace}/{shard}", hint),
            hint,
        )
    return host


def _table_leader(node: DataNode, namespace: str, shard: int) -> str | None:
    for ns in node.assignments().namespaces:
        for s in ns.shards:
            if ns.namespace == namespace and s.shard == shard:
                return s.leader or None
    return None


def snapshot(host: DataShardHost) -> KvSnapshot:
    """A snapshot of the replica's KV; UNAVAILABLE once its store is closed."""
    try:
        return host.kv.snapshot()
    except KvClosedError as e:
        raise Refused(grpc.StatusCode.UNAVAILABLE, f"the shard's store is closed: {e}") from None


async def leader_snapshot(host: DataShardHost, name: str) -> KvSnapshot:
    """A snapshot of the leader's KV taken after its read barrier (`ShardHost.read_barrier`),
    so that it holds every write acknowledged before the call; not-leader when deposed."""
    try:
        await host.read_barrier()
    except NotLeaderError as e:
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            not_leader_message(name, e.leader_hint),
            e.leader_hint,
        ) from None
    return snapshot(host)
