"""The campaign of `tests/campaign.py` under network faults between hosts.

Three `quorumstore node` processes on three hosts and the coordinator on a fourth, each
a network namespace; the recorded clients run in the root namespace, which every
partition leaves connected to every host. A seeded nemesis picks, every 0.5-2 s, one
fault for 1-4 s, then heals it:

- the leader of a shard alone: cut off from the other nodes and the coordinator, still
  reached by clients;
- a random node alone (a minority), or the coordinator alone;
- a node's host isolated (its link down: clients lose it too);
- a host's packets delayed by 20-300 ms, with 0-20% of them lost;
- a bridge: nodes A-B and B-C connected, A-C cut (two majorities overlapping in B), the
  coordinator on A's side, on C's side, or reaching all three like B;
- one-way loss: every packet from one host (a node or the coordinator) to another
  dropped, the other way delivered.

    QS_NEMESIS_SEED=7 QS_NEMESIS_SECONDS=600 pytest tests/multihost/test_partition_nemesis.py

replays seed 7's schedule, longer (the seed fixes the schedule and the workers'
choices, not the timing). Without QS_NEMESIS_SEED the seed is random and printed.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from netns import Host, Hosts

from campaign import Nemesis, run_campaign
from cluster_harness import LocalCluster

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

SEED = int(os.environ.get("QS_NEMESIS_SEED") or random.randrange(1_000_000))
SECONDS = float(os.environ.get("QS_NEMESIS_SECONDS", "20"))
KINDS = (
    "leader alone",
    "node alone",
    "coordinator alone",
    "isolate",
    "delay",
    "bridge",
    "one way",
)


def partition_nemesis(hosts: Hosts) -> Nemesis:
    """The network faults above, on `hosts` (nodes on the first three, the coordinator
    on the fourth)."""
    everyone = list(hosts)
    node_hosts, coordinator_host = everyone[:3], everyone[3]

    def alone(host: Host) -> Callable[[], None]:
        hosts.partition([[host], [h for h in everyone if h is not host]])
        return hosts.heal_partition

    def nemesis(
        cluster: LocalCluster, rnd: random.Random, stop: threading.Event, log: list[str]
    ) -> None:
        host_of = dict(zip(cluster.nodes, node_hosts, strict=True))
        origin = time.monotonic()
        while not stop.wait(rnd.uniform(0.5, 2.0)):
            kind = rnd.choice(KINDS)
            hold_s = rnd.uniform(1.0, 4.0)
            target = rnd.choice(node_hosts)
            at = f"{time.monotonic() - origin:.2f}s"
            if kind == "leader alone":
                leader = cluster.leader_of(rnd.randrange(cluster.shards))
                if leader is None:
                    continue
                target = host_of[leader]
                heal = alone(target)
            elif kind == "node alone":
                heal = alone(target)
            elif kind == "coordinator alone":
                target = coordinator_host
                heal = alone(target)
            elif kind == "isolate":
                hosts.isolate(target)
                heal = functools.partial(hosts.heal, target)
            elif kind == "bridge":
                a, b, c = rnd.sample(node_hosts, 3)
                target = rnd.choice((a, b, c))  # the coordinator's side (with B it reaches all)
                far = {a: c, c: a}.get(target)
                for x, y in [(a, c), *([(coordinator_host, far)] if far else [])]:
                    hosts.drop(x, y)
                    hosts.drop(y, x)
                kind = f"bridge {a.address} - {b.address} - {c.address}, coordinator with"
                heal = hosts.heal_partition
            elif kind == "one way":
                source, target = rnd.sample(everyone, 2)
                hosts.drop(source, target)
                kind = f"drop {source.address} ->"
                heal = hosts.heal_partition
            else:
                target = rnd.choice(everyone)
                delay_ms, loss_pct = rnd.uniform(20, 300), rnd.uniform(0, 20)
                kind = f"delay {delay_ms:.0f} ms, loss {loss_pct:.0f}%,"
                hosts.delay(target, delay_ms, loss_pct)
                heal = functools.partial(hosts.clear_delay, target)
            log.append(f"{at} {kind} {target.address} for {hold_s:.1f} s")
            try:
                time.sleep(hold_s)
            finally:
                heal()

    return nemesis


@pytest.mark.timeout(1.3 * SECONDS + 300)  # checking grows with the history
def test_histories_under_partitions_delays_and_isolation_are_linearizable_and_complete(
    four_hosts: Hosts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    print(f"nemesis seed {SEED} (replay: QS_NEMESIS_SEED={SEED})")
    cluster = LocalCluster(
        tmp_path, nodes=3, shards=2, replication_factor=3, places=list(four_hosts)
    )
    try:
        cluster.start()
        summary = run_campaign(cluster, partition_nemesis(four_hosts), SEED, SECONDS, tmp_path)
        with capsys.disabled():
            print(f"\n{summary}")
    except BaseException:
        print(four_hosts.describe())
        raise
    finally:
        four_hosts.heal_all()
        cluster.close()
