"""How long a supervisor waits before it starts a stopped storage node again.

`quorumstore cluster` restarts its child processes and a Spark node task restarts its
node in the task; both wait by this one rule. A node that fails again soon after its
restart (a disk that is still full) waits longer each time instead of restarting in a
tight loop, and one that served for a while before failing comes back quickly.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RestartBackoff:
    """The first wait, doubled per failure that follows a short run, up to a cap."""

    first_s: float = 0.5
    max_s: float = 10.0
    #: A run at least this long counts as stable: the next wait is the first again.
    stable_run_s: float = 60.0
    _next_s: float = field(init=False)

    def __post_init__(self) -> None:
        self._next_s = self.first_s

    def delay_after(self, ran_for_s: float) -> float:
        """The wait before restarting something that stopped after running `ran_for_s`
        seconds (0 for a start that failed)."""
        if ran_for_s >= self.stable_run_s:
            self._next_s = self.first_s
        delay = self._next_s
        self._next_s = min(delay * 2, self.max_s)
        return delay
