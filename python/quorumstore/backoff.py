"""How long to wait before trying again something that keeps failing on this machine.

Three supervisors wait by this one rule: `quorumstore cluster` before it restarts a
child process, a Spark node task before it restarts its node, and the coordinator
before it retries a metadata save. Each failure that follows a short run doubles the
wait, up to a cap, so a disk that stays full costs a try every few seconds rather than
a tight loop; a run that lasted (a node that served for a minute) starts the waits over.
Clients use `quorumstore.client.retry.Backoff` instead, whose jitter spreads the
retries of many clients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class DoublingBackoff:
    """The first wait, doubled per failure that follows a short run, up to a cap."""

    first_s: float = 0.5
    max_s: float = 10.0
    #: A run at least this long counts as stable: the next wait is the first again.
    stable_run_s: float = math.inf
    _next_s: float = field(init=False)

    def __post_init__(self) -> None:
        self._next_s = self.first_s

    def delay_after(self, ran_for_s: float = 0.0) -> float:
        """The wait before trying again something that failed after running `ran_for_s`
        seconds (0, the default, for an attempt that failed outright)."""
        if ran_for_s >= self.stable_run_s:
            self._next_s = self.first_s
        delay = self._next_s
        self._next_s = min(delay * 2, self.max_s)
        return delay


def restart_backoff() -> DoublingBackoff:
    """The wait before restarting a stopped storage node or `cluster` child: 0.5 s,
    doubling to 10 s, back to 0.5 s once it has served for 60 s."""
    return DoublingBackoff(first_s=0.5, max_s=10.0, stable_run_s=60.0)
