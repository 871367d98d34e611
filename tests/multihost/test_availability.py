"""Clients keep going while one node is paused, isolated or cut off (availability.py,
spark_availability.py).

Each client kind runs a short fault-free phase and a phase under the node-fault
nemesis; at least 80% of the faulty phase's seconds must stay at or above 20% of the
fault-free median of ok operations, every fault's recovery must take at most 1 s plus
the failure timeout (here with LOAD_ALLOWANCE_S more), and the history must be
linearizable.

    QS_AVAILABILITY_SEED=7 QS_AVAILABILITY_SECONDS=60 pytest tests/multihost/test_availability.py

replays seed 7's schedule with 60 s phases (`bench/availability_bench.py` prints the
same for every kind). Without QS_AVAILABILITY_SEED the seed is random and printed.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from availability import CLIENT_KINDS, measure, running_cluster
from netns import Hosts
from spark_availability import SPARK_KINDS, measure_spark, spark_session

from quorumstore import Client

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

SEED = int(os.environ.get("QS_AVAILABILITY_SEED") or random.randrange(1_000_000))
SECONDS = float(os.environ.get("QS_AVAILABILITY_SECONDS", "20"))
#: Beyond the bound (failure timeout + 1 s) for a loaded CI machine; the bench holds
#: the bound itself. Without the fixes these tests guard, recoveries take 3-6 s.
LOAD_ALLOWANCE_S = 0.5
#: The DataFrame kind's recovery is read from a probe job started at the fault, against
#: a fault-free probe's median length, and its jobs vary by up to 2 s on a loaded
#: machine (docs/performance.md). Held here to 3 s, which the stalls before the fixes
#: (the whole fault, or 36-60 s) exceed.
DATAFRAME_ALLOWANCE_S = 1.5


@pytest.mark.timeout(120)
def test_a_client_whose_map_comes_from_a_cut_off_leader_finds_the_new_one(
    four_hosts: Hosts, tmp_path: Path
) -> None:
    """The client follows the shard map from the one node it was given, which leads a
    shard; that node is cut off from the coordinator and the other nodes, not from the
    client. Its connection stays healthy but it sends no new map (it hears of none) and
    cannot answer the read (it cannot commit in its term), so the client must ask the
    other nodes for the shard's new leader: the read completes within the failure
    timeout plus a second."""
    with running_cluster(four_hosts, tmp_path) as cluster:
        leader = cluster.leader_of(0)
        assert leader is not None
        host = four_hosts[cluster.nodes.index(leader)]
        with Client(leader) as client:
            key = next(f"/k{i}" for i in range(1000) if client.shard_for(f"/k{i}") == 0)
            client.put(key, b"before")
            four_hosts.partition([[host], [h for h in four_hosts if h is not host]])
            started = time.monotonic()
            assert client.get(key).value == b"before"
            waited_s = time.monotonic() - started
            four_hosts.heal_partition()
        assert waited_s <= 1.5, f"the read waited {waited_s:.2f} s for the new leader"


@pytest.mark.timeout(2 * SECONDS + 240)
@pytest.mark.parametrize("kind", list(CLIENT_KINDS))
def test_each_client_kind_rides_out_node_faults(
    kind: str, four_hosts: Hosts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    print(f"availability seed {SEED} (replay: QS_AVAILABILITY_SEED={SEED})")
    with running_cluster(four_hosts, tmp_path) as cluster:
        result = measure(four_hosts, cluster, kind, SECONDS, SEED)
    with capsys.disabled():
        print(f"\n{result.report()}")
    assert result.holds_within(LOAD_ALLOWANCE_S), result.report()


@pytest.mark.timeout(3 * (2 * SECONDS + 60) + 300)
def test_each_spark_client_kind_rides_out_node_faults(
    four_hosts: Hosts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The JVM state-store provider, the DataFrame sink and source, and the change feed,
    in one Spark session against one cluster (spark_availability.py)."""
    print(f"availability seed {SEED} (replay: QS_AVAILABILITY_SEED={SEED})")
    reports, failed = [], []
    with running_cluster(four_hosts, tmp_path / "cluster") as cluster:
        spark = spark_session(",".join(cluster.nodes), tmp_path / "spark-local")
        try:
            for kind in SPARK_KINDS:
                result = measure_spark(
                    spark, four_hosts, cluster, kind, SECONDS, SEED, tmp_path / kind
                )
                reports.append(result.report())
                if not result.holds_within(
                    DATAFRAME_ALLOWANCE_S if kind == "dataframe" else LOAD_ALLOWANCE_S
                ):
                    failed.append(kind)
        finally:
            spark.stop()
    with capsys.disabled():
        print("\n" + "\n".join(reports))
    assert not failed, "\n".join(reports)
