"""Quorum arithmetic: the commit offset from acked offsets (QuorumAckTracker).

The rule is in docs/protocol.md, "Replication and the commit rule".

Kept apart from the replica so the rule is readable and testable on its own, like
etcd-raft's `quorum/majority.go`.
"""

from __future__ import annotations


def majority(replication_factor: int) -> int:
    """Replicas (leader included) that must hold an entry for it to be committed."""
    if replication_factor < 1:
        raise ValueError(f"replication factor must be >= 1, got {replication_factor}")
    return replication_factor // 2 + 1


def quorum_offset(acked: list[int], replication_factor: int) -> int:
    """The highest offset held by a majority, counting missing replicas as holding nothing.

    `acked` holds one offset per replica known to the leader (itself included).
    """
    need = majority(replication_factor)
    if len(acked) < need:
        return -1
    return sorted(acked, reverse=True)[need - 1]


class QuorumAckTracker:
    """Tracks the leader's commit offset for one term.

    An entry of an earlier term is never committed by counting replicas alone:
    the commit offset may only move to an offset at or after `term_start_offset`, the
    first entry the leader appended in its own term; committing that entry commits the
    whole prefix before it.
    """

    def __init__(self, replication_factor: int, term_start_offset: int, commit_offset: int):
        self.replication_factor = replication_factor
        self.term_start_offset = term_start_offset
        self.commit_offset = commit_offset
        self._acked: dict[str, int] = {}

    def ack(self, replica: str, offset: int) -> bool:
        """Records that `replica` durably holds the leader's log up to `offset`.

        Returns True when the commit offset advanced.
        """
        if offset <= self._acked.get(replica, -1):
            return False
        self._acked[replica] = offset
        candidate = quorum_offset(list(self._acked.values()), self.replication_factor)
        if candidate >= self.term_start_offset and candidate > self.commit_offset:
            self.commit_offset = candidate
            return True
        return False
