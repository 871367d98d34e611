"""Messages exchanged by the engine: coordinator <-> node and leader <-> follower.

These mirror `proto/replication.proto`; the servers translate between the two. Every
message that must be fenced carries the sender's term (docs/protocol.md, "Terms and
fencing").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from quorumstore.protocol.types import LogEntry, LogPosition, Role

ShardKey = tuple[str, int]
"""(namespace, shard id): what a replica and a coordinator shard record are keyed by."""


# --- coordinator -> node -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewTerm:
    shard: ShardKey
    term: int


@dataclass(frozen=True, slots=True)
class NewTermResponse:
    shard: ShardKey
    term: int
    node: str
    head: LogPosition
    commit_offset: int
    #: Identity of the replica's data (docs/protocol.md, "Replicas that lose their disk");
    #: "" from a replica that reports none (a node older than incarnations).
    incarnation: str = ""


@dataclass(frozen=True, slots=True)
class BecomeLeader:
    shard: ShardKey
    term: int
    replication_factor: int
    follower_map: dict[str, LogPosition]


@dataclass(frozen=True, slots=True)
class BecomeLeaderResponse:
    shard: ShardKey
    term: int
    node: str
    head: LogPosition


@dataclass(frozen=True, slots=True)
class AddFollower:
    shard: ShardKey
    term: int
    follower: str
    follower_head: LogPosition


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    name: str
    acked_offset: int


@dataclass(frozen=True, slots=True)
class ShardStatus:
    shard: ShardKey
    term: int
    role: Role
    head: LogPosition
    commit_offset: int
    followers: tuple[FollowerStatus, ...] = ()
    #: Identity of the replica's data (see NewTermResponse.incarnation).
    incarnation: str = ""


@dataclass(frozen=True, slots=True)
class StatusRequest:
    """The coordinator's health probe; a node answers with one NodeStatus."""


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node: str
    shards: tuple[ShardStatus, ...]


@dataclass(frozen=True, slots=True)
class NodeUnreachable:
    """The driver lost its health stream to `node`: treat it as failed now, not after a timeout."""

    node: str


# --- leader -> follower --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Append:
    """Entries after `prev` (possibly none: a heartbeat/probe) plus the leader's commit."""

    shard: ShardKey
    term: int
    leader: str
    prev: LogPosition
    entries: tuple[LogEntry, ...]
    commit_offset: int


class AckStatus(enum.Enum):
    OK = "ok"
    STALE_TERM = "stale_term"
    GAP = "gap"
    MISMATCH = "mismatch"


@dataclass(frozen=True, slots=True)
class Ack:
    """A follower's answer: the highest offset it holds durably that matches the leader."""

    shard: ShardKey
    term: int
    follower: str
    status: AckStatus
    head_offset: int
    follower_head: LogPosition


@dataclass(frozen=True, slots=True)
class Truncate:
    """Cut the follower's log after `head`, if its own head is still `follower_head`."""

    shard: ShardKey
    term: int
    leader: str
    head: LogPosition
    follower_head: LogPosition


@dataclass(frozen=True, slots=True)
class TruncateResponse:
    shard: ShardKey
    term: int
    follower: str
    head: LogPosition


@dataclass(frozen=True, slots=True)
class SnapshotReceived:
    """Fed to a follower's engine once a leader's snapshot has been staged locally."""

    shard: ShardKey
    term: int
    leader: str
    position: LogPosition


@dataclass(frozen=True, slots=True)
class SendSnapshot:
    """Effect: stream the KV (at its applied position) to `follower` in `term`."""

    shard: ShardKey
    term: int
    follower: str


Message = (
    NewTerm
    | NewTermResponse
    | BecomeLeader
    | BecomeLeaderResponse
    | AddFollower
    | StatusRequest
    | NodeStatus
    | NodeUnreachable
    | Append
    | Ack
    | Truncate
    | TruncateResponse
    | SnapshotReceived
)


@dataclass(frozen=True, slots=True)
class Outbound:
    """A message addressed to a node (or to the coordinator, COORDINATOR)."""

    to: str
    message: Message


COORDINATOR = "coordinator"


@dataclass(slots=True)
class Ready:
    """What a replica asks its driver to do, in this order (etcd-raft's `Ready`).

    1. persist `term` (if set), then `truncate_after`, then install the staged snapshot
       and reset the log to `install_snapshot` (if set), then append `entries`;
    2. `send_now` may go out at once (a leader's appends need not wait for its own fsync);
    3. sync the log, then send `send_after_sync` (they report durable state) and call
       `persisted()` with the synced head;
    4. apply committed entries up to `commit_offset` to the KV;
    5. start `snapshots` streams.
    """

    term: int | None = None
    truncate_after: int | None = None
    install_snapshot: LogPosition | None = None
    entries: list[LogEntry] = field(default_factory=list)
    send_now: list[Outbound] = field(default_factory=list)
    send_after_sync: list[Outbound] = field(default_factory=list)
    commit_offset: int = -1
    snapshots: list[SendSnapshot] = field(default_factory=list)

    def has_storage_work(self) -> bool:
        return bool(
            self.term is not None
            or self.truncate_after is not None
            or self.install_snapshot is not None
            or self.entries
        )

    def is_empty(self) -> bool:
        return not (
            self.has_storage_work() or self.send_now or self.send_after_sync or self.snapshots
        )
