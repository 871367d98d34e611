"""Translation between the engine's messages and the internal protobuf messages.

The engine speaks plain dataclasses (`protocol.messages`); the servers speak
`proto/replication.proto`. Everything that crosses a socket goes through here.
"""

from __future__ import annotations

from collections.abc import Mapping

from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import ClusterMetadata, ShardMetadata, ShardState
from quorumstore.protocol.messages import (
    Ack,
    AckStatus,
    AddFollower,
    Append,
    BecomeLeader,
    BecomeLeaderResponse,
    FollowerStatus,
    NewTerm,
    NewTermResponse,
    ShardStatus,
    Truncate,
    TruncateResponse,
)
from quorumstore.protocol.types import LogEntry, LogPosition, Role

_ROLE_TO_PB = {
    Role.NOT_MEMBER: pb.NOT_MEMBER,
    Role.FENCED: pb.FENCED,
    Role.FOLLOWER: pb.FOLLOWER,
    Role.LEADER: pb.LEADER,
}
_ROLE_FROM_PB = {v: k for k, v in _ROLE_TO_PB.items()}
_ACK_TO_PB = {
    AckStatus.OK: pb.OK,
    AckStatus.STALE_TERM: pb.STALE_TERM,
    AckStatus.GAP: pb.GAP,
    AckStatus.MISMATCH: pb.MISMATCH,
}
_ACK_FROM_PB = {v: k for k, v in _ACK_TO_PB.items()}
_STATE_TO_PB = {
    ShardState.ELECTION: pb.ELECTION,
    ShardState.ONLINE: pb.ONLINE,
    ShardState.OFFLINE: pb.OFFLINE,
}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}


def position_to_pb(p: LogPosition) -> pb.LogPosition:
    return pb.LogPosition(term=p.term, offset=p.offset, checksum=p.checksum)


def position_from_pb(p: pb.LogPosition) -> LogPosition:
    return LogPosition(p.term, p.offset, p.checksum)


def role_to_pb(role: Role) -> pb.ReplicaRole:
    return _ROLE_TO_PB[role]


def role_from_pb(role: pb.ReplicaRole) -> Role:
    return _ROLE_FROM_PB[role]


# --- coordinator <-> node ----------------------------------------------------------


def new_term_to_pb(m: NewTerm) -> pb.NewTermRequest:
    return pb.NewTermRequest(namespace=m.shard[0], shard=m.shard[1], term=m.term)


def new_term_from_pb(r: pb.NewTermRequest) -> NewTerm:
    return NewTerm((r.namespace, r.shard), r.term)


def new_term_response_to_pb(m: NewTermResponse) -> pb.NewTermResponse:
    return pb.NewTermResponse(
        namespace=m.shard[0],
        shard=m.shard[1],
        term=m.term,
        head=position_to_pb(m.head),
        commit_offset=m.commit_offset,
        incarnation=m.incarnation,
    )


def new_term_response_from_pb(r: pb.NewTermResponse, node: str) -> NewTermResponse:
    return NewTermResponse(
        (r.namespace, r.shard),
        r.term,
        node,
        position_from_pb(r.head),
        r.commit_offset,
        r.incarnation,
    )


def become_leader_to_pb(m: BecomeLeader) -> pb.BecomeLeaderRequest:
    return pb.BecomeLeaderRequest(
        namespace=m.shard[0],
        shard=m.shard[1],
        term=m.term,
        replication_factor=m.replication_factor,
        follower_map={k: position_to_pb(v) for k, v in m.follower_map.items()},
    )


def become_leader_from_pb(r: pb.BecomeLeaderRequest) -> BecomeLeader:
    return BecomeLeader(
        (r.namespace, r.shard),
        r.term,
        r.replication_factor,
        {k: position_from_pb(v) for k, v in r.follower_map.items()},
    )


def become_leader_response_to_pb(m: BecomeLeaderResponse) -> pb.BecomeLeaderResponse:
    return pb.BecomeLeaderResponse(
        namespace=m.shard[0], shard=m.shard[1], term=m.term, head=position_to_pb(m.head)
    )


def become_leader_response_from_pb(r: pb.BecomeLeaderResponse, node: str) -> BecomeLeaderResponse:
    return BecomeLeaderResponse((r.namespace, r.shard), r.term, node, position_from_pb(r.head))


def add_follower_to_pb(m: AddFollower) -> pb.AddFollowerRequest:
    return pb.AddFollowerRequest(
        namespace=m.shard[0],
        shard=m.shard[1],
        term=m.term,
        follower_name=m.follower,
        follower_head=position_to_pb(m.follower_head),
    )


def add_follower_from_pb(r: pb.AddFollowerRequest) -> AddFollower:
    return AddFollower(
        (r.namespace, r.shard), r.term, r.follower_name, position_from_pb(r.follower_head)
    )


def shard_status_to_pb(s: ShardStatus, node: str = "") -> pb.ShardStatus:
    return pb.ShardStatus(
        namespace=s.shard[0],
        shard=s.shard[1],
        term=s.term,
        role=role_to_pb(s.role),
        head=position_to_pb(s.head),
        commit_offset=s.commit_offset,
        followers=[
            pb.FollowerStatus(name=f.name, acked_offset=f.acked_offset) for f in s.followers
        ],
        node=node,
        incarnation=s.incarnation,
    )


def shard_status_from_pb(s: pb.ShardStatus) -> ShardStatus:
    return ShardStatus(
        (s.namespace, s.shard),
        s.term,
        role_from_pb(s.role),
        position_from_pb(s.head),
        s.commit_offset,
        tuple(FollowerStatus(f.name, f.acked_offset) for f in s.followers),
        s.incarnation,
    )


# --- leader <-> follower -----------------------------------------------------------


def append_to_pb(m: Append) -> pb.Append:
    return pb.Append(
        namespace=m.shard[0],
        shard=m.shard[1],
        term=m.term,
        commit_offset=m.commit_offset,
        prev_checksum=m.prev.checksum,
        prev_offset=m.prev.offset,
        prev_term=m.prev.term,
        entries=[
            pb.LogEntry(term=e.term, offset=e.offset, checksum=e.checksum, payload=e.payload)
            for e in m.entries
        ],
        leader_name=m.leader,
    )


def append_from_pb(r: pb.Append) -> Append:
    return Append(
        (r.namespace, r.shard),
        r.term,
        r.leader_name,
        LogPosition(r.prev_term, r.prev_offset, r.prev_checksum),
        tuple(LogEntry(e.term, e.offset, e.checksum, e.payload) for e in r.entries),
        r.commit_offset,
    )


def ack_to_pb(m: Ack) -> pb.Ack:
    return pb.Ack(
        namespace=m.shard[0],
        shard=m.shard[1],
        term=m.term,
        head_offset=m.head_offset,
        status=_ACK_TO_PB[m.status],
        follower_head=position_to_pb(m.follower_head),
    )


def ack_from_pb(r: pb.Ack, follower: str) -> Ack:
    return Ack(
        (r.namespace, r.shard),
        r.term,
        follower,
        _ACK_FROM_PB[r.status],
        r.head_offset,
        position_from_pb(r.follower_head),
    )


def truncate_to_pb(m: Truncate) -> pb.TruncateRequest:
    return pb.TruncateRequest(
        namespace=m.shard[0],
        shard=m.shard[1],
        term=m.term,
        head=position_to_pb(m.head),
        leader_name=m.leader,
        follower_head=position_to_pb(m.follower_head),
    )


def truncate_from_pb(r: pb.TruncateRequest) -> Truncate:
    return Truncate(
        (r.namespace, r.shard),
        r.term,
        r.leader_name,
        position_from_pb(r.head),
        position_from_pb(r.follower_head),
    )


def truncate_response_to_pb(m: TruncateResponse) -> pb.TruncateResponse:
    return pb.TruncateResponse(
        namespace=m.shard[0], shard=m.shard[1], term=m.term, head=position_to_pb(m.head)
    )


def truncate_response_from_pb(r: pb.TruncateResponse, follower: str) -> TruncateResponse:
    return TruncateResponse((r.namespace, r.shard), r.term, follower, position_from_pb(r.head))


# --- coordinator metadata ----------------------------------------------------------


def metadata_to_pb(meta: ClusterMetadata) -> pb.CoordinatorMetadata:
    return pb.CoordinatorMetadata(
        version=meta.version,
        shards=[
            pb.ShardMetadata(
                namespace=m.shard[0],
                shard=m.shard[1],
                term=m.term,
                leader=m.leader or "",
                ensemble=list(m.ensemble),
                hash_range=pb.HashRange(
                    min_hash_inclusive=m.hash_range[0], max_hash_inclusive=m.hash_range[1]
                ),
                status=_STATE_TO_PB[m.state],
                eligible=sorted(m.eligible),
                last_known_commit_offset=m.known_commit_offset,
                incarnations=dict(m.incarnations),
            )
            for _, m in sorted(meta.shards.items())
        ],
    )


def metadata_from_pb(p: pb.CoordinatorMetadata) -> ClusterMetadata:
    shards = {}
    for m in p.shards:
        key = (m.namespace, m.shard)
        shards[key] = ShardMetadata(
            key,
            tuple(m.ensemble),
            (m.hash_range.min_hash_inclusive, m.hash_range.max_hash_inclusive),
            term=m.term,
            leader=m.leader or None,
            state=_STATE_FROM_PB[m.status],
            eligible=frozenset(m.eligible),
            known_commit_offset=m.last_known_commit_offset,
            incarnations=dict(m.incarnations),
        )
    return ClusterMetadata(p.version, shards)


def assignments_from_metadata(
    meta: ClusterMetadata, addresses: Mapping[str, str], version: int
) -> pb.ShardAssignmentsUpdate:
    """The table clients route by: every shard's hash range and current leader, named by
    the client addresses in `addresses` (node name -> address; a node whose address is
    not known yet is left out). `version` orders the tables of one coordinator: it rises
    with the metadata and with every address change."""
    namespaces: dict[str, list[pb.ShardAssignment]] = {}
    for (namespace, shard), m in sorted(meta.shards.items()):
        leader = m.leader if m.state is ShardState.ONLINE else None
        namespaces.setdefault(namespace, []).append(
            pb.ShardAssignment(
                shard=shard,
                hash_range=pb.HashRange(
                    min_hash_inclusive=m.hash_range[0], max_hash_inclusive=m.hash_range[1]
                ),
                term=m.term,
                leader=addresses.get(leader, "") if leader else "",
                followers=[addresses[n] for n in m.ensemble if n != leader and n in addresses],
            )
        )
    return pb.ShardAssignmentsUpdate(
        version=version,
        namespaces=[
            pb.NamespaceAssignments(namespace=ns, shards=shards)
            for ns, shards in namespaces.items()
        ],
    )
