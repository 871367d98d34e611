"""A Spark standalone cluster on three hosts: each executor runs on its own host, and the
whole cluster stops cleanly.

One cluster serves the module (JVMs are the expensive part on a shared two-core machine);
the last test stops it and checks that nothing is left running.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import Hosts
from pyspark.sql import SparkSession
from spark_cluster import SparkCluster, running_spark_cluster

pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A master on the bridge and a worker on each of the module's three hosts."""
    with running_spark_cluster(hosts, tmp_path_factory.mktemp("spark-cluster")) as started:
        yield started


@pytest.fixture(scope="module")
def spark(cluster: SparkCluster) -> SparkSession:
    return cluster.session()


def test_executors_run_on_three_distinct_hosts(
    hosts: Hosts, cluster: SparkCluster, spark: SparkSession
) -> None:
    assert cluster.alive_workers() == sorted(host.address for host in hosts)
    gateway = hosts.gateway

    def where(_: object) -> Iterator[tuple[int, str, str, list[str]]]:
        # Runs in an executor's Python worker, inside its host.
        import os
        import socket

        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        # A connected UDP socket sends nothing; its local address is the one that routes
        # to the bridge, i.e. this host's address.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((gateway, 9))
            address = probe.getsockname()[0]
        peers = [info.address for info in context.getTaskInfos()]
        yield context.partitionId(), address, os.readlink("/proc/self/ns/net"), peers

    # A barrier stage runs its tasks all at once: one per executor (each has one core).
    tasks = len(hosts)
    rows = spark.sparkContext.parallelize(range(tasks), tasks).barrier().mapPartitions(where)
    results = rows.collect()

    assert sorted(row[0] for row in results) == list(range(tasks))
    addresses = sorted(row[1] for row in results)
    assert addresses == sorted(host.address for host in hosts), results
    namespaces = {row[2] for row in results}
    assert len(namespaces) == tasks and os.readlink("/proc/self/ns/net") not in namespaces
    task_hosts = sorted(peer.rsplit(":", 1)[0] for peer in results[0][3])
    assert task_hosts == addresses, results
    executors = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    executor_hosts = sorted(info.host() for info in executors if info.host() != gateway)
    assert executor_hosts == addresses


def test_the_cluster_stops_cleanly(
    hosts: Hosts, cluster: SparkCluster, spark: SparkSession
) -> None:
    killed = cluster.stop()
    assert killed == [], f"needed SIGKILL: {killed}\n{cluster.log_tails()}"
    assert cluster.master is not None and cluster.master.returncode is not None
    assert all(worker.returncode is not None for worker in cluster.workers)
    # The executors and their Python workers went with their workers.
    left = {host.netns: host.pids() for host in hosts if host.pids()}
    assert not left, f"processes left inside the hosts: {left}"
    with pytest.raises(OSError):
        cluster.status()


def test_log_tails_name_every_process(cluster: SparkCluster) -> None:
    tails = cluster.log_tails()
    for log in cluster.logs:
        assert str(log) in tails
    assert all(Path(log).exists() for log in cluster.logs)
