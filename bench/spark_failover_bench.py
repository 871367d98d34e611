"""Failover of a Spark-hosted cluster in each placement: kill -9 of one node -> writes again.

A cluster is started with `quorumstore.spark.start` in each placement (barrier: one
barrier job for all nodes; independent: one job per node). Each trial kill -9s the
Python worker process running the leader of one shard while a steady load of writes
to that shard keeps coming (one put every 10 ms through quorumstore's `AsyncClient`,
which follows leader changes and retries each put for up to 2 s), and reports, in
seconds from the kill:

* first write: the first write issued after the kill succeeds;
* writes back for good: the first success after the last failed write. In the
  barrier placement the surviving nodes may elect a leader and take writes for a few
  seconds before Spark kills their tasks too, so the first write can come before the
  real outage; this is the number to compare;
* task back: Spark runs a new task for the killed node (its pid file names a new,
  live process);
* all up: every shard has a leader and the coordinator reaches every node;

and checks that every write acknowledged during the trial reads back unchanged. The
medians of the trials are printed per placement.

With ``--hosts`` it measures the multi-host case instead (as root): three hosts made as
network namespaces, a Spark standalone worker on each (tests/multihost/ builds both),
the cluster started with no host or port settings in the independent placement, and
for each key count in ``--keys`` and trial a fresh cluster loaded with that many keys
of 100 bytes. Each trial kill -9s every process of the host running the failover shard's
leader and wipes that host's disk under the same write load, and reports the first
write after the kill and the time until every shard has its full replica set again
(every replica serving and caught up, the dead node's on a new host).

Usage: python bench/spark_failover_bench.py [--master local[4]] [--trials 3]
                                            [--placements barrier,independent] [--dir D]
       python bench/spark_failover_bench.py --hosts [--keys 100000,1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from quorumstore import AsyncClient
from quorumstore.spark import HostedCluster
from quorumstore.wire.addresses import host_of

#: Every failover write carries this partition key, so all go to the one shard whose
#: leader is killed (writes to other shards would succeed at once in the independent
#: placement and measure nothing).
FAILOVER_PARTITION = "spark-failover"
RECOVERY_TIMEOUT_S = 300.0
#: Writes before the kill (all must succeed) and after the cluster reports itself up.
WARMUP_S = 1.0
SETTLE_S = 2.0
#: How long the client retries one put across the outage before it counts as failed.
PUT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Trial:
    """One kill -9 and what followed it, times in seconds from the kill."""

    placement: str
    victim: int
    pid: int
    shard: int
    first_write_s: float
    recovered_s: float
    task_back_s: float
    all_up_s: float
    acknowledged: int
    resubmissions: int

    def __str__(self) -> str:
        return (
            f"{self.placement:<11} kill -9 node {self.victim} (pid {self.pid}, leader of shard {self.shard}): "
            f"first write {self.first_write_s:.2f} s, writes back for good {self.recovered_s:.2f} s, "
            f"task back {self.task_back_s:.2f} s, all up {self.all_up_s:.2f} s; "
            f"{self.acknowledged} acknowledged writes intact; node jobs resubmitted {self.resubmissions}x"
        )


@dataclass(frozen=True)
class _Write:
    issued: float
    done: float
    ok: bool


class _PacedWrites:
    """A steady write load: one write every `interval_s`, each on its own.

    Pacing (as bench/measure.py's `measure_failover` does) keeps the resolution at the
    interval: a write parked on a dead leader does not hold up the next one. Unlike
    `measure_failover` it keeps writing after the first success, because in the
    barrier placement the surviving nodes can elect a leader and take writes for a
    few seconds before Spark kills them too.
    """

    def __init__(self, put: Callable[[str, bytes], Awaitable[object]], interval_s: float = 0.01):
        self._put, self._interval_s = put, interval_s
        self.writes: list[_Write] = []
        self._stop = asyncio.Event()
        self._pacer: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._pacer = asyncio.get_running_loop().create_task(self._pace())

    async def stop(self) -> list[_Write]:
        self._stop.set()
        assert self._pacer is not None
        await self._pacer
        return sorted(self.writes, key=lambda w: w.issued)

    async def _pace(self) -> None:
        prefix = f"bench/spark-failover/{time.time_ns()}/"
        value = os.urandom(100)
        pending: set[asyncio.Task[None]] = set()
        for n in itertools.count():
            if self._stop.is_set():
                break
            pending.add(
                asyncio.get_running_loop().create_task(self._write(f"{prefix}{n:010d}", value))
            )
            pending = {t for t in pending if not t.done()}
            await asyncio.sleep(self._interval_s)
        await asyncio.gather(*pending)

    async def _write(self, key: str, value: bytes) -> None:
        issued = time.monotonic()
        try:
            await self._put(key, value)
            ok = True
        except Exception:  # noqa: BLE001 - any failure counts as one
            ok = False
        self.writes.append(_Write(issued, time.monotonic(), ok))


def _failover_writes(client: AsyncClient) -> tuple[_PacedWrites, dict[str, bytes]]:
    """A paced load of puts to the failover shard, and the writes it had acknowledged."""
    acknowledged: dict[str, bytes] = {}

    async def put(key: str, value: bytes) -> None:
        await client.put(key, value, partition_key=FAILOVER_PARTITION)
        acknowledged[key] = value

    return _PacedWrites(put), acknowledged


def wait_converged(cluster: HostedCluster, timeout_s: float = RECOVERY_TIMEOUT_S) -> None:
    """Every shard led and every replica caught up (eligible), so any one node may die.

    Killing a node while another is still catching up would leave a shard no electable
    majority until the dead node returns, and measure that instead of a failover.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = cluster.status()
        if status.online and all(
            len(s.eligible) == cluster.config.nodes for s in status.cluster.metadata.shards
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"the cluster did not converge within {timeout_s:g} s:\n{cluster.status()}")


def _wait_recovered(
    cluster: HostedCluster, victim: int, old_pid: int, killed_at: float
) -> tuple[float, float]:
    """(task back, all up) in seconds after the kill: the victim's new task runs, then
    every shard has a leader and the coordinator reaches every node."""
    task_back: float | None = None
    while time.monotonic() < killed_at + RECOVERY_TIMEOUT_S:
        pid = cluster.node_pids().get(victim)
        if task_back is None and pid is not None and pid != old_pid and _alive(pid):
            task_back = time.monotonic() - killed_at
        if task_back is not None and cluster.status().online:
            return task_back, time.monotonic() - killed_at
        time.sleep(0.05)
    raise TimeoutError(
        f"the cluster did not recover within {RECOVERY_TIMEOUT_S:g} s:\n{cluster.status()}"
    )


async def failover_trial(cluster: HostedCluster) -> Trial:
    """Kills the leader of the failover shard under a steady write load; returns once the
    cluster is back by itself and every acknowledged write has been read back."""
    await asyncio.to_thread(wait_converged, cluster)
    submissions_before = sum(job.submissions for job in cluster.status().node_jobs)
    async with AsyncClient(cluster.address, request_timeout_s=PUT_TIMEOUT_S) as client:
        shard = client.shard_for(FAILOVER_PARTITION)
        load, acknowledged = _failover_writes(client)
        load.start()
        await asyncio.sleep(WARMUP_S)
        victim = cluster.addresses.index(cluster.status().leaders[shard])
        pid = cluster.node_pids()[victim]
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            await asyncio.sleep(0.005)
        killed_at = time.monotonic()
        task_back_s, all_up_s = await asyncio.to_thread(
            _wait_recovered, cluster, victim, pid, killed_at
        )
        await asyncio.sleep(SETTLE_S)
        writes = await load.stop()
        lost = await _lost(client, acknowledged)
    if not all(w.ok for w in writes if w.done < killed_at):
        raise RuntimeError("writes failed before the kill: the cluster was not healthy")
    after_kill = [w for w in writes if w.issued >= killed_at]
    first_write = min((w.done for w in after_kill if w.ok), default=None)
    last_failure = max((w.issued for w in writes if not w.ok), default=killed_at)
    recovered = min((w.done for w in after_kill if w.ok and w.issued > last_failure), default=None)
    if first_write is None or recovered is None:
        raise RuntimeError(f"writes still fail {SETTLE_S:g} s after the cluster reported itself up")
    if lost:
        raise AssertionError(
            f"{len(lost)} of {len(acknowledged)} acknowledged writes lost, changed or unreadable, e.g. {lost[:3]}"
        )
    submissions_after = sum(job.submissions for job in cluster.status().node_jobs)
    return Trial(
        cluster.config.placement,
        victim,
        pid,
        shard,
        first_write - killed_at,
        recovered - killed_at,
        task_back_s,
        all_up_s,
        len(acknowledged),
        submissions_after - submissions_before,
    )


@dataclass(frozen=True)
class HostTrial:
    """One host killed and wiped, times in seconds from the kill."""

    keys: int
    host: str
    nodes: tuple[str, ...]
    first_write_s: float
    full_replicas_s: float
    acknowledged: int
    failed: int

    def __str__(self) -> str:
        return (
            f"{self.keys:>8} keys: kill -9 of host {self.host} (node {', '.join(self.nodes)}) and "
            f"its disk wiped: first write {self.first_write_s:.2f} s, every shard's full replica "
            f"set again {self.full_replicas_s:.2f} s; {self.acknowledged} acknowledged writes "
            f"intact ({self.failed} failed during the fault)"
        )


def _load(address: str, keys: int) -> float:
    """Writes `keys` keys of 100 bytes through the data service; returns the seconds."""
    import pyarrow as pa

    from quorumstore.client.data_service import DataClient
    from quorumstore.wire.metadata import ClientSerial

    began = time.monotonic()
    chunk = 50_000
    with DataClient(address) as client:
        for n, start in enumerate(range(0, keys, chunk)):
            stop = min(start + chunk, keys)
            table = pa.table(
                {
                    "key": pa.array([f"bench/load/{i:08d}" for i in range(start, stop)]),
                    "value": pa.array([os.urandom(100) for _ in range(start, stop)], pa.binary()),
                }
            )
            for shard, part in client.route(table).items():
                client.write(shard, part, origin=ClientSerial("failover-bench-load", n))
    return time.monotonic() - began


def _full_replica_set(cluster: HostedCluster) -> bool:
    """Every shard led, every replica following in the leader's term, and every replica
    counted again (caught up: the whole ensemble is eligible)."""
    from quorumstore.coordinator.cluster_status import all_replicas_serving

    status = cluster.status()
    return (
        status.online
        and all_replicas_serving(status.cluster)
        and all(len(s.eligible) == cluster.config.nodes for s in status.cluster.metadata.shards)
    )


async def host_trial(
    cluster: HostedCluster, keys: int, kill_host: Callable[[str], None]
) -> HostTrial:
    """Kills the host of the failover shard's leader (`kill_host(address)` kills every
    process of the host with that address and wipes its disk) under a steady write
    load; returns once every shard has its full replica set again."""
    await asyncio.to_thread(wait_converged, cluster)
    async with AsyncClient(cluster.address, request_timeout_s=PUT_TIMEOUT_S) as client:
        shard = client.shard_for(FAILOVER_PARTITION)
        load, acknowledged = _failover_writes(client)
        load.start()
        await asyncio.sleep(WARMUP_S)
        leader = cluster.status().leaders[shard]
        host = host_of(leader)
        nodes = tuple(
            name
            for name, address in zip(cluster.config.node_names, cluster.addresses, strict=True)
            if host_of(address) == host
        )
        killed_at = time.monotonic()  # kill_host returns once every process is gone
        await asyncio.to_thread(kill_host, host)
        while not await asyncio.to_thread(_full_replica_set, cluster):
            if time.monotonic() - killed_at > RECOVERY_TIMEOUT_S:
                raise TimeoutError(f"no full replica set after {RECOVERY_TIMEOUT_S:g} s")
            await asyncio.sleep(0.1)
        full_s = time.monotonic() - killed_at
        await asyncio.sleep(SETTLE_S)
        writes = await load.stop()
        lost = await _lost(client, acknowledged)
    after_kill = [w for w in writes if w.issued >= killed_at]
    first_write = min((w.done for w in after_kill if w.ok), default=None)
    if first_write is None:
        raise RuntimeError("no write succeeded after the kill")
    if lost:
        raise AssertionError(f"{len(lost)} of {len(acknowledged)} acknowledged writes lost")
    return HostTrial(
        keys,
        host,
        nodes,
        first_write - killed_at,
        full_s,
        len(acknowledged),
        sum(1 for w in after_kill if not w.ok),
    )


def main_hosts(args: argparse.Namespace) -> int:
    """The multi-host case (see the module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "multihost"))
    from netns import Hosts  # the test harness's hosts and Spark cluster
    from spark_cluster import running_spark_cluster

    import quorumstore.spark
    from quorumstore.spark.hosting import executor_hosts

    base = Path(args.dir or tempfile.mkdtemp(prefix="qs-host-failover-"))
    results: list[HostTrial] = []
    with Hosts(3) as hosts, running_spark_cluster(hosts, base / "spark", cores=2) as spark_cluster:
        spark = spark_cluster.session("quorumstore host failover bench")
        spark.sparkContext.setLogLevel("ERROR")
        by_address = {host.address: host for host in hosts}

        def kill_host(address: str) -> None:
            host = by_address[address]
            host.kill_all()
            local = spark_cluster.directory / f"worker-h{host.index}" / "local"
            shutil.rmtree(local, ignore_errors=True)
            local.mkdir()

        # A fresh cluster per trial: after a host's loss its node shares a host with
        # another, and losing that host too would take a majority of every shard.
        for keys in (int(k) for k in args.keys.split(",")):
            for n in range(args.trials):
                with quorumstore.spark.start(
                    spark,
                    nodes=3,
                    shards=args.shards,
                    replication_factor=3,
                    placement="independent",
                    cluster_name=f"bench-{keys}-{n}",
                    metadata_url=str(base / f"meta-{keys}-{n}" / "metadata.pb"),
                ) as cluster:
                    load_s = _load(cluster.address, keys)
                    print(f"loaded {keys} keys in {load_s:.1f} s", flush=True)
                    trial = asyncio.run(host_trial(cluster, keys, kill_host))
                    print(trial, flush=True)
                    results.append(trial)
                # The killed host's worker joins again, empty, and gets an executor.
                host = by_address[trial.host]
                spark_cluster.workers[list(hosts).index(host)] = spark_cluster.start_worker(host)
                spark_cluster.wait_alive(len(hosts))
                while trial.host not in executor_hosts(spark.sparkContext):
                    time.sleep(1.0)
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    print(f"3 hosts, 3 nodes, {args.shards} shards, replication factor 3, independent placement:")
    for keys in sorted({t.keys for t in results}):
        trials = [t for t in results if t.keys == keys]
        print(
            f"  {keys:>8} keys: host kill -9 -> first write median "
            f"{statistics.median(t.first_write_s for t in trials):.2f} s, full replica set "
            f"median {statistics.median(t.full_replicas_s for t in trials):.2f} s"
        )
    return 0


async def _lost(client: AsyncClient, acknowledged: dict[str, bytes]) -> list[str]:
    """Acknowledged writes that do not read back with their value (invariant 1)."""
    keys = list(acknowledged)
    records = await asyncio.gather(
        *(client.get(key, partition_key=FAILOVER_PARTITION) for key in keys), return_exceptions=True
    )
    return [
        k
        for k, r in zip(keys, records)
        if isinstance(r, BaseException) or r.value != acknowledged[k]
    ]


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
    parser.add_argument(
        "--hosts", action="store_true", help="the multi-host case: kill -9 and wipe of a host"
    )
    parser.add_argument("--keys", default="100000,1000000", help="key counts of --hosts")
    args = parser.parse_args(argv)
    if args.hosts:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        return main_hosts(args)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import quorumstore.spark

    base = Path(args.dir or tempfile.mkdtemp(prefix="qs-spark-failover-"))
    remove_base = args.dir is None
    spark = (
        SparkSession.builder.master(args.master)
        .appName("quorumstore failover bench")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    results: dict[str, list[Trial]] = {}
    try:
        for placement in args.placements.split(","):
            with quorumstore.spark.start(
                spark,
                nodes=3,
                shards=args.shards,
                replication_factor=3,
                placement=placement,
                data_dir=base / placement,
                base_port=args.base_port,
            ) as cluster:
                results[placement] = []
                for _ in range(args.trials):
                    trial = asyncio.run(failover_trial(cluster))
                    print(trial, flush=True)
                    results[placement].append(trial)
    finally:
        spark.stop()
        if remove_base:
            shutil.rmtree(base, ignore_errors=True)
    print(
        f"master {args.master}, 3 nodes, {args.shards} shards, replication factor 3, {args.trials} trials each:"
    )
    for placement, trials in results.items():
        print(
            f"  {placement:<11} kill -9 -> writes back for good: median "
            f"{statistics.median(t.recovered_s for t in trials):.2f} s "
            f"(first write: median {statistics.median(t.first_write_s for t in trials):.2f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
