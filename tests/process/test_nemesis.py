"""A Jepsen-style campaign: random pauses and kills while recorded clients read and write;
the history must be linearizable, complete and exactly-once.

A 3-node, 2-shard cluster (replication factor 3) runs a seeded schedule that picks,
every 0.5-2 s, a node or the coordinator and either pauses it (SIGSTOP for 0.2-2.5 s:
it wakes up in a world that moved on) or kills it -9 and restarts it. Meanwhile,
the workload of `tests/campaign.py` runs: recorded clients, then the history checked
for per-key linearizability, set completeness and exactly-once (see
docs/verification.md).

    QS_NEMESIS_SEED=7 QS_NEMESIS_SECONDS=120 pytest tests/process/test_nemesis.py

replays seed 7's schedule, longer (the seed fixes the schedule and the workers'
choices, not the timing). Without QS_NEMESIS_SEED the seed is random and printed.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from campaign import pause_or_kill, run_campaign
from cluster_harness import LocalCluster

pytestmark = [pytest.mark.process, pytest.mark.slow]

SEED = int(os.environ.get("QS_NEMESIS_SEED") or random.randrange(1_000_000))
SECONDS = float(os.environ.get("QS_NEMESIS_SECONDS", "20"))


def _nemesis(
    cluster: LocalCluster, rnd: random.Random, stop: threading.Event, log: list[str]
) -> None:
    """Faults until `stop`; each logged with its time since the workload started (the
    origin of the checker's reports, give or take the first operation's start)."""
    targets = [*cluster.nodes, "coordinator"]
    origin = time.monotonic()
    while not stop.wait(rnd.uniform(0.5, 2.0)):
        victim = rnd.choice(targets)
        pause_or_kill(cluster, rnd, victim, f"{time.monotonic() - origin:.2f}s", log)


@pytest.mark.timeout(1.3 * SECONDS + 400)  # checking grows with the history
def test_histories_under_pauses_and_kills_are_linearizable_and_complete(
    make_cluster: Callable[..., LocalCluster], measure: Callable[[str], None], tmp_path: Path
) -> None:
    print(f"nemesis seed {SEED} (replay: QS_NEMESIS_SEED={SEED})")
    cluster = make_cluster(nodes=3, shards=2, replication_factor=3)
    measure(run_campaign(cluster, _nemesis, SEED, SECONDS, tmp_path))
