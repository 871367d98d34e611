"""The coordinator and replicas that lost their disk (docs/protocol.md, "Replicas that
lose their disk").

A replica reports the incarnation of its data; one that answers with another than the
shard counts on restarted with an empty disk. It must not count toward an election's
majority nor lead until a leader caught it up, or a committed entry could be lost. The
engine is driven directly: its inputs are messages and ticks, its outputs the messages
it sends.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from quorumstore.protocol.coordinator import (
    Coordinator,
    CoordinatorConfig,
    ShardState,
    initial_metadata,
)
from quorumstore.protocol.messages import (
    AddFollower,
    BecomeLeader,
    BecomeLeaderResponse,
    FollowerStatus,
    NewTerm,
    NewTermResponse,
    NodeStatus,
    Outbound,
    ShardStatus,
)
from quorumstore.protocol.types import EMPTY_POSITION, LogPosition, Role
from quorumstore.wire import replication as wire

NODES = ["a", "b", "c"]
SHARD = ("default", 0)
CONFIG = CoordinatorConfig(node_failure_ticks=5)
#: The incarnations the shard counts on after `_online`.
FIRST = {"a": "a-1", "b": "b-1", "c": "c-1"}


def _pos(term: int, offset: int) -> LogPosition:
    return LogPosition(term, offset, checksum=offset)


def _sent(coordinator: Coordinator) -> list[Outbound]:
    return coordinator.ready().messages


def _answer(
    coordinator: Coordinator, node: str, head: LogPosition, incarnation: str | None = None
) -> None:
    term = coordinator.shard(SHARD).term
    coordinator.step(NewTermResponse(SHARD, term, node, head, -1, incarnation or FIRST[node]))


def _report(
    coordinator: Coordinator,
    node: str,
    role: Role,
    head: LogPosition,
    *,
    incarnation: str | None = None,
    followers: dict[str, int] | None = None,
    term: int | None = None,
    commit: int | None = None,
) -> None:
    meta = coordinator.shard(SHARD)
    status = ShardStatus(
        SHARD,
        meta.term if term is None else term,
        role,
        head,
        head.offset if commit is None else commit,
        tuple(FollowerStatus(name, acked) for name, acked in (followers or {}).items()),
        incarnation or FIRST[node],
    )
    coordinator.step(NodeStatus(node, (status,)))


def _elect(coordinator: Coordinator, heads: dict[str, LogPosition], **incarnations: str) -> str:
    """Answers the NewTerm of an election under way for `heads`' nodes; returns whom the
    coordinator asked to lead, after confirming it."""
    for node, head in heads.items():
        _answer(coordinator, node, head, incarnations.get(node))
    for _ in range(CONFIG.election_grace_ticks + 1):
        coordinator.tick()
    [become] = [out for out in _sent(coordinator) if isinstance(out.message, BecomeLeader)]
    term = coordinator.shard(SHARD).term
    coordinator.step(
        BecomeLeaderResponse(SHARD, term, become.to, _pos(term, heads[become.to].offset + 1))
    )
    assert coordinator.shard(SHARD).state is ShardState.ONLINE
    return become.to


def _online() -> tuple[Coordinator, str]:
    """A shard online in term 0 whose members reported the incarnations FIRST; returns
    the coordinator and the leader."""
    coordinator = Coordinator(NODES, initial_metadata(NODES, {"default": 1}, 3), CONFIG)
    coordinator.tick()
    leader = _elect(coordinator, {node: EMPTY_POSITION for node in NODES})
    assert coordinator.shard(SHARD).incarnations == FIRST
    return coordinator, leader


def _tick_until_election(coordinator: Coordinator) -> int:
    term = coordinator.shard(SHARD).term
    coordinator.tick()
    assert coordinator.shard(SHARD).term == term + 1, "no new election"
    _sent(coordinator)
    return term + 1


def test_a_members_first_incarnation_is_recorded_and_saved() -> None:
    coordinator = Coordinator(NODES, initial_metadata(NODES, {"default": 1}, 3), CONFIG)
    coordinator.tick()
    coordinator.ready()
    _answer(coordinator, "a", EMPTY_POSITION)
    saved = coordinator.ready().metadata
    assert saved is not None and saved.shards[SHARD].incarnations == {"a": "a-1"}


def test_metadata_without_incarnations_records_the_first_reported() -> None:
    """Metadata saved before incarnations existed, or rebuilt after it was lost: each
    member's replica is taken as the data the shard always counted on."""
    coordinator, leader = _online()
    old = coordinator.metadata
    old.shards[SHARD] = replace(old.shards[SHARD], incarnations={})
    restarted = Coordinator(NODES, old, CONFIG)
    for node in NODES:
        role = Role.LEADER if node == leader else Role.FOLLOWER
        _report(restarted, node, role, _pos(0, 3), incarnation=f"{node}-new")
    saved = restarted.ready().metadata
    assert saved is not None
    assert saved.shards[SHARD].incarnations == {node: f"{node}-new" for node in NODES}
    assert saved.shards[SHARD].term == old.shards[SHARD].term, "nothing was re-elected"


def test_an_answer_from_a_replica_that_lost_its_disk_does_not_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The case of the problem: an entry committed on a and b only; a's disk is lost and
    b is down. a (empty) and c (behind) are no majority: nobody is elected, however long
    the coordinator waits, and when b answers it leads (it holds the entry)."""
    coordinator, _ = _online()
    _tick_until_election_after_the_leader_reports_no_replica(coordinator)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="quorumstore.protocol.coordinator"):
        _answer(coordinator, "a", EMPTY_POSITION, "a-2")
    [warning] = caplog.records
    assert warning.getMessage() == (
        "shard default/0: a lost its data (incarnation a-2, not a-1): it counts toward "
        "elections again once a leader has caught it up"
    )
    _answer(coordinator, "c", _pos(0, 5))
    for _ in range(20):
        coordinator.tick()
        assert not [out for out in _sent(coordinator) if isinstance(out.message, BecomeLeader)]
    assert coordinator.shard(SHARD).leader is None
    assert coordinator.shard(SHARD).incarnations["a"] == "a-1"
    _answer(coordinator, "b", _pos(0, 7))
    [become] = [out for out in _sent(coordinator) if isinstance(out.message, BecomeLeader)]
    assert become.to == "b"
    assert isinstance(become.message, BecomeLeader)
    assert become.message.follower_map == {"a": EMPTY_POSITION, "c": _pos(0, 5)}


def _tick_until_election_after_the_leader_reports_no_replica(coordinator: Coordinator) -> None:
    """The shard's leader reports no replica of it: a new election, whoever leads."""
    leader = coordinator.shard(SHARD).leader
    assert leader is not None
    coordinator.step(NodeStatus(leader, ()))
    assert coordinator.shard(SHARD).state is ShardState.ELECTION
    _sent(coordinator)


def test_a_replica_that_lost_its_disk_neither_leads_nor_joins_the_live_set() -> None:
    """Even with the highest head (its new replica got entries since): the top answer
    that counts leads; every member whose data counts answered, so it may even lag."""
    coordinator, _ = _online()
    _tick_until_election_after_the_leader_reports_no_replica(coordinator)
    meta = coordinator.shard(SHARD)
    coordinator._meta[SHARD] = replace(meta, eligible=frozenset({"a", "b"}))
    leader = _elect(coordinator, {"a": _pos(0, 9), "b": _pos(0, 4), "c": _pos(0, 6)}, a="a-2")
    assert leader == "c"
    _report(coordinator, "c", Role.LEADER, _pos(1, 9), followers={"a": 5, "b": 9})
    assert coordinator.shard(SHARD).eligible == {"b", "c"}


def test_a_replica_that_lost_its_disk_counts_again_once_caught_up_in_a_new_term(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its lost replica followed in term 0, so the leader's count of the member's acks in
    term 0 may be the lost replica's: only acks of a later term count. The coordinator
    elects one (it can: two members count), fencing the member too, and records the new
    incarnation once the leader reports it acked up to the leader's head in its first
    report of that term."""
    coordinator, leader = _online()
    lost = next(node for node in NODES if node != leader)
    _report(coordinator, leader, Role.LEADER, _pos(0, 8), followers={lost: 8})
    _report(coordinator, lost, Role.NOT_MEMBER, EMPTY_POSITION, incarnation=f"{lost}-2", term=-1)
    _report(coordinator, leader, Role.LEADER, _pos(0, 9), followers={lost: 9})
    assert coordinator.shard(SHARD).incarnations[lost] == f"{lost}-1", "counted the lost acks"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="quorumstore.protocol.coordinator"):
        coordinator.tick()
    [warning] = caplog.records
    assert warning.getMessage() == (
        f"shard default/0: election for term 1: {lost} lost its data; the leader's count of "
        "its acks may hold acks of the lost replica until a new term"
    )
    fenced = [out.to for out in _sent(coordinator) if isinstance(out.message, NewTerm)]
    assert sorted(fenced) == NODES
    heads = {node: _pos(0, 9) for node in NODES} | {lost: EMPTY_POSITION}
    leader = _elect(coordinator, heads, **{lost: f"{lost}-2"})
    _report(coordinator, leader, Role.LEADER, _pos(1, 12), followers={lost: 11})
    assert coordinator.shard(SHARD).incarnations[lost] == f"{lost}-1"
    assert lost not in coordinator.shard(SHARD).eligible
    coordinator.ready()
    _report(coordinator, leader, Role.LEADER, _pos(1, 14), followers={lost: 12})
    saved = coordinator.ready().metadata
    assert saved is not None and saved.shards[SHARD].incarnations[lost] == f"{lost}-2"
    assert lost in saved.shards[SHARD].eligible
    coordinator.tick()
    assert coordinator.shard(SHARD).term == 1, "elected again"


def test_the_offset_to_catch_up_to_is_taken_again_in_each_term() -> None:
    """The first leader of a later term reported head 12, an entry that never committed:
    its successor cut it, so the member's target comes from that successor's head."""
    coordinator, leader = _online()
    lost = next(node for node in NODES if node != leader)
    _answer(coordinator, lost, EMPTY_POSITION, f"{lost}-2")
    _tick_until_election(coordinator)
    heads = {node: _pos(0, 9) for node in NODES} | {lost: EMPTY_POSITION}
    leader = _elect(coordinator, heads, **{lost: f"{lost}-2"})
    _report(coordinator, leader, Role.LEADER, _pos(1, 12), followers={lost: 5}, commit=11)
    # The leader restarts without its unsynced entry 12 and is replaced.
    _report(coordinator, leader, Role.FENCED, _pos(1, 11))
    _sent(coordinator)
    heads = {node: _pos(1, 11) for node in NODES} | {lost: _pos(1, 5)}
    successor = _elect(coordinator, heads, **{lost: f"{lost}-2"})
    _report(coordinator, successor, Role.LEADER, _pos(2, 11), followers={lost: 11})
    assert coordinator.shard(SHARD).incarnations[lost] == f"{lost}-2"


def test_a_catching_up_member_waits_for_its_new_term_while_no_counted_majority_is_alive() -> None:
    """The leader and a member that lost its disk keep the shard serving while the third
    member is down: a new term could not be elected without that one. The member that
    lost its disk is added to the leader meanwhile."""
    coordinator, leader = _online()
    lost, down = (node for node in NODES if node != leader)
    for _ in range(CONFIG.node_failure_ticks + 1):  # `down` says nothing
        coordinator.tick()
        _report(coordinator, leader, Role.LEADER, _pos(0, 3))
    _sent(coordinator)
    _answer(coordinator, lost, EMPTY_POSITION, f"{lost}-2")
    assert [out.message for out in _sent(coordinator)] == [
        AddFollower(SHARD, 0, lost, EMPTY_POSITION)
    ]
    for _ in range(10):
        coordinator.tick()
        _report(coordinator, leader, Role.LEADER, _pos(0, 3), followers={lost: 3})
    assert (coordinator.shard(SHARD).term, coordinator.shard(SHARD).leader) == (0, leader)
    _report(coordinator, down, Role.FOLLOWER, _pos(0, 3))
    assert _tick_until_election(coordinator) == 1


def test_a_shard_that_lost_a_majority_of_its_data_goes_offline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    coordinator, _ = _online()
    _tick_until_election_after_the_leader_reports_no_replica(coordinator)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="quorumstore.protocol.coordinator"):
        _answer(coordinator, "a", EMPTY_POSITION, "a-2")
        _answer(coordinator, "b", EMPTY_POSITION, "b-2")
        _answer(coordinator, "c", _pos(0, 3))
        for _ in range(20):
            coordinator.tick()
            assert not [out for out in _sent(coordinator) if isinstance(out.message, BecomeLeader)]
    assert coordinator.shard(SHARD).state is ShardState.OFFLINE
    [error] = caplog.records
    assert error.getMessage().startswith(
        "shard default/0: a, b lost their data (new incarnations): fewer than a majority of "
        "its 3 replicas hold the data it counts on"
    )


def test_a_replica_whose_old_data_reports_again_counts_again() -> None:
    """A disk that was only missing for a while (unmounted, say) is back: its data is
    what the shard counted on."""
    coordinator, _ = _online()
    _tick_until_election_after_the_leader_reports_no_replica(coordinator)
    _answer(coordinator, "a", EMPTY_POSITION, "a-2")
    _answer(coordinator, "b", _pos(0, 4))
    _answer(coordinator, "a", _pos(0, 6))
    _answer(coordinator, "c", _pos(0, 5))
    [become] = [out for out in _sent(coordinator) if isinstance(out.message, BecomeLeader)]
    assert become.to == "a"
    assert coordinator.shard(SHARD).incarnations["a"] == "a-1"


def test_incarnations_cross_the_wire() -> None:
    coordinator, _ = _online()
    metadata = coordinator.metadata
    assert wire.metadata_from_pb(wire.metadata_to_pb(metadata)) == metadata
    response = NewTermResponse(SHARD, 3, "a", _pos(2, 5), 4, "a-1")
    assert wire.new_term_response_from_pb(wire.new_term_response_to_pb(response), "a") == response
    status = ShardStatus(SHARD, 3, Role.FOLLOWER, _pos(2, 5), 4, (), "a-1")
    assert wire.shard_status_from_pb(wire.shard_status_to_pb(status)) == status
