"""The restart wait shared by `quorumstore cluster` and the Spark node task."""

from __future__ import annotations

from quorumstore.node.restarts import RestartBackoff


def test_failures_after_short_runs_double_the_wait_up_to_the_cap() -> None:
    backoff = RestartBackoff(first_s=0.5, max_s=10.0, stable_run_s=60.0)
    waits = [backoff.delay_after(ran_for_s=1.0) for _ in range(8)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_a_stable_run_starts_the_waits_over() -> None:
    backoff = RestartBackoff(first_s=0.5, max_s=10.0, stable_run_s=60.0)
    assert [backoff.delay_after(0) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert backoff.delay_after(ran_for_s=59.9) == 4.0
    assert backoff.delay_after(ran_for_s=60.0) == 0.5
    assert backoff.delay_after(ran_for_s=0.1) == 1.0
