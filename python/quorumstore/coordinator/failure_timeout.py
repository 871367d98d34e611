"""How long the coordinator waits for a silent node: the default, the limit and the
conversion to its ticks. A module of its own so that the command line's parser and the
Spark settings check a value without importing the coordinator's server (gRPC, metadata
storage: a third of a second)."""

from __future__ import annotations

#: The coordinator's clock: elections, retries and failure detection advance by ticks.
DEFAULT_TICK_MS = 100
#: A node that sends no health report for this long is taken for failed.
DEFAULT_FAILURE_TIMEOUT_MS = 500
#: The failure timeout spans at least this many ticks: reports come once a tick, and one
#: late report must not depose a leader.
MIN_FAILURE_TICKS = 2


def check_failure_timeout(failure_timeout_ms: int, tick_ms: int = DEFAULT_TICK_MS) -> None:
    """Raises ValueError unless a node failure timeout of `failure_timeout_ms` can work."""
    if failure_timeout_ms < MIN_FAILURE_TICKS * tick_ms:
        raise ValueError(
            f"the node failure timeout must be at least {MIN_FAILURE_TICKS * tick_ms} ms "
            f"({MIN_FAILURE_TICKS} coordinator ticks of {tick_ms} ms), got {failure_timeout_ms} ms"
        )


def failure_ticks(failure_timeout_ms: int, tick_ms: int) -> int:
    """The timeout in whole ticks, rounded up."""
    return -(-failure_timeout_ms // tick_ms)
