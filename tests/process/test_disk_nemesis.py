"""The campaign of `tests/campaign.py` under full disks, pauses and kills.

Each node of a 3-node, 2-shard cluster (replication factor 3) keeps its data directory on
a small ext4 filesystem of its own (tests/small_disks.py). A seeded nemesis picks, every
0.5-2 s, a node or the coordinator; a node half the time gets its disk filled for 1-4 s,
then freed; otherwise the victim is paused or killed -9 as in test_nemesis.py.

A node whose write or fsync fails on the full disk must stop (ARCHITECTURE.md, "Storage
failures are fail-stop"): its replicas close, and the node exits with status 1. Once the
space is back the nemesis restarts it, as a Spark task would, and it must serve and
rejoin. The history must be linearizable, complete and exactly-once; a node that ends
otherwise (another status, stopping without a fault, failing to come back) fails the test.

    QS_NEMESIS_SEED=7 QS_NEMESIS_SECONDS=120 pytest tests/process/test_disk_nemesis.py

replays seed 7's schedule, longer (the seed fixes the schedule and the workers'
choices, not the timing). Without QS_NEMESIS_SEED the seed is random and printed.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from campaign import Nemesis, pause_or_kill, run_campaign
from cluster_harness import LocalCluster
from small_disks import SmallDisk, unavailable_reason

pytestmark = [pytest.mark.process, pytest.mark.slow]

SEED = int(os.environ.get("QS_NEMESIS_SEED") or random.randrange(1_000_000))
SECONDS = float(os.environ.get("QS_NEMESIS_SECONDS", "20"))
#: Each node's filesystem (a sparse image): room for the campaign's data, which grew by
#: about 0.5 MiB a second (55 MiB used after 60 s), so that only the nemesis fills it.
DISK_MIB = 256 + int(SECONDS)
#: How long a node may take to exit once its replica failed (it stops its servers first).
EXIT_TIMEOUT_S = 30.0


@pytest.fixture(scope="module", autouse=True)
def _needs_small_disks() -> None:
    """Skips where small disks cannot be made; under CI (root) that is a failure."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the disk nemesis cannot run under CI: {reason}")
        pytest.skip(reason)


def disk_nemesis(disks: dict[str, SmallDisk], problems: list[str]) -> Nemesis:
    """Full disks on the nodes of `disks`, pauses and kills; what a node should not have
    done goes to `problems`, and ends the campaign early."""

    def fill_for(cluster: LocalCluster, node: str, hold_s: float) -> str:
        """Fills `node`'s disk for `hold_s`, frees it, restarts the node if it stopped;
        returns what the node did."""
        log_from = cluster.log_size(node)
        disks[node].fill()
        try:
            time.sleep(hold_s)
        finally:
            disks[node].free()
        if " CRITICAL " not in cluster.log_text(node)[log_from:]:
            return "it kept running"
        status = cluster.wait_exited(node, EXIT_TIMEOUT_S)
        if status != 1:
            raise AssertionError(f"{node} exited with status {status} on a full disk, not 1")
        cluster.restart(node)
        return "it stopped (exit 1) and was restarted"

    def nemesis(
        cluster: LocalCluster, rnd: random.Random, stop: threading.Event, log: list[str]
    ) -> None:
        targets = [*cluster.nodes, "coordinator"]
        origin = time.monotonic()
        try:
            while not stop.wait(rnd.uniform(0.5, 2.0)):
                stopped = [n for n in cluster.nodes if not cluster.is_alive(n)]
                if stopped:
                    raise AssertionError(f"{stopped} stopped with no fault of theirs")
                victim = rnd.choice(targets)
                at = f"{time.monotonic() - origin:.2f}s"
                if victim != "coordinator" and rnd.random() < 0.5:
                    hold_s = rnd.uniform(1.0, 4.0)
                    log.append(f"{at} disk full {victim} {hold_s:.1f} s")
                    log[-1] += f": {fill_for(cluster, victim, hold_s)}"
                else:
                    pause_or_kill(cluster, rnd, victim, at, log)
        except Exception as error:  # noqa: BLE001 - reported by the test, with the history
            problems.append(f"{error!r} (faults: {'; '.join(log)})")
            stop.set()

    return nemesis


@pytest.mark.timeout(1.3 * SECONDS + 400)  # checking grows with the history
def test_histories_under_full_disks_pauses_and_kills_are_linearizable_and_complete(
    make_cluster: Callable[..., LocalCluster], measure: Callable[[str], None], tmp_path: Path
) -> None:
    print(f"nemesis seed {SEED} (replay: QS_NEMESIS_SEED={SEED})")
    cluster = make_cluster(nodes=3, shards=2, replication_factor=3, start=False)
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        disks = {
            node: stack.enter_context(
                SmallDisk(tmp_path / "disks" / f"node{i}.img", cluster.node_dir(node), DISK_MIB)
            )
            for i, node in enumerate(cluster.nodes)
        }
        stack.callback(cluster.close)  # the processes go before their filesystems
        cluster.start()
        try:
            summary = run_campaign(cluster, disk_nemesis(disks, problems), SEED, SECONDS, tmp_path)
        finally:  # a problem ends the campaign early: it, not the short history, is the news
            assert not problems, problems
        for shard in range(cluster.shards):  # with the space back, every replica caught up
            for node in cluster.nodes:
                if node != cluster.leader_of(shard):
                    cluster.wait_caught_up(node, shard)
        used = max(disk.size_mib - disk.free_bytes() / (1 << 20) for disk in disks.values())
        measure(f"{summary}; at most {used:.0f} of {DISK_MIB} MiB used on a disk")
