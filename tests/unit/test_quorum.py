"""QuorumAckTracker against the data-driven cases in testdata/quorum.txt."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumstore.protocol.quorum import QuorumAckTracker, majority

CASES = [
    line
    for line in (Path(__file__).parent / "testdata" / "quorum.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


@pytest.mark.parametrize("case", CASES)
def test_commit_offset(case: str) -> None:
    rf, term_start, acks, expected = (part.strip() for part in case.split("|"))
    tracker = QuorumAckTracker(int(rf), int(term_start), commit_offset=-1)
    for ack in acks.split(","):
        replica, offset = ack.split("=")
        tracker.ack(replica, int(offset))
    assert tracker.commit_offset == int(expected)


def test_majority_rejects_an_empty_ensemble() -> None:
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="replication factor"):
        majority(0)
