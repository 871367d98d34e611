"""A new leader's reconcile of a follower against the data-driven cases in
testdata/reconcile.txt."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumstore.protocol.memory_log import MemoryLog
from quorumstore.protocol.messages import AddFollower, Append, BecomeLeader, NewTerm, Truncate
from quorumstore.protocol.replica import ShardReplica
from quorumstore.protocol.types import make_entry

SHARD = ("default", 0)
TERM = 4

CASES = [
    line
    for line in (Path(__file__).parent / "testdata" / "reconcile.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def _log_with(terms: str) -> MemoryLog:
    """A synced log whose entry at offset i has term terms[i] and payload naming both."""
    log = MemoryLog()
    for offset, term in enumerate([] if terms == "-" else [int(t) for t in terms.split(",")]):
        log.append([make_entry(log.head, term, f"t{term}o{offset}".encode())])
    log.sync()
    return log


def _drive(replica: ShardReplica, log: MemoryLog, msg: object) -> list[object]:
    """Steps `replica` with `msg`, persists what it writes and returns what it sends."""
    replica.step(msg)  # type: ignore[arg-type]
    ready = replica.ready()
    if ready.entries:
        log.append(ready.entries)
    log.sync()
    if ready.has_storage_work():
        replica.persisted(log.head.offset)
    sent = [out.message for out in ready.send_now + ready.send_after_sync]
    return sent + list(ready.snapshots)


@pytest.mark.parametrize("case", CASES)
def test_reconcile(case: str) -> None:
    leader_terms, follower_terms, expected = (part.strip() for part in case.split("|"))
    log = _log_with(leader_terms)
    leader = ShardReplica(
        "leader", SHARD, log, term=log.head.term, commit_offset=-1, noop_payload=b"noop"
    )
    _drive(leader, log, NewTerm(SHARD, TERM))
    _drive(leader, log, BecomeLeader(SHARD, TERM, 3, {}))
    follower_head = _log_with(follower_terms).head
    sent = _drive(leader, log, AddFollower(SHARD, TERM, "f", follower_head))
    actions = []
    for message in sent:
        if isinstance(message, Truncate):
            actions.append(f"truncate to {message.head.term}.{message.head.offset}")
        elif isinstance(message, Append) and message.entries:
            actions.append(f"append from {message.entries[0].offset}")
        else:
            actions.append(type(message).__name__)  # a snapshot, or anything unexpected
    assert actions == [expected]
