"""Leader choice after fencing, limited to the live replica set.

The rule is in docs/protocol.md, "Leader choice", "The live replica set" and "Replicas
that lose their disk".

Pure functions, apart from the coordinator so the rule reads on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from quorumstore.protocol.quorum import majority
from quorumstore.protocol.types import LogPosition


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    head: LogPosition


@dataclass(frozen=True, slots=True)
class Choice:
    """The outcome: a leader, or the reason the shard must stay offline."""

    leader: str | None
    reason: str = ""


def rank(
    candidate: Candidate, eligible: frozenset[str], leader_load: Mapping[str, int] | None = None
) -> tuple[int, int, bool, int, str]:
    """The head with the greatest (term, offset) ranks first (invariant 4); among equal heads a
    member of the live replica set, then the node leading fewest shards (to spread
    leaders over the nodes), then the name, breaks the tie."""
    load = leader_load.get(candidate.node, 0) if leader_load else 0
    return (
        candidate.head.term,
        candidate.head.offset,
        candidate.node in eligible,
        -load,
        candidate.node,
    )


def choose_leader(
    responses: list[Candidate],
    *,
    ensemble_size: int,
    eligible: frozenset[str],
    known_commit_offset: int,
    leader_load: Mapping[str, int] | None = None,
    catching_up: int = 0,
) -> Choice:
    """Picks the responder with the highest head entry, if it may lead.

    `responses` are the answers that count: none of the `catching_up` members, which
    lost their data and have not caught up. Answers of fewer than a majority of the
    ensemble need not include a replica of every committed entry, so nobody is chosen
    then. Only the top-ranked responder can lead without truncating an entry some other
    responder holds, so a lower-ranked one is never chosen instead. It must hold every
    entry known to be committed, and, unless every member whose data counts answered
    (then nobody holds more of what was committed than it does), it must be in the live
    replica set: it was not lagging when the leader last reported. Otherwise the shard
    stays offline until a better responder answers, rather than electing a leader that
    could lose committed data.
    """
    if not responses:
        return Choice(None, "no NewTerm responses")
    if len(responses) < majority(ensemble_size):
        return Choice(
            None,
            f"{len(responses)} of {ensemble_size} members answered with the data the shard "
            "counts on, fewer than a majority",
        )
    best = max(responses, key=lambda c: rank(c, eligible, leader_load))
    if best.node not in eligible and len(responses) < ensemble_size - catching_up:
        return Choice(
            None, f"best candidate {best.node} {best.head.entry_id} is not in the live replica set"
        )
    if best.head.offset < known_commit_offset:
        return Choice(
            None,
            f"best candidate {best.node} ends at offset {best.head.offset}, "
            f"before the last known commit offset {known_commit_offset}",
        )
    return Choice(best.node)
