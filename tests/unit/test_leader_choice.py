"""choose_leader against the data-driven cases in testdata/leader_choice.txt."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumstore.protocol.election import Candidate, Choice, choose_leader
from quorumstore.protocol.types import LogPosition

CASES = [
    line
    for line in (Path(__file__).parent / "testdata" / "leader_choice.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def _pairs(field: str) -> list[tuple[str, str]]:
    """`node=value,...` as (node, value) pairs; "-" is none."""
    if field == "-":
        return []
    return [(node, value) for node, _, value in (item.partition("=") for item in field.split(","))]


@pytest.mark.parametrize("case", CASES)
def test_leader_choice(case: str) -> None:
    ensemble, commit, live, load, responses, expected = (part.strip() for part in case.split("|"))
    candidates = []
    for node, head in _pairs(responses):
        term, offset = head.split(".")
        candidates.append(Candidate(node, LogPosition(int(term), int(offset), 0)))
    choice = choose_leader(
        candidates,
        ensemble_size=int(ensemble),
        eligible=frozenset() if live == "-" else frozenset(live.split(",")),
        known_commit_offset=int(commit),
        leader_load={node: int(shards) for node, shards in _pairs(load)} or None,
    )
    if expected.startswith("none:"):
        assert choice.leader is None, choice
        assert expected.removeprefix("none:").strip() in choice.reason, choice
    else:
        assert choice == Choice(expected)


def test_members_that_lost_their_data_are_not_waited_for() -> None:
    """Once every member whose data counts answered (`catching_up` members lost theirs),
    nobody holds more of what was committed than the best: it leads, live or not."""
    responses = [Candidate("b", LogPosition(2, 7, 0)), Candidate("c", LogPosition(2, 5, 0))]
    live_c = frozenset({"c"})
    waiting = choose_leader(responses, ensemble_size=3, eligible=live_c, known_commit_offset=-1)
    assert waiting.leader is None and "not in the live replica set" in waiting.reason
    assert choose_leader(
        responses, ensemble_size=3, eligible=live_c, known_commit_offset=-1, catching_up=1
    ) == Choice("b")
