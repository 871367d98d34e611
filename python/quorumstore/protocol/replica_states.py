"""The roles of a shard replica and the transitions between them, as a table.

An illegal transition is a named error rather than a silent branch (as in h11's
`_state.py`). Two notes on the table:
- a leader that receives a reply carrying a higher term has missed a NewTerm; it
  steps down exactly as NewTerm would make it (a "zombie" leader);
- `Truncate` is also accepted by a Follower (a self-loop): the leader's reconcile loop
  may need to cut a follower that already follows but reported a head the leader lacks.
"""

from __future__ import annotations

import enum

from quorumstore.protocol.types import Role


class Trigger(enum.Enum):
    NEW_TERM = "NewTerm"
    REPLICATE = "Replicate"
    TRUNCATE = "Truncate"
    SNAPSHOT = "Snapshot"
    BECOME_LEADER = "BecomeLeader"
    ADD_FOLLOWER = "AddFollower"


TRANSITIONS: dict[tuple[Role, Trigger], Role] = {
    (Role.NOT_MEMBER, Trigger.NEW_TERM): Role.FENCED,
    (Role.FENCED, Trigger.NEW_TERM): Role.FENCED,
    (Role.FOLLOWER, Trigger.NEW_TERM): Role.FENCED,
    (Role.LEADER, Trigger.NEW_TERM): Role.FENCED,
    (Role.FENCED, Trigger.REPLICATE): Role.FOLLOWER,
    (Role.FOLLOWER, Trigger.REPLICATE): Role.FOLLOWER,
    (Role.FENCED, Trigger.TRUNCATE): Role.FOLLOWER,
    (Role.FOLLOWER, Trigger.TRUNCATE): Role.FOLLOWER,
    (Role.FENCED, Trigger.SNAPSHOT): Role.FOLLOWER,
    (Role.FOLLOWER, Trigger.SNAPSHOT): Role.FOLLOWER,
    (Role.FENCED, Trigger.BECOME_LEADER): Role.LEADER,
    (Role.LEADER, Trigger.ADD_FOLLOWER): Role.LEADER,
}
