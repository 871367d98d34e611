"""Why the coordinator re-elects a leader, and that it says why.

Every election pauses a shard's writes, so an operator must be able to tell a real fault
from a false suspicion in the coordinator's log. The engine is driven directly: its
inputs are messages and ticks, its outputs the messages it sends.
"""

from __future__ import annotations

import logging

import pytest

from quorumstore.protocol.coordinator import (
    Coordinator,
    CoordinatorConfig,
    ShardState,
    initial_metadata,
)
from quorumstore.protocol.messages import (
    BecomeLeader,
    BecomeLeaderResponse,
    FollowerStatus,
    NewTerm,
    NewTermResponse,
    NodeStatus,
    NodeUnreachable,
    ShardStatus,
)
from quorumstore.protocol.types import LogPosition, Role

NODES = ["a", "b", "c"]
SHARD = ("default", 0)
HEAD = LogPosition(term=-1, offset=-1, checksum=0)
CONFIG = CoordinatorConfig(node_failure_ticks=5)


def _online_coordinator() -> tuple[Coordinator, str]:
    """A coordinator whose one shard has an elected leader; returns it and the leader."""
    coordinator = Coordinator(NODES, initial_metadata(NODES, {"default": 1}, 3), CONFIG)
    coordinator.tick()
    new_terms = [out for out in coordinator.ready().messages if isinstance(out.message, NewTerm)]
    term = new_terms[0].message.term
    for out in new_terms:
        coordinator.step(NewTermResponse(SHARD, term, out.to, HEAD, -1))
    (become,) = [
        out for out in coordinator.ready().messages if isinstance(out.message, BecomeLeader)
    ]
    coordinator.step(BecomeLeaderResponse(SHARD, term, become.to, HEAD))
    assert coordinator.shard(SHARD).state is ShardState.ONLINE
    _report_all(coordinator, become.to)
    return coordinator, become.to


def _report(coordinator: Coordinator, node: str, role: Role, head: LogPosition = HEAD) -> None:
    meta = coordinator.shard(SHARD)
    coordinator.step(NodeStatus(node, (ShardStatus(SHARD, meta.term, role, head, -1),)))


def _report_followers(coordinator: Coordinator, leader: str) -> None:
    for node in NODES:
        if node != leader:
            _report(coordinator, node, Role.FOLLOWER)


def _report_all(coordinator: Coordinator, leader: str) -> None:
    _report(coordinator, leader, Role.LEADER)
    _report_followers(coordinator, leader)


def test_a_reporting_leader_keeps_its_term() -> None:
    coordinator, leader = _online_coordinator()
    term = coordinator.shard(SHARD).term
    for _ in range(50):
        coordinator.tick()
        _report_all(coordinator, leader)
    assert (coordinator.shard(SHARD).term, coordinator.shard(SHARD).leader) == (term, leader)


def test_a_silent_leader_is_replaced_once_the_failure_timeout_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    coordinator, leader = _online_coordinator()
    term = coordinator.shard(SHARD).term
    for _ in range(CONFIG.node_failure_ticks):
        coordinator.tick()
        _report_followers(coordinator, leader)  # the leader says nothing
        assert coordinator.shard(SHARD).term == term, "replaced before the failure timeout"
    with caplog.at_level(logging.INFO, logger="quorumstore.protocol.coordinator"):
        coordinator.tick()
    assert coordinator.shard(SHARD).term == term + 1
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"shard default/0: election for term {term + 1}: leader {leader} sent no health report in 5 ticks"
    )


def _silent_leader_election(coordinator: Coordinator, leader: str) -> list[NewTerm]:
    """Ticks until the silent leader's shard is re-elected (its followers were in sync);
    returns the NewTerm messages."""
    meta = coordinator.shard(SHARD)
    in_sync = tuple(FollowerStatus(node, -1) for node in NODES if node != leader)
    status = ShardStatus(SHARD, meta.term, Role.LEADER, HEAD, -1, in_sync)
    coordinator.step(NodeStatus(leader, (status,)))
    coordinator.ready()
    for _ in range(CONFIG.node_failure_ticks + 1):
        coordinator.tick()
        _report_followers(coordinator, leader)
    return [out for out in coordinator.ready().messages if isinstance(out.message, NewTerm)]


def test_a_failed_leader_is_not_waited_for_once_the_others_answer() -> None:
    """The grace after a majority's answers waits for live members with perhaps longer
    logs; a member that sends no health reports would answer only after it recovers."""
    coordinator, leader = _online_coordinator()
    new_terms = _silent_leader_election(coordinator, leader)
    for out in new_terms:
        if out.to != leader:
            coordinator.step(NewTermResponse(SHARD, out.message.term, out.to, HEAD, -1))
    become = [out for out in coordinator.ready().messages if isinstance(out.message, BecomeLeader)]
    assert [out.to for out in become] and become[0].to != leader


def test_a_live_member_is_given_the_grace_to_answer() -> None:
    """A follower that reports but has not answered NewTerm yet may hold the longest log."""
    coordinator, leader = _online_coordinator()
    new_terms = _silent_leader_election(coordinator, leader)
    first, slow = [out.to for out in new_terms if out.to != leader]
    term = new_terms[0].message.term
    coordinator.step(NewTermResponse(SHARD, term, leader, HEAD, -1))  # it answers after all
    coordinator.step(NewTermResponse(SHARD, term, first, HEAD, -1))
    assert not [m for m in coordinator.ready().messages if isinstance(m.message, BecomeLeader)]
    longer = LogPosition(term=0, offset=5, checksum=1)
    coordinator.step(NewTermResponse(SHARD, term, slow, longer, -1))
    (become,) = [m for m in coordinator.ready().messages if isinstance(m.message, BecomeLeader)]
    assert become.to == slow


def test_an_unreachable_leader_is_replaced_at_the_next_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    coordinator, leader = _online_coordinator()
    term = coordinator.shard(SHARD).term
    coordinator.tick()
    _report_all(coordinator, leader)
    coordinator.step(NodeUnreachable(leader))
    with caplog.at_level(logging.INFO, logger="quorumstore.protocol.coordinator"):
        coordinator.tick()
    assert coordinator.shard(SHARD).term == term + 1
    assert [r.getMessage() for r in caplog.records] == [
        f"shard default/0: election for term {term + 1}: leader {leader} is unreachable (its health stream broke)"
    ]


def test_a_leader_that_restarted_in_its_term_is_replaced(caplog: pytest.LogCaptureFixture) -> None:
    """It reports Fenced with its durable no-op entry of the term as head."""
    coordinator, leader = _online_coordinator()
    term = coordinator.shard(SHARD).term
    with caplog.at_level(logging.INFO, logger="quorumstore.protocol.coordinator"):
        _report(coordinator, leader, Role.FENCED, LogPosition(term, 0, 7))
    assert coordinator.shard(SHARD).term == term + 1
    assert [r.getMessage() for r in caplog.records] == [
        f"shard default/0: election for term {term + 1}: leader {leader} reports FENCED in term {term}"
    ]


def test_the_first_election_of_a_new_cluster_is_logged_as_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="quorumstore.protocol.coordinator"):
        _, leader = _online_coordinator()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.INFO,
            "shard default/0: election for term 0: no election under way for term -1 (state election)",
        ),
        (logging.INFO, f"shard default/0: {leader} leads term 0"),
    ]


def test_a_report_made_before_the_leader_took_office_is_not_a_fault() -> None:
    """Health reports and BecomeLeader answers use different gRPC calls: the leader's
    report made just before it handled BecomeLeader (Fenced, its head of an older term)
    can be read after its answer. It must not start another election."""
    coordinator, leader = _online_coordinator()
    term = coordinator.shard(SHARD).term
    _report(coordinator, leader, Role.FENCED, HEAD)
    assert (coordinator.shard(SHARD).term, coordinator.shard(SHARD).leader) == (term, leader)


def test_a_leader_fenced_with_an_older_head_is_replaced_after_the_grace() -> None:
    """Had it lost its no-op entry (no fsync and a machine crash), waiting would never end."""
    coordinator, leader = _online_coordinator()
    term = coordinator.shard(SHARD).term
    for _ in range(CONFIG.node_failure_ticks + 1):
        coordinator.tick()
        _report_all(coordinator, leader)
    _report(coordinator, leader, Role.FENCED, HEAD)
    assert coordinator.shard(SHARD).term == term + 1


def _report_commit(coordinator: Coordinator, leader: str, commit: int) -> None:
    meta = coordinator.shard(SHARD)
    head = LogPosition(term=meta.term, offset=commit, checksum=0)
    coordinator.step(
        NodeStatus(leader, (ShardStatus(SHARD, meta.term, Role.LEADER, head, commit),))
    )


def test_an_advancing_commit_offset_is_saved_now_and_then() -> None:
    """A restarted coordinator knows the commit offset from its saved metadata, so the
    offset is saved when it first advances and then at most every commit_save_ticks."""
    coordinator, leader = _online_coordinator()
    coordinator.ready()
    saved = []
    for tick in range(3 * CONFIG.commit_save_ticks):
        coordinator.tick()
        _report_followers(coordinator, leader)
        _report_commit(coordinator, leader, commit=tick)
        if (metadata := coordinator.ready().metadata) is not None:
            saved.append(metadata.shards[SHARD].known_commit_offset)
    assert saved == [0, CONFIG.commit_save_ticks, 2 * CONFIG.commit_save_ticks]


def test_a_restarted_coordinator_does_not_elect_a_replica_that_lost_the_committed_log() -> None:
    coordinator, leader = _online_coordinator()
    coordinator.ready()
    coordinator.tick()
    _report_followers(coordinator, leader)
    _report_commit(coordinator, leader, commit=7)
    saved = coordinator.ready().metadata
    assert saved is not None and saved.shards[SHARD].known_commit_offset == 7

    restarted = Coordinator(NODES, saved, CONFIG)
    for _ in range(CONFIG.node_failure_ticks + 2):  # nobody reports: the leader is replaced
        restarted.tick()
    new_terms = [out for out in restarted.ready().messages if isinstance(out.message, NewTerm)]
    assert new_terms
    for out in new_terms:  # every replica answers with an empty log
        restarted.step(NewTermResponse(SHARD, out.message.term, out.to, HEAD, -1))
    for _ in range(CONFIG.election_grace_ticks + 1):
        restarted.tick()
    sent = restarted.ready().messages
    assert not [out for out in sent if isinstance(out.message, BecomeLeader)]
    assert restarted.shard(SHARD).state is ShardState.OFFLINE


def test_a_leader_found_restarted_by_a_restarted_coordinator_is_replaced_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A whole cluster restarted: the saved leader comes back Fenced. Nothing serving is
    displaced, so the election is info, not a warning on every shard of every restart."""
    coordinator, leader = _online_coordinator()
    restarted = Coordinator(NODES, coordinator.metadata, CONFIG)
    term = restarted.shard(SHARD).term
    with caplog.at_level(logging.INFO, logger="quorumstore.protocol.coordinator"):
        _report(restarted, leader, Role.FENCED, LogPosition(term, 0, 7))
    assert restarted.shard(SHARD).term == term + 1
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.INFO,
            f"shard default/0: election for term {term + 1}: leader {leader} reports FENCED in term {term}",
        )
    ]


def test_a_leader_seen_leading_by_a_restarted_coordinator_is_a_warning_when_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    coordinator, leader = _online_coordinator()
    restarted = Coordinator(NODES, coordinator.metadata, CONFIG)
    term = restarted.shard(SHARD).term
    _report(restarted, leader, Role.LEADER, LogPosition(term, 0, 7))
    with caplog.at_level(logging.INFO, logger="quorumstore.protocol.coordinator"):
        _report(restarted, leader, Role.FENCED, LogPosition(term, 0, 7))
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
