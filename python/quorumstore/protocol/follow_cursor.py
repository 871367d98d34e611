"""The leader's view of one follower (Oxia's follow cursor): what it pushed, what came back."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from quorumstore.protocol.types import LogPosition


class CursorState(enum.Enum):
    #: Streaming: every new entry is pushed at once, up to the in-flight window.
    REPLICATE = "replicate"
    #: A push went unanswered: one batch at a time until the follower acks (etcd's probe).
    PROBE = "probe"
    TRUNCATING = "truncating"
    SNAPSHOT = "snapshot"


@dataclass(slots=True)
class FollowCursor:
    """The leader's view of one follower: what was pushed and what was acked."""

    name: str
    state: CursorState
    next_offset: int = 0
    acked_offset: int = -1
    idle_ticks: int = 0
    truncate_to: LogPosition | None = None
    #: The follower head `truncate_to` was chosen for.
    truncate_from: LogPosition | None = None
    #: (last offset, payload bytes) of each Append pushed and not known acked, oldest first.
    pushed: deque[tuple[int, int]] = field(default_factory=deque)
    pushed_bytes: int = 0

    @property
    def last_pushed(self) -> int:
        return self.next_offset - 1

    def inflight_bytes(self) -> int:
        """Payload bytes pushed past the acked offset, after forgetting the Appends acked
        since and those the leader rewound past (it pushes them again)."""
        pushed = self.pushed
        while pushed and pushed[0][0] <= self.acked_offset:
            self.pushed_bytes -= pushed.popleft()[1]
        while pushed and pushed[-1][0] >= self.next_offset:
            self.pushed_bytes -= pushed.pop()[1]
        return self.pushed_bytes
