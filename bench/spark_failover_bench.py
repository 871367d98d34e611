"""Failover of a Spark-hosted cluster in each placement: kill -9 of one node -> first write.

A cluster is started with `quorumstore.spark.start` in each placement (barrier: one
barrier job for all nodes; independent: one job per node). Each trial kill -9s the
Python worker process running the leader of one shard while writes to that shard keep
coming, and reports:

* first write: seconds from the kill until the first write issued after it succeeds
  (bench/measure.py's `measure_failover`, the same code and the same plain Oxia
  `Write` path as bench/replication_bench.py's process-hosted failover number);
* task back: seconds until Spark runs a new task for the killed node (its pid file
  names a new, live process);
* all up: seconds until every shard has a leader and the coordinator reaches every node;

and checks that every write acknowledged during the trial reads back unchanged. The
median of the trials is printed per placement.

Usage: python bench/spark_failover_bench.py [--master local[4]] [--trials 3]
                                            [--placements barrier,independent] [--dir D]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from measure import measure_failover
from replication_bench import PlainOxiaClient

from quorumstore.client import KeyNotFound
from quorumstore.client.routing import key_hash
from quorumstore.spark import HostedCluster

#: Every failover write carries this partition key, so all go to the one shard whose
#: leader is killed (writes to other shards would succeed at once in the independent
#: placement and measure nothing).
FAILOVER_PARTITION = "spark-failover"
RECOVERY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Trial:
    """One kill -9 and what followed it, times in seconds from the kill."""

    placement: str
    victim: int
    pid: int
    shard: int
    first_write_s: float
    task_back_s: float
    all_up_s: float
    acknowledged: int
    resubmissions: int

    def __str__(self) -> str:
        return (
            f"{self.placement:<11} kill -9 node {self.victim} (pid {self.pid}, leader of shard {self.shard}): "
            f"first write {self.first_write_s:.2f} s, task back {self.task_back_s:.2f} s, "
            f"all up {self.all_up_s:.2f} s; {self.acknowledged} acknowledged writes intact; "
            f"node jobs resubmitted {self.resubmissions}x"
        )


def failover_shard(cluster: HostedCluster) -> int:
    """The shard FAILOVER_PARTITION routes to."""
    h = key_hash(FAILOVER_PARTITION)
    for s in cluster.status().cluster.metadata.shards:
        if s.hash_range.min_hash_inclusive <= h <= s.hash_range.max_hash_inclusive:
            return s.shard
    raise RuntimeError(f"no shard owns hash {h:#010x}")


class _Recovery(threading.Thread):
    """Watches, from the kill on, for the victim's new task and for the whole cluster up."""

    def __init__(self, cluster: HostedCluster, victim: int, old_pid: int, killed_at: float):
        super().__init__(daemon=True)
        self._cluster, self._victim, self._old_pid, self._killed_at = cluster, victim, old_pid, killed_at
        self.task_back_s: float | None = None
        self.all_up_s: float | None = None

    def run(self) -> None:
        deadline = self._killed_at + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline and self.all_up_s is None:
            now = time.monotonic() - self._killed_at
            pid = self._cluster.node_pids().get(self._victim)
            if self.task_back_s is None and pid not in (None, self._old_pid) and _alive(pid):
                self.task_back_s = now
            if self.task_back_s is not None and self._cluster.status().online:
                self.all_up_s = now
            time.sleep(0.05)


def wait_converged(cluster: HostedCluster, timeout_s: float = RECOVERY_TIMEOUT_S) -> None:
    """Every shard led and every replica caught up (eligible), so any one node may die.

    Killing a node while another is still catching up would leave a shard no electable
    majority until the dead node returns, and measure that instead of a failover.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = cluster.status()
        if status.online and all(len(s.eligible) == cluster.config.nodes for s in status.cluster.metadata.shards):
            return
        time.sleep(0.1)
    raise TimeoutError(f"the cluster did not converge within {timeout_s:g} s:\n{cluster.status()}")


async def failover_trial(cluster: HostedCluster) -> Trial:
    """Kills the leader of the failover shard under writes; returns once all is back and checked."""
    await asyncio.to_thread(wait_converged, cluster)
    shard = failover_shard(cluster)
    before = sum(job.submissions for job in cluster.status().node_jobs)
    acknowledged: dict[str, bytes] = {}
    plain = PlainOxiaClient(cluster.addresses)
    killed: list[tuple[int, int]] = []
    watcher: list[_Recovery] = []

    async def put(key: bytes, value: bytes) -> None:
        await plain.put(key, value, partition_key=FAILOVER_PARTITION)
        acknowledged[key.decode()] = value

    def kill_leader() -> None:
        leader = cluster.status().leaders[shard]
        victim = cluster.addresses.index(leader)
        pid = cluster.node_pids()[victim]
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.005)
        killed.append((victim, pid))
        watcher.append(_Recovery(cluster, victim, pid, time.monotonic()))
        watcher[0].start()

    try:
        first_write_s = await measure_failover(
            put, kill_leader, prefix=f"bench/spark-failover/{time.time_ns()}/".encode(), give_up_s=RECOVERY_TIMEOUT_S
        )
    finally:
        await plain.close()
    recovery = watcher[0]
    await asyncio.to_thread(recovery.join, RECOVERY_TIMEOUT_S)
    if recovery.task_back_s is None or recovery.all_up_s is None:
        raise TimeoutError(f"the cluster did not recover within {RECOVERY_TIMEOUT_S:g} s:\n{cluster.status()}")
    _check_acknowledged(cluster, acknowledged)
    victim, pid = killed[0]
    after = sum(job.submissions for job in cluster.status().node_jobs)
    return Trial(
        cluster.config.placement,
        victim,
        pid,
        shard,
        first_write_s,
        recovery.task_back_s,
        recovery.all_up_s,
        len(acknowledged),
        after - before,
    )


def _check_acknowledged(cluster: HostedCluster, acknowledged: dict[str, bytes]) -> None:
    """Every acknowledged write reads back with its value (invariant 1)."""
    lost = []
    with cluster.client() as client:
        for key, value in acknowledged.items():
            try:
                if client.get(key, partition_key=FAILOVER_PARTITION).value != value:
                    lost.append(key)
            except KeyNotFound:
                lost.append(key)
    if lost:
        raise AssertionError(f"{len(lost)} of {len(acknowledged)} acknowledged writes lost or changed, e.g. {lost[:3]}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", default="local[4]")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--placements", default="barrier,independent")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--base-port", type=int, default=17648)
    parser.add_argument("--dir", help="data directory (default: a fresh temporary one)")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import quorumstore.spark

    base = Path(args.dir or tempfile.mkdtemp(prefix="qs-spark-failover-"))
    spark = SparkSession.builder.master(args.master).appName("quorumstore failover bench").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    medians: dict[str, float] = {}
    try:
        for placement in args.placements.split(","):
            with quorumstore.spark.start(
                spark, nodes=3, shards=args.shards, replication_factor=3, placement=placement,
                data_dir=base / placement, base_port=args.base_port,
            ) as cluster:
                times = []
                for _ in range(args.trials):
                    trial = asyncio.run(failover_trial(cluster))
                    print(trial, flush=True)
                    times.append(trial.first_write_s)
                medians[placement] = statistics.median(times)
                print(f"{placement:<11} median first write after kill -9: {medians[placement]:.2f} s over {len(times)} trials", flush=True)
    finally:
        spark.stop()
    print(f"master {args.master}, 3 nodes, {args.shards} shards, replication factor 3:")
    for placement, median in medians.items():
        print(f"  {placement:<11} kill -9 -> first successful write: median {median:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
