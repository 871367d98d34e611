"""How much a leader pushes to a follower that does not answer (the in-flight windows)."""

from __future__ import annotations

from quorumstore.protocol.memory_log import MemoryLog
from quorumstore.protocol.messages import Ack, AckStatus, Append, BecomeLeader, NewTerm
from quorumstore.protocol.replica import ReplicaConfig, ShardReplica
from quorumstore.protocol.types import EMPTY_POSITION

SHARD = ("default", 0)
MIB = 1024 * 1024


def _pushed_to(replica: ShardReplica, log: MemoryLog, follower: str) -> list[Append]:
    """The Appends one `ready()` sends to `follower`; the leader's own log is synced."""
    ready = replica.ready()
    if ready.entries:
        log.append(ready.entries)
        log.sync()
        replica.persisted(log.head.offset)
    return [
        out.message
        for out in ready.send_now + ready.send_after_sync
        if out.to == follower and isinstance(out.message, Append) and out.message.entries
    ]


def test_a_silent_follower_gets_at_most_the_byte_window_and_more_as_it_acks() -> None:
    """Large entries to a follower that stopped answering (paused, partitioned) pile up in
    the leader's send queue: the entry-count window alone let 8,192 of them queue (8 GiB
    of 1 MiB entries). The byte window stops the pushes at 8 MiB here; each Ack opens it
    again by what it acknowledged; one Append always goes, however large."""
    log = MemoryLog()
    leader = ShardReplica(
        "a",
        SHARD,
        log,
        term=-1,
        commit_offset=-1,
        noop_payload=b"noop",
        config=ReplicaConfig(max_append_entries=1, max_inflight_bytes=8 * MIB),
    )
    leader.step(NewTerm(SHARD, 1))
    leader.step(BecomeLeader(SHARD, 1, 3, {"b": EMPTY_POSITION, "c": EMPTY_POSITION}))
    pushed = _pushed_to(leader, log, "b")  # the term's noop
    for _ in range(40):
        leader.propose(b"x" * MIB)
    pushed += _pushed_to(leader, log, "b")
    in_flight = sum(len(e.payload) for a in pushed for e in a.entries)
    assert 8 * MIB <= in_flight < 9 * MIB, in_flight
    assert _pushed_to(leader, log, "b") == []  # nothing more while b is silent

    acked = pushed[3].entries[-1].offset  # b acks its first four Appends (3 MiB + the noop)
    leader.step(Ack(SHARD, 1, "b", AckStatus.OK, acked, log.position_at(acked)))
    more = _pushed_to(leader, log, "b")
    assert sum(len(e.payload) for a in more for e in a.entries) == 3 * MIB
    assert more[0].entries[0].offset == pushed[-1].entries[-1].offset + 1

    # b acks all it gets until it has every entry; then one entry larger than the window.
    while more:
        last = more[-1].entries[-1].offset
        leader.step(Ack(SHARD, 1, "b", AckStatus.OK, last, log.position_at(last)))
        more = _pushed_to(leader, log, "b")
    assert last == log.head.offset
    leader.propose(b"y" * (20 * MIB))
    (huge,) = _pushed_to(leader, log, "b")
    assert len(huge.entries[0].payload) == 20 * MIB
