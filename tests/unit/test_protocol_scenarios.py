"""The scenarios of docs/protocol.md, replayed on the real engine (each cites its section).

A tiny synchronous driver plays the node role: it applies each `Ready` to an in-memory
log, syncs it, and hands the messages to their destination, in order, until nothing
is left to deliver.
"""

from __future__ import annotations

import pytest

from quorumstore.protocol.memory_log import MemoryLog
from quorumstore.protocol.messages import (
    COORDINATOR,
    Ack,
    AckStatus,
    AddFollower,
    Append,
    BecomeLeader,
    NewTerm,
    Outbound,
    SnapshotReceived,
    Truncate,
)
from quorumstore.protocol.replica import NotLeaderError, ShardReplica
from quorumstore.protocol.types import LogPosition, Role, make_entry

SHARD = ("default", 0)
NOOP = b"noop"


def _log_with(terms: list[int]) -> MemoryLog:
    """A synced log whose entry at offset i has term terms[i] and payload naming both."""
    log = MemoryLog()
    for offset, term in enumerate(terms):
        log.append([make_entry(log.head, term, f"t{term}o{offset}".encode())])
    log.sync()
    return log


class Cluster:
    def __init__(self, logs: dict[str, MemoryLog], term: int):
        self.logs = logs
        self.replicas = {
            name: ShardReplica(name, SHARD, log, term=term, commit_offset=-1, noop_payload=NOOP)
            for name, log in logs.items()
        }
        self.delivered: list[Outbound] = []
        self.to_coordinator: list[Outbound] = []
        self._queue: list[tuple[str, Outbound]] = []

    def _drive(self, name: str) -> None:
        replica, log = self.replicas[name], self.logs[name]
        ready = replica.ready()
        if ready.truncate_after is not None:
            log.truncate_after(ready.truncate_after)
        if ready.entries:
            log.append(ready.entries)
        log.sync()
        for out in ready.send_now + ready.send_after_sync:
            self._queue.append((name, out))
        if ready.has_storage_work():
            replica.persisted(log.head.offset)
            self._drive(name)

    def step(self, name: str, msg: object) -> None:
        self.replicas[name].step(msg)  # type: ignore[arg-type]
        self._drive(name)

    def run(self) -> None:
        while self._queue:
            _, out = self._queue.pop(0)
            self.delivered.append(out)
            if out.to == COORDINATOR:
                self.to_coordinator.append(out)
            elif out.to in self.replicas:
                self.step(out.to, out.message)

    def entries(self, name: str) -> list[tuple[int, int]]:
        log = self.logs[name]
        return [
            (log.position_at(o).term, o) for o in range(log.base.offset + 1, log.head.offset + 1)
        ]


def test_add_follower_catches_up_a_follower_that_is_behind():
    """Leader choice (AddFollower): leader head 7, follower not in the fencing quorum at head 5."""
    common = [1, 1, 2, 2, 3, 3]  # offsets 0..5
    cluster = Cluster({"leader": _log_with(common + [3, 3]), "f4": _log_with(common)}, term=3)
    cluster.step("leader", NewTerm(SHARD, 4))
    cluster.step("leader", BecomeLeader(SHARD, 4, 3, {}))
    cluster.step("f4", NewTerm(SHARD, 4))
    cluster.step("leader", AddFollower(SHARD, 4, "f4", cluster.logs["f4"].head))
    cluster.run()
    appended = [
        e.offset
        for out in cluster.delivered
        if isinstance(out.message, Append)
        for e in out.message.entries
    ]
    assert appended[:2] == [
        6,
        7,
    ]  # the entries the follower lacked, in order (then the leader's noop)
    assert not any(isinstance(out.message, Truncate) for out in cluster.delivered)
    assert cluster.entries("f4") == cluster.entries("leader")
    assert cluster.replicas["f4"].role is Role.FOLLOWER
    assert cluster.replicas["leader"].commit_offset == 8  # noop of term 4 committed by the quorum


def test_truncate_follower_ahead_of_the_new_leader():
    """Truncation: follower head 8 of the previous term, leader head 7."""
    previous = [1, 1, 2, 2, 3, 3, 3, 3]  # offsets 0..7
    cluster = Cluster({"leader": _log_with(previous), "f5": _log_with(previous + [3])}, term=3)
    cluster.step("leader", NewTerm(SHARD, 4))
    cluster.step("leader", BecomeLeader(SHARD, 4, 3, {}))
    cluster.step("f5", NewTerm(SHARD, 4))
    cluster.step("leader", AddFollower(SHARD, 4, "f5", cluster.logs["f5"].head))
    cluster.run()
    truncates = [out.message for out in cluster.delivered if isinstance(out.message, Truncate)]
    assert [t.head.offset for t in truncates] == [7]
    assert truncates[0].term == 4
    assert cluster.entries("f5") == cluster.entries("leader")
    assert cluster.entries("f5")[-1] == (4, 8)  # offset 8 now holds the leader's term-4 entry


def test_divergent_older_term_entries_are_replaced_before_following():
    """Truncation: a follower whose tail holds another term's entries at the same offsets."""
    cluster = Cluster({"leader": _log_with([1, 1, 3, 3]), "f": _log_with([1, 1, 2, 2, 2])}, term=3)
    cluster.step("leader", NewTerm(SHARD, 4))
    cluster.step("f", NewTerm(SHARD, 4))
    cluster.step("leader", BecomeLeader(SHARD, 4, 2, {"f": cluster.logs["f"].head}))
    cluster.run()
    assert cluster.entries("f") == cluster.entries("leader")
    assert cluster.replicas["leader"].commit_offset == 4


def test_a_stale_term_leader_steps_down_and_its_appends_are_refused():
    """Terms and fencing: requests from an older generation are rejected; the old leader passivates."""
    cluster = Cluster({"old": _log_with([1]), "f": _log_with([1])}, term=1)
    cluster.step("old", NewTerm(SHARD, 2))
    cluster.step("f", NewTerm(SHARD, 2))
    cluster.step("old", BecomeLeader(SHARD, 2, 2, {"f": cluster.logs["f"].head}))
    cluster.run()
    old = cluster.replicas["old"]
    assert old.role is Role.LEADER and old.commit_offset == 1
    # A new term reaches the follower only (the old leader is partitioned from the coordinator).
    cluster.step("f", NewTerm(SHARD, 3))
    cluster.run()
    offset = old.propose(b"zombie write")
    cluster._drive("old")
    cluster.run()
    refusals = [
        out.message
        for out in cluster.delivered
        if isinstance(out.message, Ack) and out.message.status is AckStatus.STALE_TERM
    ]
    assert refusals and all(r.term == 3 for r in refusals)
    assert old.role is Role.FENCED and old.term == 3
    assert old.commit_offset < offset  # the zombie's write never committed
    assert cluster.logs["f"].head.offset == 1  # and never reached the follower's log
    try:
        old.propose(b"again")
    except NotLeaderError:
        pass
    else:
        raise AssertionError("a fenced replica accepted a write")


def test_commit_offset_needs_a_majority_of_acks():
    """Replication and the commit rule: the leader commits an entry once a majority (itself included) holds it."""
    logs = {name: MemoryLog() for name in ("l", "f1", "f2")}
    cluster = Cluster(logs, term=-1)
    for name in logs:
        cluster.step(name, NewTerm(SHARD, 0))
    empty = LogPosition(-1, -1, 0)
    cluster.step("l", BecomeLeader(SHARD, 0, 3, {"f1": empty}))  # f2 stays silent
    cluster.run()
    leader = cluster.replicas["l"]
    offset = leader.propose(b"x=4")
    cluster._drive("l")
    cluster.run()
    assert leader.commit_offset == offset  # leader + f1 of 3
    # A commit offset alone is not pushed at once: the next Append or tick carries it.
    assert cluster.replicas["f1"].commit_offset == offset - 1
    leader.tick()
    cluster._drive("l")
    cluster.run()
    assert cluster.replicas["f1"].commit_offset == offset
    assert logs["f2"].head.offset == -1


def test_a_late_snapshot_never_discards_entries_the_follower_holds():
    """Snapshots: a follower that restarted (so forgot which offsets it matched) receives a snapshot
    of a prefix its log already holds -- delayed, or repeated: it keeps its log, whose
    tail it may have acked, and acks its real head."""
    log = _log_with([4, 4, 4])
    # Restarted: nothing matched yet in this term, nothing known committed.
    follower = ShardReplica("f", SHARD, log, term=4, commit_offset=-1, noop_payload=NOOP)
    prefix = log.position_at(0)
    follower.step(SnapshotReceived(SHARD, 4, "leader", prefix))
    ready = follower.ready()
    assert ready.install_snapshot is None and ready.truncate_after is None
    assert log.head.offset == 2 and follower.role is Role.FOLLOWER
    assert follower.commit_offset == 0 and follower.matched_offset == 0
    (ack,) = [out.message for out in ready.send_after_sync if isinstance(out.message, Ack)]
    assert ack.status is AckStatus.OK and ack.follower_head == log.head
    # A snapshot of a position the log does not hold still replaces it.
    other = LogPosition(4, 5, 123)
    follower.step(SnapshotReceived(SHARD, 4, "leader", other))
    assert follower.ready().install_snapshot == other


def test_a_repeated_truncate_never_cuts_entries_the_follower_acked_since():
    """Truncation: a follower is truncated, catches up and acks; it restarts (forgetting which offsets
    it matched) and a repeat of the old Truncate arrives: its log, acked entries
    included, stays as it is, and the leader still converges it."""
    cluster = Cluster({"leader": _log_with([1, 1, 3, 3]), "f": _log_with([1, 1, 2, 2, 2])}, term=3)
    cluster.step("leader", NewTerm(SHARD, 4))
    cluster.step("f", NewTerm(SHARD, 4))
    cluster.step("leader", BecomeLeader(SHARD, 4, 2, {"f": cluster.logs["f"].head}))
    cluster.run()
    (truncate,) = [out.message for out in cluster.delivered if isinstance(out.message, Truncate)]
    assert cluster.entries("f") == cluster.entries("leader")
    acked = cluster.logs["f"].head
    assert cluster.replicas["leader"].commit_offset == acked.offset == 4

    cluster.replicas["f"] = ShardReplica(
        "f", SHARD, cluster.logs["f"], term=4, commit_offset=-1, noop_payload=NOOP
    )
    cluster.step("f", truncate)
    assert cluster.logs["f"].head == acked
    cluster.run()
    assert cluster.entries("f") == cluster.entries("leader")


def test_a_restarted_leader_does_not_lead_its_term_again():
    """A leader crashes with an entry it sent but never synced; a late BecomeLeader of that
    term reaches it after the restart. Leading again would put another entry at that
    offset under the same term, so it stays fenced until a new term elects it."""
    log = _log_with([3, 3])
    leader = ShardReplica("l", SHARD, log, term=3, commit_offset=-1, noop_payload=NOOP)
    leader.step(NewTerm(SHARD, 4))
    leader.ready()
    leader.step(BecomeLeader(SHARD, 4, 3, {}))
    lost = leader.propose(b"sent to followers, never synced")
    assert lost == 3 and leader.ready().entries  # the noop (2) and the write, unsynced
    # Crash: the synced log is what remains; the term was persisted.
    restarted = ShardReplica("l", SHARD, log, term=4, commit_offset=-1, noop_payload=NOOP)
    restarted.step(BecomeLeader(SHARD, 4, 3, {}))
    ready = restarted.ready()
    assert restarted.role is Role.FENCED and not ready.entries and not ready.send_after_sync
    with pytest.raises(NotLeaderError):
        restarted.propose(b"another entry at the same offset")
    # A new term elects it as usual.
    restarted.step(NewTerm(SHARD, 5))
    restarted.step(BecomeLeader(SHARD, 5, 3, {}))
    assert restarted.role is Role.LEADER and restarted.term == 5
