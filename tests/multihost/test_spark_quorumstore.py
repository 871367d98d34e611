"""quorumstore hosted by a Spark application whose executors run on three hosts.

A Spark standalone master on the bridge and a worker on each of three hosts (network
namespaces). The cluster starts with no host, port or data settings: every
node binds its own host's address on free ports, keeps its data under its worker's
local directory, and registers with the coordinator in the driver (this process).
Each host has three task slots, so that a dead host's node and the streaming query's
tasks find free ones on the others.

Cases: nodes on several hosts serving puts, a DataFrame write and read, and a stateful
streaming query; a host killed (kill -9 of every process in it) and its disk wiped
while writes go on, in both placements; the application stopped and started again on
the hosts' disks.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import Host, Hosts
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from spark_cluster import SparkCluster, running_spark_cluster

import quorumstore.spark
from quorumstore.client import Client
from quorumstore.client.errors import KeyNotFound
from quorumstore.coordinator.cluster_status import all_replicas_serving
from quorumstore.spark.datasource import register
from quorumstore.spark.hosting import executor_hosts
from quorumstore.spark.state_store import PROVIDER_CLASS, ROCKSDB_PROVIDER_CLASS, spark_confs

pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(1800)]

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
#: The nodes' failure timeout: long enough that the load of three Spark workers and the
#: driver on two cores does not look like a dead leader (a leader change fails a
#: DataFrame write's commit, which Spark does not retry).
FAILURE_TIMEOUT_S = 2.0
#: How long a host's loss may take to heal: Spark notices the executor is gone, the node
#: job runs again on another host, and the new replicas catch up.
HEAL_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def spark_cluster(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with running_spark_cluster(hosts, tmp_path_factory.mktemp("spark-cluster"), cores=3) as started:
        yield started


def _session(spark_cluster: SparkCluster) -> SparkSession:
    """The application running now, or a new one (after a test stopped it)."""
    confs = {
        **spark_confs(),
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # A lost executor's tasks are tried again elsewhere, not counted against the job.
        "spark.task.maxFailures": "8",
    }
    return spark_cluster.session(**confs)


def _start(spark: SparkSession, tmp_path: Path, **settings: Any) -> quorumstore.spark.HostedCluster:
    """The cluster every test starts: 3 nodes, 4 shards, replication factor 3, with no
    host, port or data setting; `settings` add to it."""
    return quorumstore.spark.start(
        spark,
        nodes=3,
        shards=4,
        replication_factor=3,
        metadata_url=str(tmp_path / "meta.pb"),
        failure_timeout_s=FAILURE_TIMEOUT_S,
        **settings,
    )


def _host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


def _wait_serving(cluster: quorumstore.spark.HostedCluster, timeout_s: float) -> float:
    """Seconds until every shard has a leader and all its replicas, every node alive."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        status = cluster.status()
        if status.online and all_replicas_serving(status.cluster):
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"not serving after {timeout_s} s:\n{cluster.status()}")


class Writer(threading.Thread):
    """Puts numbered keys until stopped; remembers the ones acknowledged."""

    def __init__(self, address: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.prefix = prefix
        self.acknowledged: list[str] = []
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with Client(self.address, request_timeout_s=10) as client:
            i = 0
            while not self.stopping.is_set():
                key = f"{self.prefix}/{i:08d}"
                try:
                    client.put(key, str(i).encode())
                except Exception:  # noqa: BLE001 - an unacknowledged write may or may not land
                    self.failures += 1
                    time.sleep(0.2)
                else:
                    self.acknowledged.append(key)
                i += 1
                time.sleep(0.01)

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)


def _missing(cluster: quorumstore.spark.HostedCluster, keys: list[str]) -> list[str]:
    missing = []
    with cluster.client(request_timeout_s=30) as client:
        for key in keys:
            try:
                client.get(key)
            except KeyNotFound:
                missing.append(key)
    return missing


def _start_counting(
    spark: SparkSession, events: Path, checkpoint: Path, provider: str, **trigger: object
) -> tuple[StreamingQuery, dict[str, int]]:
    """Starts a query counting events per user, with `provider` as its state store;
    returns it and the latest count of each user it output, updated per micro-batch."""
    spark.conf.set(PROVIDER_CONF, provider)
    latest: dict[str, int] = {}

    def keep(batch: DataFrame, _: int) -> None:
        latest.update({row.user: row.events for row in batch.collect()})

    query = (
        spark.readStream.schema("user string")
        .json(str(events))
        .groupBy("user")
        .agg(F.count("*").alias("events"))
        .writeStream.outputMode("update")
        .foreachBatch(keep)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )
    return query, latest


def _write_events(events: Path, batch: int, users: int = 20) -> None:
    lines = [f'{{"user": "u{(batch * 7 + i) % users}"}}' for i in range(batch % 5 + 3)]
    (events / f"part-{batch:04d}.json").write_text("\n".join(lines))


def _final_counts(spark: SparkSession, events: Path, checkpoint: Path, provider: str) -> dict:
    """Runs the counting query to the end of the input with `provider` as state store."""
    query, latest = _start_counting(spark, events, checkpoint, provider, availableNow=True)
    query.awaitTermination()
    return latest


def _kill_and_wipe(spark_cluster: SparkCluster, host: Host) -> None:
    """kill -9 of every process of `host` (its Spark worker, executor and node tasks),
    then its local directory, where the nodes keep their data, is wiped."""
    host.kill_all()
    local = spark_cluster.directory / f"worker-h{host.index}" / "local"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir()


def _restart_worker(spark: SparkSession, spark_cluster: SparkCluster, host: Host) -> None:
    """Starts the dead host's worker again (an empty host joining) and waits until the
    application has an executor there again, so the next test has every host."""
    index = list(spark_cluster.hosts).index(host)
    spark_cluster.workers[index] = spark_cluster.start_worker(host)
    spark_cluster.wait_alive(len(spark_cluster.hosts))
    deadline = time.monotonic() + 120
    while host.address not in executor_hosts(spark.sparkContext):
        assert time.monotonic() < deadline, f"no executor on {host.address} after 120 s"
        time.sleep(1.0)


def test_nodes_on_several_hosts_serve_puts_dataframes_and_streaming(
    spark_cluster: SparkCluster, hosts: Hosts, tmp_path: Path
) -> None:
    spark = _session(spark_cluster)
    cluster = _start(spark, tmp_path)
    try:
        # One node per host: Spark is asked for a host of its own for each.
        on = {_host_of(a) for a in cluster.addresses}
        assert on == {h.address for h in hosts}, cluster.addresses
        status = str(cluster.status())
        assert all(f"node{i} at " in status for i in range(3)), status

        with cluster.client() as client:
            client.put("/hosts/greeting", b"hello")
            assert client.get("/hosts/greeting").value == b"hello"

        register(spark, address=cluster.address)
        rows = [(f"/df/{i:03d}", f"v{i}".encode()) for i in range(200)]
        spark.createDataFrame(rows, "key string, value binary").write.format("quorumstore").mode(
            "append"
        ).save()
        read = spark.read.format("quorumstore").option("keyPrefix", "/df/").load()
        assert sorted((r.key, bytes(r.value)) for r in read.collect()) == rows

        events = tmp_path / "events"
        events.mkdir()
        for batch in range(6):
            _write_events(events, batch)
        ours = _final_counts(spark, events, tmp_path / "ckpt-qs", PROVIDER_CLASS)
        reference = _final_counts(spark, events, tmp_path / "ckpt-rocks", ROCKSDB_PROVIDER_CLASS)
        assert ours == reference and sum(ours.values()) == sum(b % 5 + 3 for b in range(6))
    finally:
        cluster.stop()


def test_the_application_started_again_finds_all_its_data(
    spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    spark = _session(spark_cluster)
    cluster = _start(spark, tmp_path, cluster_name="restarted")
    keys = [f"/kept/{i:04d}" for i in range(300)]
    with cluster.client() as client:
        for key in keys:
            client.put(key, key.encode())
    first = cluster.addresses
    cluster.stop()
    spark.stop()

    spark = _session(spark_cluster)
    cluster = _start(spark, tmp_path, cluster_name="restarted")
    try:
        assert [_host_of(a) for a in cluster.addresses] == [_host_of(a) for a in first]
        assert _missing(cluster, keys) == []
    finally:
        cluster.stop()


@pytest.mark.parametrize("placement", ["independent", "barrier"])
def test_a_host_killed_and_wiped_loses_no_write_and_the_query_goes_on(
    spark_cluster: SparkCluster,
    hosts: Hosts,
    tmp_path: Path,
    placement: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spark = _session(spark_cluster)
    cluster = _start(spark, tmp_path, placement=placement, cluster_name=f"wiped-{placement}")
    events = tmp_path / "events"
    events.mkdir()
    query, latest = _start_counting(
        spark, events, tmp_path / "ckpt-qs", PROVIDER_CLASS, processingTime="1 second"
    )
    writer = Writer(cluster.address, "/wiped")
    writer.start()
    victim_host = None
    try:
        for batch in range(4):
            _write_events(events, batch)
            time.sleep(1.0)
        before = dict(zip(cluster.config.node_names, cluster.addresses, strict=True))
        assert len({_host_of(a) for a in before.values()}) == 3, before
        victim_name, victim_address = min(before.items())
        victim_host = next(h for h in hosts if h.address == _host_of(victim_address))
        killed_at = time.monotonic()
        _kill_and_wipe(spark_cluster, victim_host)
        for batch in range(4, 10):
            _write_events(events, batch)
            time.sleep(1.0)
        healed_s = _wait_serving(cluster, HEAL_TIMEOUT_S)
        after = dict(zip(cluster.config.node_names, cluster.addresses, strict=True))
        moved = [n for n in before if _host_of(after[n]) == victim_host.address]
        assert moved == [], f"a node still on the dead host: {after}"
        writer.stop()
        with capsys.disabled():
            print(
                f"\n[{placement}] host {victim_host.address} (with {victim_name}) killed and wiped: "
                f"every shard had all its replicas again {time.monotonic() - killed_at:.1f} s "
                f"later (serving check {healed_s:.1f} s); {len(writer.acknowledged)} writes "
                f"acknowledged, {writer.failures} failed meanwhile; nodes {before} -> {after}"
            )
        assert len(writer.acknowledged) > 100
        assert _missing(cluster, writer.acknowledged) == []

        deadline = time.monotonic() + 180
        expected_total = sum(b % 5 + 3 for b in range(10))
        while sum(latest.values()) < expected_total and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(1.0)
        query.stop()
        reference = _final_counts(spark, events, tmp_path / "ckpt-rocks", ROCKSDB_PROVIDER_CLASS)
        assert latest == reference, (latest, reference)
    finally:
        writer.stop()
        query.stop()
        cluster.stop()
        if victim_host is not None:
            _restart_worker(spark, spark_cluster, victim_host)
