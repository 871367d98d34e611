"""The doubling wait of supervisors: restarts of nodes and `cluster` children, metadata saves."""

from __future__ import annotations

from quorumstore.backoff import DoublingBackoff, restart_backoff


def test_failures_after_short_runs_double_the_wait_up_to_the_cap() -> None:
    backoff = restart_backoff()
    waits = [backoff.delay_after(ran_for_s=1.0) for _ in range(8)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_a_stable_run_starts_the_waits_over() -> None:
    backoff = restart_backoff()
    assert [backoff.delay_after() for _ in range(3)] == [0.5, 1.0, 2.0]
    assert backoff.delay_after(ran_for_s=59.9) == 4.0
    assert backoff.delay_after(ran_for_s=60.0) == 0.5
    assert backoff.delay_after(ran_for_s=0.1) == 1.0


def test_without_a_stable_run_the_waits_never_start_over() -> None:
    backoff = DoublingBackoff(first_s=0.1, max_s=5.0)
    waits = [backoff.delay_after(ran_for_s=3600.0) for _ in range(8)]
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
