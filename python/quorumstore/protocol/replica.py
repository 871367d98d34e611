"""One shard replica as a deterministic state machine (docs/protocol.md).

Inputs: `step(message)`, `tick()`, `propose(payload)`, `persisted(offset)`.
Output: `ready()`, a `Ready` of storage effects and messages for the driver. There are
no sockets, threads, files or clocks in here; the driver (a gRPC server, or the
simulator) owns all of those.

Roles (NotMember, Fenced, Follower, Leader) change only through the transition table
in `replica_states`; the leader's view of each follower is a `FollowCursor`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quorumstore.protocol.follow_cursor import CursorState, FollowCursor
from quorumstore.protocol.log_view import LogView
from quorumstore.protocol.messages import (
    COORDINATOR,
    Ack,
    AckStatus,
    AddFollower,
    Append,
    BecomeLeader,
    BecomeLeaderResponse,
    FollowerStatus,
    Message,
    NewTerm,
    NewTermResponse,
    Outbound,
    Ready,
    SendSnapshot,
    ShardKey,
    ShardStatus,
    SnapshotReceived,
    Truncate,
    TruncateResponse,
)
from quorumstore.protocol.quorum import QuorumAckTracker
from quorumstore.protocol.replica_states import TRANSITIONS, Trigger
from quorumstore.protocol.types import (
    EMPTY_POSITION,
    NO_TERM,
    LogPosition,
    LogReader,
    Role,
    make_entry,
)


class ProtocolError(Exception):
    """A state the protocol forbids; raised instead of continuing with a corrupt replica."""


class NotLeaderError(Exception):
    """A write reached a replica that is not the shard's leader in its current term."""

    def __init__(self, shard: ShardKey, role: Role, term: int, leader_hint: str | None):
        super().__init__(
            f"shard {shard[0]}/{shard[1]}: this replica is {role.value} in term {term}, "
            "not the leader; refresh shard assignments and retry on the leader"
        )
        self.leader_hint = leader_hint


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    max_append_entries: int = 512
    max_append_bytes: int = 4 * 1024 * 1024
    #: Entries pushed to a follower but not yet acked before the leader pauses it.
    max_inflight_entries: int = 8192
    #: Payload bytes pushed to a follower but not yet acked before the leader pauses it
    #: (one Append always goes, however large its entries): what a slow or stalled
    #: follower makes the leader hold in its send queue.
    max_inflight_bytes: int = 64 * 1024 * 1024
    #: Ticks without progress before the leader re-sends from the follower's acked offset.
    retransmit_ticks: int = 4
    #: A snapshot stream gets this many times `retransmit_ticks` before it is restarted.
    snapshot_patience: int = 5


class ShardReplica:
    def __init__(
        self,
        node: str,
        shard: ShardKey,
        log: LogReader,
        *,
        term: int,
        commit_offset: int,
        noop_payload: bytes,
        config: ReplicaConfig = ReplicaConfig(),
        incarnation: str = "",
    ):
        self.node = node
        self.shard = shard
        #: Identity of this replica's data, made with its directory; reported to the
        #: coordinator, which tells a replica that lost its disk by it.
        self.incarnation = incarnation
        self.term = term
        self.role = Role.FENCED if term > NO_TERM else Role.NOT_MEMBER
        #: The term this replica was (re)opened in. It never leads that term: it may have
        #: led it before a crash and sent entries it then lost (unsynced), so leading again
        #: would put other entries at their offsets under the same term. A late or repeated
        #: BecomeLeader of that term is ignored, and the coordinator elects in a new one.
        self._opened_in_term = term
        self.commit_offset = commit_offset
        self.leader: str | None = None
        self.config = config
        self._log = LogView(log)
        self._noop = noop_payload
        #: Highest offset known to match the current term's leader (followers).
        self._matched = -1
        self._ack_due = False
        self._ready = Ready()
        # leader state
        self._tracker: QuorumAckTracker | None = None
        self._cursors: dict[str, FollowCursor] = {}
        self._sent_commit: dict[str, int] = {}

    # ------------------------------------------------------------------ inputs

    def step(self, msg: Message) -> None:
        handler = _HANDLERS.get(type(msg))
        if handler is None:
            raise ProtocolError(f"a replica cannot handle {type(msg).__name__}")
        handler(self, msg)

    def tick(self) -> None:
        if self.role is not Role.LEADER:
            return
        for cursor in self._cursors.values():
            cursor.idle_ticks += 1
            patience = self.config.retransmit_ticks
            if cursor.state is CursorState.SNAPSHOT:
                patience *= self.config.snapshot_patience
            if cursor.idle_ticks < patience:
                if cursor.state is CursorState.REPLICATE:
                    self._send_append(cursor, commit=True)
                continue
            cursor.idle_ticks = 0
            if cursor.state in (CursorState.REPLICATE, CursorState.PROBE):
                cursor.state = CursorState.PROBE
                cursor.next_offset = cursor.acked_offset + 1
                self._send_append(cursor, heartbeat=True)
            elif cursor.state is CursorState.TRUNCATING:
                self._send_truncate(cursor)
            else:
                self._ready.snapshots.append(SendSnapshot(self.shard, self.term, cursor.name))

    def propose(self, payload: bytes) -> int:
        """Appends a client write batch; returns its offset. Committed when `commit_offset` reaches it."""
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.shard, self.role, self.term, self.leader)
        entry = make_entry(self._log.head, self.term, payload)
        self._log.append(entry)
        return entry.offset

    def persisted(self, offset: int) -> None:
        """The driver synced the log up to `offset` (a leader counts its own ack here)."""
        if self.role is Role.LEADER and self._tracker is not None:
            self._tracker.ack(self.node, min(offset, self._log.head.offset))
            self.commit_offset = self._tracker.commit_offset

    def ready(self) -> Ready:
        if self.role is Role.LEADER:
            for cursor in self._cursors.values():
                if cursor.state is CursorState.REPLICATE:
                    self._send_append(cursor)
        if self._ack_due and self.leader is not None:
            self._ack_due = False
            head = self._log.head
            self._send(
                self.leader,
                Ack(
                    self.shard,
                    self.term,
                    self.node,
                    AckStatus.OK,
                    min(head.offset, self._matched),
                    head,
                ),
                after_sync=True,
            )
        ready, self._ready = self._ready, Ready()
        changes = self._log.take()
        ready.truncate_after = changes.truncate_after
        ready.install_snapshot = changes.reset_to
        ready.entries = changes.entries
        ready.commit_offset = self.commit_offset
        return ready

    # ------------------------------------------------------------------ status

    @property
    def head(self) -> LogPosition:
        return self._log.head

    @property
    def matched_offset(self) -> int:
        """A follower's highest offset known to match its leader's log in this term."""
        return self._matched

    def status(self) -> ShardStatus:
        followers: tuple[FollowerStatus, ...] = ()
        if self.role is Role.LEADER:
            followers = tuple(
                FollowerStatus(c.name, c.acked_offset)
                for c in sorted(self._cursors.values(), key=lambda c: c.name)
            )
        return ShardStatus(
            self.shard,
            self.term,
            self.role,
            self._log.head,
            self.commit_offset,
            followers,
            self.incarnation,
        )

    # ------------------------------------------------------------------ helpers

    def _transition(self, trigger: Trigger) -> None:
        new_role = TRANSITIONS.get((self.role, trigger))
        if new_role is None:
            raise ProtocolError(
                f"shard {self.shard}: {trigger.value} is not allowed in state {self.role.value}"
            )
        if self.role is Role.LEADER and new_role is not Role.LEADER:
            self._tracker = None
            self._cursors.clear()
            self._sent_commit.clear()
        self.role = new_role

    def _send(self, to: str, msg: Message, *, after_sync: bool = False) -> None:
        (self._ready.send_after_sync if after_sync else self._ready.send_now).append(
            Outbound(to, msg)
        )

    def _enter_term(self, term: int) -> None:
        self._transition(Trigger.NEW_TERM)
        self.term = term
        self.leader = None
        self._matched = -1
        self._ack_due = False
        self._ready.term = term

    # ------------------------------------------------------------------ coordinator

    def _on_new_term(self, msg: NewTerm) -> None:
        if msg.term < self.term or (msg.term == self.term and self.role is not Role.FENCED):
            return  # stale or duplicate: NewTerm only moves a replica forward
        if msg.term > self.term:
            self._enter_term(msg.term)
        response = NewTermResponse(
            self.shard, self.term, self.node, self._log.head, self.commit_offset, self.incarnation
        )
        self._send(COORDINATOR, response, after_sync=True)

    def _on_become_leader(self, msg: BecomeLeader) -> None:
        if msg.term != self.term or msg.term == self._opened_in_term:
            return
        if self.role is Role.LEADER:
            self._send(
                COORDINATOR, BecomeLeaderResponse(self.shard, self.term, self.node, self._log.head)
            )
            return
        if self.role is not Role.FENCED:
            return
        self._transition(Trigger.BECOME_LEADER)
        self.leader = self.node
        noop_offset = self.propose(self._noop)
        self._tracker = QuorumAckTracker(msg.replication_factor, noop_offset, self.commit_offset)
        for name, head in sorted(msg.follower_map.items()):
            if name != self.node:
                self._start_following(name, head)
        self._send(
            COORDINATOR,
            BecomeLeaderResponse(self.shard, self.term, self.node, self._log.head),
            after_sync=True,
        )

    def _on_add_follower(self, msg: AddFollower) -> None:
        if msg.term != self.term or self.role is not Role.LEADER or msg.follower == self.node:
            return
        existing = self._cursors.get(msg.follower)
        if existing is not None and (
            existing.acked_offset >= 0 or existing.state is CursorState.SNAPSHOT
        ):
            # Already following in this term, or a snapshot to it is under way (the
            # coordinator repeats AddFollower while the follower stays fenced, i.e. until
            # the snapshot is installed): a late duplicate must not reset it.
            return
        self._transition(Trigger.ADD_FOLLOWER)
        self._start_following(msg.follower, msg.follower_head)

    # ------------------------------------------------------------------ leader side

    def _start_following(self, name: str, head: LogPosition) -> None:
        cursor = FollowCursor(name, CursorState.REPLICATE)
        self._cursors[name] = cursor
        self._reconcile(cursor, head)

    def _reconcile(self, cursor: FollowCursor, follower_head: LogPosition) -> None:
        """Decides how a follower whose log ends at `follower_head` catches up.

        docs/protocol.md, "Truncation" and "Snapshots", describes the rule.
        """
        cursor.idle_ticks = 0
        head, base = self._log.head, self._log.base
        fh = follower_head
        if fh.offset < 0 and (self.commit_offset >= 0 or base.offset >= 0):
            self._start_snapshot(cursor)
            return
        if fh.offset < base.offset:
            self._start_snapshot(cursor)
            return
        if self._log.holds(fh):
            # The follower's log is a prefix of ours (chain checksums match): push the rest.
            cursor.state = CursorState.REPLICATE
            cursor.truncate_to = cursor.truncate_from = None
            cursor.next_offset = fh.offset + 1
            if fh.offset > cursor.acked_offset:
                cursor.acked_offset = fh.offset
                assert self._tracker is not None
                self._tracker.ack(cursor.name, fh.offset)
                self.commit_offset = self._tracker.commit_offset
            return
        # The follower holds entries we do not have: cut it back to the last entry of its
        # term (or earlier) that we hold, then check again (strictly lower each round).
        limit = fh.offset - 1 if fh.offset <= head.offset else head.offset
        if limit < base.offset:
            self._start_snapshot(cursor)  # the common prefix lies in what we trimmed
            return
        target = self._log.last_position_in_term_at_most(fh.term, limit)
        if target.offset > limit or target.term > fh.term:
            self._start_snapshot(cursor)  # nothing we still hold can be the common prefix
            return
        cursor.state = CursorState.TRUNCATING
        cursor.truncate_to = target
        cursor.truncate_from = fh
        self._send_truncate(cursor)

    def _send_truncate(self, cursor: FollowCursor) -> None:
        assert cursor.truncate_to is not None and cursor.truncate_from is not None
        self._send(
            cursor.name,
            Truncate(self.shard, self.term, self.node, cursor.truncate_to, cursor.truncate_from),
        )

    def _start_snapshot(self, cursor: FollowCursor) -> None:
        cursor.state = CursorState.SNAPSHOT
        cursor.truncate_to = cursor.truncate_from = None
        self._ready.snapshots.append(SendSnapshot(self.shard, self.term, cursor.name))

    def _send_append(
        self, cursor: FollowCursor, *, heartbeat: bool = False, commit: bool = False
    ) -> None:
        """Pushes what the follower lacks. With nothing to push, an empty Append goes out
        as a heartbeat (or probe), or, with `commit`, when the follower has not been told
        the commit offset yet.

        A commit offset alone waits for the next tick instead of going out at once: under
        load the next entry's Append carries it anyway, and a message per commit would
        double the messages (and their acks) per entry. Followers only apply later for it.
        """
        if cursor.next_offset <= self._log.base.offset:
            self._start_snapshot(cursor)  # what it needs next was trimmed away
            return
        head = self._log.head
        cfg = self.config
        sent = False
        batches = 1 if cursor.state is CursorState.PROBE else cfg.max_inflight_entries
        while (
            cursor.next_offset <= head.offset
            and cursor.last_pushed - cursor.acked_offset < cfg.max_inflight_entries
            and cursor.inflight_bytes() < cfg.max_inflight_bytes
            and batches > 0
        ):
            batches -= 1
            budget = min(
                cfg.max_append_entries,
                cfg.max_inflight_entries - (cursor.last_pushed - cursor.acked_offset),
            )
            entries = tuple(self._log.read(cursor.next_offset, budget, cfg.max_append_bytes))
            if not entries:
                break
            prev = (
                self._log.position_at(cursor.next_offset - 1)
                if cursor.next_offset > 0
                else EMPTY_POSITION
            )
            self._send(
                cursor.name,
                Append(self.shard, self.term, self.node, prev, entries, self.commit_offset),
            )
            cursor.next_offset = entries[-1].offset + 1
            size = sum(len(entry.payload) for entry in entries)
            cursor.pushed.append((entries[-1].offset, size))
            cursor.pushed_bytes += size
            sent = True
        if sent:
            self._sent_commit[cursor.name] = self.commit_offset
            return
        if heartbeat or (commit and self._sent_commit.get(cursor.name, -2) != self.commit_offset):
            # An empty Append carries the commit offset and probes that the prefix matches.
            prev_offset = cursor.next_offset - 1
            prev = self._log.position_at(prev_offset) if prev_offset >= 0 else EMPTY_POSITION
            if prev_offset < self._log.base.offset:
                return
            self._send(
                cursor.name, Append(self.shard, self.term, self.node, prev, (), self.commit_offset)
            )
            self._sent_commit[cursor.name] = self.commit_offset

    def _on_ack(self, msg: Ack) -> None:
        if msg.term != self.term:
            if (
                msg.status is AckStatus.STALE_TERM
                and msg.term > self.term
                and self.role is Role.LEADER
            ):
                self._enter_term(msg.term)  # deposed: a newer term exists
            return
        if self.role is not Role.LEADER:
            return
        cursor = self._cursors.get(msg.follower)
        if cursor is None:
            return
        if msg.status is AckStatus.OK:
            if cursor.state is CursorState.SNAPSHOT:
                self._reconcile(cursor, msg.follower_head)  # the snapshot is installed
                return
            if cursor.state is CursorState.PROBE:
                cursor.state = CursorState.REPLICATE
            if msg.head_offset > cursor.acked_offset:
                cursor.acked_offset = msg.head_offset
                cursor.idle_ticks = 0
                assert self._tracker is not None
                self._tracker.ack(cursor.name, msg.head_offset)
                self.commit_offset = self._tracker.commit_offset
                if cursor.next_offset <= cursor.acked_offset:
                    cursor.next_offset = cursor.acked_offset + 1
            return
        if cursor.state not in (CursorState.REPLICATE, CursorState.PROBE):
            return  # a stale answer: a truncation or snapshot is under way
        if msg.follower_head.offset < 0 <= cursor.acked_offset:
            # An empty log, yet it acked entries in this term: the follower lost its data
            # (a wiped data directory) and was fenced back into this term. Follow it anew,
            # by snapshot; its old acks stay counted, as they were durable when made. Were
            # this answer stale (sent just before a snapshot was installed), it would
            # cost one needless snapshot, nothing more.
            self._start_following(cursor.name, msg.follower_head)
            return
        if msg.follower_head.offset < cursor.acked_offset:
            return  # a stale answer: the follower has moved on
        self._reconcile(cursor, msg.follower_head)

    def _on_truncate_response(self, msg: TruncateResponse) -> None:
        if msg.term != self.term or self.role is not Role.LEADER:
            return
        cursor = self._cursors.get(msg.follower)
        if cursor is None or cursor.state is not CursorState.TRUNCATING:
            return
        self._reconcile(cursor, msg.head)

    # ------------------------------------------------------------------ follower side

    def _refuse_stale(self, leader: str, term: int) -> bool:
        """True when a leader's message must be ignored; tells a stale leader so."""
        if term < self.term:
            self._send(
                leader,
                Ack(self.shard, self.term, self.node, AckStatus.STALE_TERM, -1, self._log.head),
            )
            return True
        if term > self.term or self.role not in (Role.FENCED, Role.FOLLOWER):
            return True  # a term we were not fenced into: only NewTerm moves us forward
        return self.role is Role.FOLLOWER and self.leader != leader

    def _on_append(self, msg: Append) -> None:
        if self._refuse_stale(msg.leader, msg.term):
            return
        log = self._log
        head, base, prev = log.head, log.base, msg.prev
        if prev.offset > head.offset:
            self._send(
                msg.leader,
                Ack(self.shard, self.term, self.node, AckStatus.GAP, -1, head),
                after_sync=True,
            )
            return
        if (
            prev.offset >= base.offset
            and prev.offset >= 0
            and log.position_at(prev.offset).checksum != prev.checksum
        ):
            self._send(
                msg.leader,
                Ack(self.shard, self.term, self.node, AckStatus.MISMATCH, -1, head),
                after_sync=True,
            )
            return
        self._transition(Trigger.REPLICATE)
        self.leader = msg.leader
        last = prev.offset
        for entry in msg.entries:
            if entry.offset <= head.offset and entry.offset <= base.offset:
                last = entry.offset
                continue
            if entry.offset <= head.offset:
                if log.position_at(entry.offset).checksum == entry.checksum:
                    last = entry.offset
                    continue
                self._truncate_local(entry.offset - 1)  # a divergent suffix
            log.append(entry)
            head = log.head
            last = entry.offset
        self._matched = max(self._matched, last)
        self.commit_offset = max(self.commit_offset, min(msg.commit_offset, self._matched))
        self._ack_due = True

    def _truncate_local(self, offset: int) -> None:
        if offset < max(self._matched, self.commit_offset):
            raise ProtocolError(
                f"shard {self.shard}: refusing to truncate to {offset}, below matched "
                f"{self._matched} / committed {self.commit_offset} entries"
            )
        self._log.truncate_after(offset)

    def _on_truncate(self, msg: Truncate) -> None:
        if self._refuse_stale(msg.leader, msg.term):
            return
        target = msg.head
        head = self._log.head
        floor = max(self._matched, self.commit_offset)
        # Only the log the leader decided on is cut: a repeated or late Truncate must not
        # cut entries appended (and acked) since, which a restart makes us forget we
        # matched. Otherwise our head in the answer lets the leader decide again.
        if head == msg.follower_head and floor <= target.offset < head.offset:
            self._log.truncate_after(target.offset)
        self._transition(Trigger.TRUNCATE)
        self.leader = msg.leader
        self._send(
            msg.leader,
            TruncateResponse(self.shard, self.term, self.node, self._log.head),
            after_sync=True,
        )

    def _on_snapshot(self, msg: SnapshotReceived) -> None:
        if self._refuse_stale(msg.leader, msg.term):
            return
        position = msg.position
        if self._log.holds(position):
            # Our log already holds the snapshot's prefix (a late or repeated snapshot, or
            # one that crossed our catching up): keep it, and every entry after it, which
            # we may have acked -- a restart forgets `_matched`, not the acks.
            self._matched = max(self._matched, position.offset)
            self.commit_offset = max(self.commit_offset, position.offset)
        elif position.offset > self.commit_offset and position.offset >= self._matched:
            self._log.reset(position)
            self._matched = position.offset
            self.commit_offset = position.offset
        self._transition(Trigger.SNAPSHOT)
        self.leader = msg.leader
        self._ack_due = True

    def can_install_snapshot(self, term: int, leader: str) -> bool:
        """Whether a snapshot streamed by `leader` in `term` would be accepted now."""
        return (
            term == self.term
            and self.role in (Role.FENCED, Role.FOLLOWER)
            and (self.role is Role.FENCED or self.leader == leader)
        )


#: Each message type's handler (each takes its own type; `step` dispatches by type).
_HANDLERS: dict[type, Callable[[ShardReplica, Any], None]] = {
    NewTerm: ShardReplica._on_new_term,
    BecomeLeader: ShardReplica._on_become_leader,
    AddFollower: ShardReplica._on_add_follower,
    Ack: ShardReplica._on_ack,
    TruncateResponse: ShardReplica._on_truncate_response,
    Append: ShardReplica._on_append,
    Truncate: ShardReplica._on_truncate,
    SnapshotReceived: ShardReplica._on_snapshot,
}
