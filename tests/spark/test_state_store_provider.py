"""The quorumstore StateStoreProvider against Spark's own RocksDB provider.

Two tiers share one SparkSession (local[2]) and one 3-node cluster (replication factor 3,
real processes on loopback, started with tests/cluster_harness.py's LocalCluster):

- the provider API driven directly through py4j, the same calls on both providers, for
  what operators cannot show precisely: ordering of scans, column families, several
  values per key, range scans, fencing of a second attempt, checkpoint ids (format v2),
  retention, and the error when the cluster is unreachable;
- Spark's stateful operators, each query run once per provider on the same input files
  (one file per micro-batch), with every micro-batch's output compared; then a restart
  from the checkpoint and a kill -9 of a storage leader in the middle of a query.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import xxhash
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cluster_harness import LocalCluster
from quorumstore.spark.conf_keys import KNOWN_KEYS
from quorumstore.spark.state_store import PROVIDER_CLASS, ROCKSDB_PROVIDER_CLASS, spark_confs

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
PROVIDERS = {"rocksdb": ROCKSDB_PROVIDER_CLASS, "quorumstore": PROVIDER_CLASS}
QUERY_TIMEOUT_S = 180


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("cluster"), nodes=3, shards=4, replication_factor=3, fsync=False
    )
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state-local-copies")


@pytest.fixture(scope="module")
def spark(cluster: LocalCluster, local_dir: Path) -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import SparkContext

    if SparkContext._gateway is not None:
        pytest.fail(
            "a JVM started by an earlier test module is still running, and the provider jar "
            "reaches the driver's class path only when a JVM starts: run this module in its "
            "own pytest process (scripts/test.sh does)"
        )
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("quorumstore-state-store-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Spark's maintenance thread (snapshots, retention) runs every second, not every
        # minute, so that a test sees it act.
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
        # The reference provider commits faster with changelog checkpointing; same results.
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    )
    confs = spark_confs(",".join(cluster.nodes), timeout_ms=60_000, local_dir=str(local_dir))
    for key, value in confs.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# ------------------------------------------------------------------ routing hash


def test_xxh3_matches_python_xxhash(spark: SparkSession) -> None:
    """The JVM's XXH3-64 (shard routing) equals xxhash.xxh3_64 for every length class."""
    xxh3 = spark._jvm.io.quorumstore.spark.state.Xxh3
    for length in [
        0,
        1,
        2,
        3,
        4,
        7,
        8,
        9,
        15,
        16,
        17,
        31,
        64,
        100,
        128,
        129,
        200,
        240,
        241,
        1023,
        1024,
        1025,
        4097,
    ]:
        data = bytes((i * 131 + length) % 256 for i in range(length))
        assert xxh3.hash64(bytearray(data)) & 0xFFFFFFFFFFFFFFFF == xxhash.xxh3_64_intdigest(
            data
        ), length
    key = "statestore/8d1c2e9a-0000-4000-8000-000000000000/0/1/default"
    assert xxh3.hash64(key) & 0xFFFFFFFFFFFFFFFF == xxhash.xxh3_64_intdigest(key.encode())


# ------------------------------------------------------------------ provider API via py4j


class Jvm:
    """Thin py4j helpers: UnsafeRows of ints and strings, Scala options, providers."""

    def __init__(self, spark: SparkSession, root: Path):
        self.spark = spark
        self.jvm = spark._jvm
        self.gateway = spark.sparkContext._gateway
        self.state = self.jvm.org.apache.spark.sql.execution.streaming.state
        self.none = getattr(self.jvm.scala.__getattr__("None$"), "MODULE$")
        self.root = root
        stream_execution = getattr(
            self.jvm.org.apache.spark.sql.execution.streaming.runtime.__getattr__(
                "StreamExecution$"
            ),
            "MODULE$",
        )
        self.run_id_key = stream_execution.RUN_ID_KEY()

    def some(self, value: object) -> object:
        return self.jvm.scala.Some(value)

    def schema(self, ddl: str) -> object:
        return self.jvm.org.apache.spark.sql.types.StructType.fromDDL(ddl)

    def row(self, *values: object) -> object:
        writer = self.jvm.org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter(
            len(values)
        )
        writer.resetRowWriter()
        for i, v in enumerate(values):
            writer.write(
                i,
                self.jvm.org.apache.spark.unsafe.types.UTF8String.fromString(v)
                if isinstance(v, str)
                else v,
            )
        return writer.getRow().copy()

    def rows(self, iterator: object, key_types: str = "si", value_types: str = "i") -> list[tuple]:
        def decode(row: object, types: str) -> tuple:
            return tuple(
                row.getUTF8String(i).toString() if t == "s" else row.getInt(i)
                for i, t in enumerate(types)
            )

        out = []
        while iterator.hasNext():
            pair = iterator.next()
            out.append((decode(pair.key(), key_types), decode(pair.value(), value_types)))
        return out

    def values(self, iterator: object) -> list[int]:
        out = []
        while iterator.hasNext():
            out.append(iterator.next().getInt(0))
        return out

    def provider(
        self,
        cls: str,
        name: str,
        spec: object,
        *,
        column_families: bool = False,
        sql_confs: dict[str, str] | None = None,
        quorum_confs: dict[str, str] | None = None,
    ) -> object:
        """A provider of partition 0 of a store under `root/name` (same name: same state)."""
        sql_conf = self.jvm.org.apache.spark.sql.internal.SQLConf()
        for key, value in (sql_confs or {}).items():
            sql_conf.setConfString(key, value)
        hadoop_conf = self.jvm.org.apache.hadoop.conf.Configuration(
            self.spark._jsc.hadoopConfiguration()
        )
        hadoop_conf.set(self.run_id_key, str(uuid.uuid4()))
        for key, value in (quorum_confs or {}).items():
            hadoop_conf.set(key, value)
        store_id = self.state.StateStoreId(f"file:{self.root / name}/state", 0, 0, "default")
        provider = self.state.StateStoreProvider.create(cls)
        provider.init(
            store_id,
            spec.keySchema(),
            self.schema("v int"),
            spec,
            column_families,
            self.state.StateStoreConf.apply(sql_conf),
            hadoop_conf,
            False,
            self.none,
        )
        return provider

    def store(self, provider: object, version: int, unique_id: str | None = None) -> object:
        ckpt = self.none if unique_id is None else self.some(unique_id)
        return provider.getStore(version, ckpt, False, False)

    def int_seq(self, values: list[int]) -> object:
        items = self.jvm.java.util.ArrayList()
        for v in values:
            items.add(v)
        return self.jvm.scala.jdk.javaapi.CollectionConverters.asScala(items).toSeq()


@pytest.fixture(scope="module")
def jvm(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Jvm:
    return Jvm(spark, tmp_path_factory.mktemp("providers"))


def _each_provider(
    jvm: Jvm, name: str, scenario: Callable[[str, str], object]
) -> dict[str, object]:
    return {short: scenario(cls, f"{name}-{short}") for short, cls in PROVIDERS.items()}


def test_get_put_remove_iterate_and_prefix_scan_like_rocksdb(jvm: Jvm) -> None:
    """Same calls, same answers; a fresh provider (another executor) loads the version in bulk."""

    def scenario(cls: str, name: str) -> object:
        spec = jvm.state.PrefixKeyScanStateEncoderSpec(jvm.schema("k string, n int"), 1)
        store = jvm.store(jvm.provider(cls, name, spec), 0)
        for k, n, v in [
            ("a", 1, 10),
            ("a", 2, 20),
            ("b", -1, 30),
            ("a", -5, 5),
            ("b", 7, 1),
            ("c", 0, 0),
        ]:
            store.put(jvm.row(k, n), jvm.row(v), "default")
        store.remove(jvm.row("b", 7), "default")
        store.remove(jvm.row("zz", 0), "default")
        assert store.commit() == 1

        store = jvm.store(jvm.provider(cls, name, spec), 1)
        got = jvm.rows(store.iterator("default"))
        a = jvm.rows(store.prefixScan(jvm.row("a"), "default"))
        missing = store.get(jvm.row("b", 7), "default")
        store.put(jvm.row("a", 2), jvm.row(21), "default")
        store.remove(jvm.row("c", 0), "default")
        during = jvm.rows(store.prefixScan(jvm.row("a"), "default"))
        assert store.commit() == 2
        metrics = store.metrics()
        after = jvm.rows(jvm.store(jvm.provider(cls, name, spec), 2).iterator("default"))
        return got, a, missing, during, after, metrics.numKeys()

    results = _each_provider(jvm, "basic", scenario)
    assert results["quorumstore"] == results["rocksdb"]
    assert results["quorumstore"][4][0] == (("a", 1), (10,))


def test_column_families_multiple_values_and_range_scan_like_rocksdb(jvm: Jvm) -> None:
    def scenario(cls: str, name: str) -> object:
        key_schema = jvm.schema("k string, n int")
        default_spec = jvm.state.NoPrefixKeyStateEncoderSpec(key_schema)
        range_spec = jvm.state.RangeKeyScanStateEncoderSpec(key_schema, jvm.int_seq([1]))

        def families(store: object) -> None:
            store.createColFamilyIfAbsent(
                "ranged", key_schema, jvm.schema("v int"), range_spec, False, False
            )
            store.createColFamilyIfAbsent(
                "lists", key_schema, jvm.schema("v int"), default_spec, True, False
            )
            store.createColFamilyIfAbsent(
                "doomed", key_schema, jvm.schema("v int"), default_spec, False, False
            )

        store = jvm.store(jvm.provider(cls, name, default_spec, column_families=True), 0)
        families(store)
        for k, n in [("x", 5), ("y", -3), ("z", 100), ("w", 0), ("v", -200)]:
            store.put(jvm.row(k, n), jvm.row(n * 2), "ranged")
        store.merge(jvm.row("l", 1), jvm.row(1), "lists")
        store.merge(jvm.row("l", 1), jvm.row(2), "lists")
        values = jvm.gateway.new_array(
            jvm.jvm.org.apache.spark.sql.catalyst.expressions.UnsafeRow, 2
        )
        values[0], values[1] = jvm.row(7), jvm.row(8)
        store.putList(jvm.row("m", 1), values, "lists")
        store.put(jvm.row("d", 1), jvm.row(1), "doomed")
        store.put(jvm.row("k", 1), jvm.row(1), "default")
        assert store.commit() == 1

        store = jvm.store(jvm.provider(cls, name, default_spec, column_families=True), 1)
        families(store)
        ordered = jvm.rows(store.iterator("ranged"))
        window = jvm.rows(
            store.rangeScan(jvm.some(jvm.row("", -3)), jvm.some(jvm.row("", 6)), "ranged")
        )
        merged = jvm.values(store.valuesIterator(jvm.row("l", 1), "lists"))
        listed = jvm.values(store.valuesIterator(jvm.row("m", 1), "lists"))
        store.merge(jvm.row("m", 1), jvm.row(9), "lists")
        removed = store.removeColFamilyIfExists("doomed")
        names_during = sorted(store.allColumnFamilyNames().toList().mkString(",").split(","))
        assert store.commit() == 2

        store = jvm.store(jvm.provider(cls, name, default_spec, column_families=True), 2)
        families(store)
        after = (
            jvm.values(store.valuesIterator(jvm.row("m", 1), "lists")),
            jvm.rows(store.iterator("doomed")),
            jvm.rows(store.iterator("default")),
        )
        store.abort()
        return ordered, window, merged, listed, removed, names_during, after

    results = _each_provider(jvm, "families", scenario)
    assert results["quorumstore"] == results["rocksdb"]
    assert [k[1] for k, _ in results["quorumstore"][0]] == [-200, -3, 0, 5, 100]


def test_zombie_attempt_cannot_overwrite_a_newer_version(jvm: Jvm) -> None:
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    store = jvm.store(jvm.provider(PROVIDER_CLASS, "fencing", spec), 0)
    store.put(jvm.row("a", 1), jvm.row(1), "default")
    store.commit()

    # Two attempts of the task of batch 2 on two executors load version 1.
    winner = jvm.store(jvm.provider(PROVIDER_CLASS, "fencing", spec), 1)
    zombie = jvm.store(jvm.provider(PROVIDER_CLASS, "fencing", spec), 1)
    winner.put(jvm.row("a", 1), jvm.row(2), "default")
    zombie.put(jvm.row("a", 1), jvm.row(666), "default")
    assert winner.commit() == 2
    with pytest.raises(Exception, match="another attempt of this task"):
        zombie.commit()
    zombie.abort()

    # A task retried after the winner committed loads version 1 again and may commit.
    retry = jvm.store(jvm.provider(PROVIDER_CLASS, "fencing", spec), 1)
    assert jvm.rows(retry.iterator("default")) == [(("a", 1), (1,))]
    retry.put(jvm.row("a", 1), jvm.row(3), "default")
    assert retry.commit() == 2
    latest = jvm.store(jvm.provider(PROVIDER_CLASS, "fencing", spec), 2)
    assert jvm.rows(latest.iterator("default")) == [(("a", 1), (3,))]
    latest.abort()


def test_checkpoint_ids_name_exact_versions(jvm: Jvm) -> None:
    """Format v2: getStore(version, id) returns that commit, also when a later one replaced it."""
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    store = jvm.store(jvm.provider(PROVIDER_CLASS, "ckpt-ids", spec), 0)
    store.put(jvm.row("a", 1), jvm.row(1), "default")
    store.commit()
    info1 = store.getStateStoreCheckpointInfo()
    id1 = info1.stateStoreCkptId().get()
    assert info1.batchVersion() == 1 and info1.baseStateStoreCkptId().isEmpty()

    ids = {}
    for value in (10, 20):  # two successive attempts at version 2
        store = jvm.store(jvm.provider(PROVIDER_CLASS, "ckpt-ids", spec), 1, id1)
        store.put(jvm.row("a", 1), jvm.row(value), "default")
        store.commit()
        info = store.getStateStoreCheckpointInfo()
        assert info.baseStateStoreCkptId().get() == id1
        ids[value] = info.stateStoreCkptId().get()
    for value, ckpt in ids.items():
        store = jvm.store(jvm.provider(PROVIDER_CLASS, "ckpt-ids", spec), 2, ckpt)
        assert jvm.rows(store.iterator("default")) == [(("a", 1), (value,))]
        store.abort()


def test_a_copied_checkpoint_cannot_fork_the_state_under_format_v1(jvm: Jvm) -> None:
    """Checkpoints at three locations share one query id (copies of one checkpoint)."""
    query_id = str(uuid.uuid4())
    for name in ("fork-original", "fork-copy", "fork-moved"):
        (jvm.root / name).mkdir(parents=True)
        (jvm.root / name / "metadata").write_text(json.dumps({"id": query_id}))
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    v2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}

    def load(name: str, version: int, ckpt: str | None = None, **confs: object) -> object:
        store = jvm.store(jvm.provider(PROVIDER_CLASS, name, spec, **confs), version, ckpt)
        assert jvm.rows(store.iterator("default")) == ([(("a", 1), (version,))] if version else [])
        store.put(jvm.row("a", 1), jvm.row(version + 1), "default")
        return store

    ids = {}
    for version in (0, 1):
        store = load("fork-original", version)
        store.commit()
        ids[version + 1] = store.getStateStoreCheckpointInfo().stateStoreCkptId().get()
    # The copy was taken at version 1 and runs while the original goes on.
    copy = load("fork-copy", 1)
    with pytest.raises(Exception) as refused:
        copy.commit()
    copy.abort()
    message = str(refused.value)
    assert "CheckpointForkException" in message
    original_state = f"file:{jvm.root}/fork-original/state"
    assert (
        f"last committed (version 2) by the query with state checkpoint {original_state}" in message
    )
    assert "spark.quorumstore.stateStore.prefix" in message
    assert "checkpointFormatVersion=2" in message
    # Nothing of it was written: the original's lineage is whole.
    load("fork-original", 2).commit()
    # A checkpoint moved elsewhere takes the state over where it was left ...
    assert load("fork-moved", 3).commit() == 4
    # ... and the old location, still running, is then the copy.
    stale = load("fork-original", 3)
    with pytest.raises(Exception, match="by the query with state checkpoint .*fork-moved"):
        stale.commit()
    stale.abort()
    # A head written before the location was recorded (format byte, version, id) names none,
    # so any location's commit takes it over.
    codec = getattr(jvm.jvm.io.quorumstore.spark.state.__getattr__("Codec$"), "MODULE$")
    old_head = codec.decodeHead(bytes([1, 7, 2]) + b"id")
    assert (old_head.version(), old_head.uid(), old_head.checkpoint()) == (7, "id", "")
    # Format v2 names each version by its checkpoint id, so a copy forks cleanly.
    fork = load("fork-copy", 1, ids[1], sql_confs=v2)
    fork.put(jvm.row("a", 1), jvm.row(10), "default")
    fork.commit()
    fork_id = fork.getStateStoreCheckpointInfo().stateStoreCkptId().get()
    forked = jvm.store(jvm.provider(PROVIDER_CLASS, "fork-copy", spec, sql_confs=v2), 2, fork_id)
    assert jvm.rows(forked.iterator("default")) == [(("a", 1), (10,))]
    forked.abort()


def test_maintenance_snapshots_and_drops_old_versions(jvm: Jvm) -> None:
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    confs = {
        "sql_confs": {"spark.sql.streaming.minBatchesToRetain": "2"},
        "quorum_confs": {"spark.quorumstore.stateStore.snapshotInterval": "2"},
    }
    provider = jvm.provider(PROVIDER_CLASS, "retention", spec, **confs)
    for version in range(8):
        store = jvm.store(provider, version)
        store.put(jvm.row("k", version), jvm.row(version), "default")
        store.commit()
        if version + 1 in (4, 8):
            provider.doMaintenance()  # snapshot at 4, then at 8 with cleanup up to 4

    fresh = jvm.store(jvm.provider(PROVIDER_CLASS, "retention", spec, **confs), 5)
    assert [k[1] for k, _ in jvm.rows(fresh.iterator("default"))] == [0, 1, 2, 3, 4]
    fresh.abort()
    with pytest.raises(Exception, match="cannot be rebuilt"):
        jvm.store(jvm.provider(PROVIDER_CLASS, "retention", spec, **confs), 3)


def _changes(jvm: Jvm, reader: object) -> list[tuple]:
    out = []
    while reader.hasNext():
        change = reader.next()
        value = change._3()
        out.append(
            (
                change._1().toString(),
                (change._2().getUTF8String(0).toString(), change._2().getInt(1)),
                None if value is None else value.getInt(0),
                change._4(),
            )
        )
    return out


def test_change_feed_of_versions_like_rocksdb(jvm: Jvm) -> None:
    """The puts and deletes of each version, with its batch id, as RocksDB's changelog
    reader gives them; deltas of many small chunks are read across several requests."""

    def scenario(cls: str, name: str) -> object:
        spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
        confs = {
            "sql_confs": {
                "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"
            },
            "quorum_confs": {
                "spark.quorumstore.stateStore.chunkBytes": "64",
                "spark.quorumstore.stateStore.maxWriteBytes": "200",
            },
        }
        provider = jvm.provider(cls, name, spec, **confs)
        for version in range(4):
            store = jvm.store(provider, version)
            for n in range(version, version + 40):
                store.put(jvm.row("k", n), jvm.row(n * 10 + version), "default")
            if version == 2:
                store.remove(jvm.row("k", 0), "default")
            store.commit()
        fresh = jvm.provider(cls, name, spec, **confs)
        # Within a version RocksDB gives the changes in the order they were made, quorumstore
        # in key order (the delta it stored).
        return (
            sorted(
                _changes(jvm, fresh.getStateStoreChangeDataReader(2, 4, jvm.none, jvm.none)),
                key=lambda c: (c[3], c[1]),
            ),
            sorted(
                _changes(jvm, fresh.getStateStoreChangeDataReader(1, 1, jvm.none, jvm.none)),
                key=lambda c: (c[3], c[1]),
            ),
        )

    results = _each_provider(jvm, "change-feed", scenario)
    assert results["quorumstore"] == results["rocksdb"]
    later, first = results["quorumstore"]
    assert len(first) == 40 and {c[3] for c in first} == {0}
    assert ("delete_record", ("k", 0), None, 2) in later
    assert [c[3] for c in later] == [1] * 40 + [2] * 41 + [3] * 40


def commit_six_versions(jvm: Jvm, provider: object, removed: int, snapshot_at: int = 0) -> None:
    """Versions 1-6: each puts ("k", n) for its n in 0-5, version 4 also removes
    ("k", `removed`); maintenance runs once version `snapshot_at` is committed (if any)."""
    for version in range(6):
        store = jvm.store(provider, version)
        store.put(jvm.row("k", version), jvm.row(version), "default")
        if version == 3:
            store.remove(jvm.row("k", removed), "default")
        store.commit()
        if version + 1 == snapshot_at:
            provider.doMaintenance()


def test_state_replayed_from_a_chosen_snapshot(jvm: Jvm) -> None:
    """snapshotStartBatchId's call: a version rebuilt from the snapshot named and the deltas
    after it; a version without a snapshot is refused, naming it."""
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    confs = {"quorum_confs": {"spark.quorumstore.stateStore.snapshotInterval": "2"}}
    provider = jvm.provider(PROVIDER_CLASS, "replay", spec, **confs)
    commit_six_versions(jvm, provider, removed=0, snapshot_at=2)  # the only snapshot
    fresh = jvm.provider(PROVIDER_CLASS, "replay", spec, **confs)
    store = fresh.replayReadStateFromSnapshot(2, 5, jvm.none, jvm.none)
    assert [k[1] for k, _ in jvm.rows(store.iterator("default"))] == [1, 2, 3, 4]
    store.abort()
    with pytest.raises(Exception, match="no snapshot of version 3"):
        fresh.replayReadStateFromSnapshot(3, 5, jvm.none, jvm.none)


def test_a_load_reads_its_chunks_a_few_at_a_time(jvm: Jvm) -> None:
    """Chunks above the load's read size: every chunk of every delta is its own read."""
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    confs = {
        "quorum_confs": {
            "spark.quorumstore.stateStore.chunkBytes": str(5 << 20),
            "spark.quorumstore.stateStore.maxWriteBytes": str(12 << 20),
        }
    }
    provider = jvm.provider(PROVIDER_CLASS, "paged-load", spec, **confs)
    commit_six_versions(jvm, provider, removed=1)
    fresh = jvm.store(jvm.provider(PROVIDER_CLASS, "paged-load", spec, **confs), 6)
    assert [k[1] for k, _ in jvm.rows(fresh.iterator("default"))] == [0, 2, 3, 4, 5]
    assert fresh.metrics().numKeys() == 5
    fresh.abort()


def test_commits_and_snapshots_stream_in_many_small_chunks(jvm: Jvm) -> None:
    """64-byte chunks, 200 bytes per request: a commit and a snapshot span many requests."""
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    confs = {
        "sql_confs": {"spark.sql.streaming.minBatchesToRetain": "1"},
        "quorum_confs": {
            "spark.quorumstore.stateStore.chunkBytes": "64",
            "spark.quorumstore.stateStore.maxWriteBytes": "200",
            "spark.quorumstore.stateStore.snapshotInterval": "1",
        },
    }
    provider = jvm.provider(PROVIDER_CLASS, "small-chunks", spec, **confs)
    store = jvm.store(provider, 0)
    for n in range(50):
        store.put(jvm.row("k", n), jvm.row(n), "default")
    store.commit()
    provider.doMaintenance()  # snapshot of version 1
    store = jvm.store(provider, 1)
    for n in range(0, 50, 2):
        store.remove(jvm.row("k", n), "default")
    store.commit()
    provider.doMaintenance()  # snapshot of version 2; the deltas below it are dropped
    fresh = jvm.store(jvm.provider(PROVIDER_CLASS, "small-chunks", spec, **confs), 2)
    assert [k[1] for k, _ in jvm.rows(fresh.iterator("default"))] == list(range(1, 50, 2))
    custom = jvm.jvm.scala.jdk.javaapi.CollectionConverters.asJava(fresh.metrics().customMetrics())
    assert {m.name(): v for m, v in custom.items()}["quorumstoreStoreLoads"] == 1
    fresh.abort()


def test_state_chunks_are_stored_compressed_and_load_back(jvm: Jvm, cluster: LocalCluster) -> None:
    """A commit's data chunks reach quorumstore zstd-compressed (format byte 2), several
    times smaller than the rows they hold; a provider on a fresh executor loads them back."""
    from quorumstore import Client

    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    provider = jvm.provider(PROVIDER_CLASS, "compressed", spec)
    store = jvm.store(provider, 0)
    for n in range(5000):
        store.put(jvm.row(f"key-{n:09d}", n), jvm.row(n % 7), "default")
    store.commit()
    custom = jvm.jvm.scala.jdk.javaapi.CollectionConverters.asJava(store.metrics().customMetrics())
    row_bytes = {m.name(): v for m, v in custom.items()}["quorumstoreCommitBytes"]
    pk = provider.partitionKey()
    with Client(",".join(cluster.nodes)) as client:
        chunks = [
            r.value
            for r in client.range_scan(
                f"{pk}/delta/{1:020d}//", f"{pk}/delta/{2:020d}//", partition_key=pk
            )
            if not r.key.endswith("/000000")  # the header
        ]
    assert chunks and all(c is not None and c[0] == 2 for c in chunks), [c[:1] for c in chunks]
    stored = sum(len(c) for c in chunks if c is not None)
    assert stored * 4 < row_bytes, f"{stored} bytes stored for {row_bytes} bytes of rows"
    fresh = jvm.store(jvm.provider(PROVIDER_CLASS, "compressed", spec), 1)
    assert fresh.metrics().numKeys() == 5000
    assert fresh.get(jvm.row("key-000004321", 4321), "default").getInt(0) == 4321 % 7
    fresh.abort()


def test_unreachable_cluster_fails_with_a_clear_error(jvm: Jvm) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    confs = {"spark.quorumstore.address": dead, "spark.quorumstore.timeoutMs": "1500"}
    provider = jvm.provider(PROVIDER_CLASS, "unreachable", spec, quorum_confs=confs)
    started = time.monotonic()
    with pytest.raises(
        Exception, match=f"quorumstore cluster at {dead}.*spark.quorumstore.address"
    ):
        jvm.store(provider, 0)
    assert time.monotonic() - started < 15


@pytest.mark.parametrize(
    ("confs", "message"),
    [
        ({"spark.quorumstore.address": ","}, "address must name at least one host:port, got ','"),
        ({"spark.quorumstore.address": "127.0.0.1:"}, "address must be host:port"),
        ({"spark.quorumstore.address": "127.0.0.1:99999"}, "address must be host:port"),
        ({"spark.quorumstore.address": "http://127.0.0.1:6648"}, "address must be host:port"),
        (
            {"spark.quorumstore.timeoutMs": str(2**63 - 1)},
            "timeoutMs must be at most 31536000000 (a year)",  # it overflowed to 1 ms
        ),
        (
            {"spark.quorumstore.stateStore.snapshotInterval": "3000000000"},
            "snapshotInterval must be at most 2147483647",  # it wrapped around
        ),
        (
            {"spark.quorumstore.namespace": "nope", "spark.quorumstore.timeoutMs": "30000"},
            "spark.quorumstore.namespace: the quorumstore cluster at",  # not 30 s of retries
        ),
    ],
)
def test_bad_settings_fail_at_once_naming_them(
    jvm: Jvm, confs: dict[str, str], message: str
) -> None:
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    started = time.monotonic()
    with pytest.raises(Exception, match=re.escape(message)):
        jvm.store(jvm.provider(PROVIDER_CLASS, "bad-settings", spec, quorum_confs=confs), 0)
    assert time.monotonic() - started < 10


def _files_open_under(jvm: Jvm, directory: Path) -> int:
    """How many files under `directory` this JVM holds open (unlinked ones too)."""
    pid = jvm.jvm.java.lang.ProcessHandle.current().pid()
    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            held += os.readlink(fd).startswith(f"{directory}/")
        except OSError:  # closed meanwhile
            continue
    return held


def test_a_replaced_local_copy_frees_its_file_when_its_last_store_ends(
    jvm: Jvm, tmp_path: Path
) -> None:
    """A load that rebuilds the local copy (here: an older version) leaves the copy it
    replaces to the stores still reading it, and closes its file when the last one ends:
    the file is unlinked, so only closing it gives its disk space back."""
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    writer = jvm.provider(PROVIDER_CLASS, "replaced", spec)
    for version in range(3):
        store = jvm.store(writer, version)
        for n in range(300):
            store.put(jvm.row("k", n), jvm.row(version), "default")
        store.commit()

    local = tmp_path / "local"
    confs = {"spark.quorumstore.stateStore.localDir": str(local)}
    provider = jvm.provider(PROVIDER_CLASS, "replaced", spec, quorum_confs=confs)
    newest = provider.getReadStore(3, jvm.none)  # loaded in bulk: packed into a file
    assert _files_open_under(jvm, local) == 1
    older = jvm.store(provider, 1)  # not on the lineage below the local copy: rebuilt
    assert _files_open_under(jvm, local) == 2
    assert {v for _, (v,) in jvm.rows(newest.iterator("default"))} == {2}  # still readable
    newest.abort()
    assert _files_open_under(jvm, local) == 1
    assert {v for _, (v,) in jvm.rows(older.iterator("default"))} == {0}
    older.abort()
    assert _files_open_under(jvm, local) == 1  # the local copy's
    provider.close()
    assert _files_open_under(jvm, local) == 0


def test_local_copy_is_unlinked_in_the_local_dir_and_a_bad_dir_is_named(
    jvm: Jvm, tmp_path: Path
) -> None:
    """A provider loading in bulk packs the state into a file under `localDir`, unlinked."""
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    store = jvm.store(jvm.provider(PROVIDER_CLASS, "local-dir", spec), 0)
    for n in range(100):
        store.put(jvm.row("k", n), jvm.row(n), "default")
    store.commit()

    local = tmp_path / "local"
    confs = {"spark.quorumstore.stateStore.localDir": str(local)}
    fresh = jvm.store(jvm.provider(PROVIDER_CLASS, "local-dir", spec, quorum_confs=confs), 1)
    assert len(jvm.rows(fresh.iterator("default"))) == 100
    custom = jvm.jvm.scala.jdk.javaapi.CollectionConverters.asJava(fresh.metrics().customMetrics())
    disk_bytes = {metric.name(): value for metric, value in custom.items()}
    fresh.abort()
    assert disk_bytes["quorumstoreLocalDiskBytes"] > 100 * 8
    assert local.is_dir() and list(local.iterdir()) == []

    # Unset, it is the first of Spark's local directories (no SPARK_LOCAL_DIRS etc. here).
    assert not {"SPARK_EXECUTOR_DIRS", "SPARK_LOCAL_DIRS", "CONTAINER_ID"} & set(os.environ)
    spark_conf = jvm.spark._jsc.sc().conf()  # the SparkConf SparkEnv holds
    changed = {
        "spark.local.dir": f"{tmp_path / 'first'},{tmp_path / 'second'}",
        "spark.quorumstore.stateStore.localDir": None,  # the session sets it
    }
    saved = {key: spark_conf.getOption(key) for key in changed}

    def apply(values: dict[str, str | None]) -> None:
        for key, value in values.items():
            if value is None:
                spark_conf.remove(key)
            else:
                spark_conf.set(key, value)

    apply(changed)
    try:
        conf_from = getattr(jvm.jvm.io.quorumstore.spark.state.QuorumConf, "from")
        default = conf_from(None).localDir()
    finally:
        apply({key: value.get() if value.isDefined() else None for key, value in saved.items()})
    assert default.getPath() == str(tmp_path / "first")

    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    confs = {"spark.quorumstore.stateStore.localDir": str(not_a_dir)}
    # Refused when the provider starts, not at the first load in bulk (maybe hours later).
    with pytest.raises(
        Exception, match=re.escape(str(not_a_dir)) + ".*spark.quorumstore.stateStore.localDir"
    ):
        jvm.provider(PROVIDER_CLASS, "local-dir-fresh", spec, quorum_confs=confs)


def test_misspelled_settings_are_warned_about_from_the_list_python_uses(jvm: Jvm) -> None:
    conf = jvm.jvm.io.quorumstore.spark.state.QuorumConf
    known = jvm.jvm.scala.jdk.javaapi.CollectionConverters.asJava(conf.knownKeys())
    assert set(known) == KNOWN_KEYS  # the jar carries Python's conf_keys.txt
    warning = conf.unknownKeyWarning("spark.quorumstore.Address")
    assert warning.get() == (
        "unknown setting spark.quorumstore.Address (ignored); "
        "did you mean spark.quorumstore.address?"
    )
    assert "docs/state-store.md" in conf.unknownKeyWarning("spark.quorumstore.zzz").get()
    assert conf.unknownKeyWarning("spark.quorumstore.address").isEmpty()
    assert conf.unknownKeyWarning("spark.sql.shuffle.partitions").isEmpty()
    # A provider with a misspelled setting starts, warns and uses the default.
    spec = jvm.state.NoPrefixKeyStateEncoderSpec(jvm.schema("k string, n int"))
    confs = {"spark.quorumstore.stateStore.prefx": "elsewhere"}
    store = jvm.store(jvm.provider(PROVIDER_CLASS, "misspelled", spec, quorum_confs=confs), 0)
    store.put(jvm.row("k", 1), jvm.row(1), "default")
    store.commit()
    fresh = jvm.store(jvm.provider(PROVIDER_CLASS, "misspelled", spec), 1)
    assert len(jvm.rows(fresh.iterator("default"))) == 1
    fresh.abort()


# ------------------------------------------------------- operators: RocksDB vs quorumstore


BASE_TIME = 1_700_000_000


def _event(k: str, v: int, second: int) -> dict:
    return {
        "k": k,
        "v": v,
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(BASE_TIME + second)),
    }


def _write_batches(directory: Path, batches: list[list[dict]], first_index: int = 0) -> None:
    """One JSON file per batch, with increasing modification times (the file source's order)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(batches, start=first_index):
        path = directory / f"part-{i:04d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (BASE_TIME + i, BASE_TIME + i))


def _as_text(value: object) -> object:
    if hasattr(value, "asDict"):
        return tuple(_as_text(v) for v in value)
    return str(value)


class Run:
    """One streaming query over file inputs, its micro-batch outputs collected in order."""

    def __init__(
        self, spark: SparkSession, root: Path, provider: str, confs: dict[str, str] | None = None
    ):
        self.spark = spark
        self.root = root
        self.provider = provider
        self.confs = confs or {}
        self.outputs: list[tuple[int, list]] = []
        self.progress: list[dict] = []

    def source(self, name: str, batches: list[list[dict]] | None = None) -> DataFrame:
        directory = self.root / "in" / name
        if batches is not None:
            _write_batches(directory, batches)
        return (
            self.spark.readStream.schema("k string, v long, ts timestamp")
            .option("maxFilesPerTrigger", 1)
            .json(str(directory))
        )

    def run(
        self, result: DataFrame, mode: str, on_batch: Callable[[int], None] | None = None
    ) -> Run:
        self.spark.conf.set(PROVIDER_CONF, self.provider)
        for key, value in self.confs.items():
            self.spark.conf.set(key, value)

        def sink(batch: DataFrame, batch_id: int) -> None:
            if on_batch is not None:
                on_batch(batch_id)
            self.outputs.append((batch_id, sorted(_as_text(r) for r in batch.collect())))

        query = (
            result.writeStream.outputMode(mode)
            .foreachBatch(sink)
            .option("checkpointLocation", str(self.root / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(QUERY_TIMEOUT_S), (
                f"query did not finish in {QUERY_TIMEOUT_S} s"
            )
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            self.progress.extend(query.recentProgress)
        finally:
            query.stop()
            for key in self.confs:
                self.spark.conf.unset(key)
        return self


def _compare(
    spark: SparkSession,
    tmp_path: Path,
    build: Callable[[Run], DataFrame],
    mode: str,
    confs: dict[str, str] | None = None,
) -> dict[str, Run]:
    runs = {}
    for short, cls in PROVIDERS.items():
        run = Run(spark, tmp_path / short, cls, confs)
        runs[short] = run.run(build(run), mode)
    ours, theirs = runs["quorumstore"].outputs, runs["rocksdb"].outputs
    assert ours == theirs
    assert any(rows for _, rows in theirs), "the query produced no output at all"
    return runs


def _keys_batches(
    batches: int = 3, per_batch: int = 30, keys: int = 7, step_s: int = 4
) -> list[list[dict]]:
    """Events of `keys` keys, event time advancing `step_s` per batch, some late events."""
    out = []
    for b in range(batches):
        rows = [_event(f"k{(b * 3 + i) % keys}", i, b * step_s + i % 5) for i in range(per_batch)]
        rows.append(_event("late", 1, max(0, b * step_s - 25)))
        out.append(rows)
    return out


def test_streaming_aggregation_update_mode(spark: SparkSession, tmp_path: Path) -> None:
    def build(run: Run) -> DataFrame:
        events = run.source("events", _keys_batches())
        return (
            events.withWatermark("ts", "5 seconds")
            .groupBy(F.window("ts", "5 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        )

    runs = _compare(spark, tmp_path, build, "update")
    metrics = runs["quorumstore"].progress[-1]["stateOperators"][0]["customMetrics"]
    assert {
        "quorumstoreCommitLatencyMs",
        "quorumstoreCommitKeys",
        "quorumstoreCommitBytes",
        "quorumstoreLoadTimeMs",
        "quorumstoreLocalDiskBytes",
    } <= set(metrics)


def test_streaming_aggregation_complete_mode(spark: SparkSession, tmp_path: Path) -> None:
    def build(run: Run) -> DataFrame:
        return (
            run.source("events", _keys_batches())
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.max("v"))
        )

    _compare(spark, tmp_path, build, "complete")


def test_streaming_aggregation_with_checkpoint_format_v2(
    spark: SparkSession, tmp_path: Path
) -> None:
    def build(run: Run) -> DataFrame:
        return run.source("events", _keys_batches()).groupBy("k").agg(F.sum("v").alias("total"))

    confs = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}
    _compare(spark, tmp_path, build, "update", confs)


def test_session_windows(spark: SparkSession, tmp_path: Path) -> None:
    def build(run: Run) -> DataFrame:
        events = run.source("events", _keys_batches(batches=4, step_s=7))
        return (
            events.withWatermark("ts", "3 seconds")
            .groupBy(F.session_window("ts", "4 seconds"), "k")
            .agg(F.count("*").alias("n"))
        )

    _compare(spark, tmp_path, build, "append")


def test_drop_duplicates_with_watermark(spark: SparkSession, tmp_path: Path) -> None:
    def build(run: Run) -> DataFrame:
        events = run.source("events", _keys_batches())
        return events.withWatermark("ts", "5 seconds").dropDuplicates(["k", "ts"])

    _compare(spark, tmp_path, build, "append")


def test_drop_duplicates_within_watermark(spark: SparkSession, tmp_path: Path) -> None:
    def build(run: Run) -> DataFrame:
        events = run.source("events", _keys_batches())
        return events.withWatermark("ts", "5 seconds").dropDuplicatesWithinWatermark(["k"])

    _compare(spark, tmp_path, build, "append")


def test_stream_stream_join(spark: SparkSession, tmp_path: Path) -> None:
    def build(run: Run) -> DataFrame:
        left = run.source("left", _keys_batches(keys=5)).withWatermark("ts", "5 seconds")
        right = run.source("right", _keys_batches(keys=6, per_batch=12)).withWatermark(
            "ts", "5 seconds"
        )
        return (
            left.alias("l")
            .join(
                right.alias("r"),
                F.expr(
                    "l.k = r.k AND r.ts BETWEEN l.ts - INTERVAL 2 SECONDS"
                    " AND l.ts + INTERVAL 2 SECONDS"
                ),
                "leftOuter",
            )
            .select("l.k", "l.v", "l.ts", "r.v", "r.ts")
        )

    _compare(spark, tmp_path, build, "append")


def test_apply_in_pandas_with_state(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql.streaming.state import GroupState

    def count_per_key(
        key: tuple, frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        (seen,) = state.get if state.exists else (0,)
        for frame in frames:
            seen += len(frame)
        state.update((seen,))
        yield pd.DataFrame({"k": [key[0]], "seen": [seen]})

    def build(run: Run) -> DataFrame:
        return (
            run.source("events", _keys_batches())
            .groupBy("k")
            .applyInPandasWithState(
                count_per_key, "k string, seen long", "seen long", "update", "NoTimeout"
            )
        )

    _compare(spark, tmp_path, build, "update")


def test_sparks_state_data_source_reads_state_and_changes_like_rocksdb(
    spark: SparkSession, tmp_path: Path
) -> None:
    """`spark.read.format("statestore")` over each provider's checkpoint: every partition's
    state at the last and at an earlier batch, and the change feed (puts, and the deletes of
    windows the watermark evicted), row for row as with RocksDB."""

    def build(run: Run) -> DataFrame:
        return (
            run.source("events", _keys_batches(batches=4))
            .withWatermark("ts", "5 seconds")
            .groupBy(F.window("ts", "5 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        )

    runs = _compare(spark, tmp_path, build, "update")

    def read(run: Run, **options: object) -> list:
        reader = spark.read.format("statestore")
        for key, value in options.items():
            reader = reader.option(key, str(value))
        return [_as_text(r) for r in reader.load(str(run.root / "checkpoint")).collect()]

    def net(changes: list) -> list:
        """The last change of each key in each batch and partition. RocksDB's changelog
        lists every put and delete in the order made (an evicted window updated in the same
        batch shows twice); quorumstore stores, and gives, each batch's net change."""
        last = {(c[0], c[-1], c[2]): c for c in changes}
        return sorted(last.values())

    views = {
        short: (
            sorted(read(run)),
            sorted(read(run, batchId=1)),
            net(read(run, readChangeFeed="true", changeStartBatchId=0)),
        )
        for short, run in runs.items()
    }
    assert views["quorumstore"] == views["rocksdb"]
    state, _, changes = views["quorumstore"]
    assert {row[-1] for row in state} == {"0", "1"}, "both partitions' state"
    assert {row[1] for row in changes} == {"update", "delete"}


def test_restart_from_checkpoint_continues(spark: SparkSession, tmp_path: Path) -> None:
    """A query stopped and started again (new run, providers load from quorumstore)."""
    batches = _keys_batches(batches=4)

    def build(run: Run) -> DataFrame:
        return (
            run.source("events")
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        )

    outputs = {}
    for short, cls in PROVIDERS.items():
        run = Run(spark, tmp_path / short, cls)
        _write_batches(run.root / "in" / "events", batches[:2])
        run.run(build(run), "update")
        _write_batches(run.root / "in" / "events", batches[2:], first_index=2)
        restarted = Run(spark, run.root, cls)
        restarted.run(build(restarted), "update")
        outputs[short] = run.outputs + restarted.outputs
        if short == "quorumstore":
            metrics = restarted.progress[0]["stateOperators"][0]["customMetrics"]
            loads = metrics["quorumstoreStoreLoads"]
            assert loads >= 1, "the restarted run should have loaded its state from quorumstore"
            # The load packed the state into files under the session's localDir, unlinked.
            assert metrics["quorumstoreLocalDiskBytes"] > 0
    assert [b for b, _ in outputs["quorumstore"]] == list(range(4))
    assert outputs["quorumstore"] == outputs["rocksdb"]


def test_a_copy_of_a_running_querys_checkpoint_fails_instead_of_sharing_its_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Format v1: a copied checkpoint has the original's query id, so the same state."""
    batches = _keys_batches(batches=4)

    def build(run: Run) -> DataFrame:
        return run.source("events").groupBy("k").agg(F.sum("v").alias("total"))

    original = Run(spark, tmp_path / "original", PROVIDER_CLASS)
    _write_batches(original.root / "in" / "events", batches[:2])
    original.run(build(original), "update")
    copy = Run(spark, tmp_path / "copy", PROVIDER_CLASS)
    shutil.copytree(original.root / "checkpoint", copy.root / "checkpoint")
    _write_batches(original.root / "in" / "events", batches[2:3], first_index=2)
    original.run(build(original), "update")
    # The copy reads the same input: its next batch is the original's batch 2 as well.
    with pytest.raises(StreamingQueryException, match="two checkpoints with the same query id"):
        copy.run(build(original), "update")
    assert copy.outputs == []

    # The original was not disturbed: it goes on as RocksDB's run of all four batches does.
    _write_batches(original.root / "in" / "events", batches[3:], first_index=3)
    original.run(build(original), "update")
    reference = Run(spark, tmp_path / "rocksdb", ROCKSDB_PROVIDER_CLASS)
    _write_batches(reference.root / "in" / "events", batches)
    reference.run(build(reference), "update")
    assert original.outputs == reference.outputs


def test_leader_kill_during_query_keeps_results(
    spark: SparkSession, tmp_path: Path, cluster: LocalCluster
) -> None:
    """kill -9 of the leader holding the query's state, between two micro-batches' commits."""
    batches = _keys_batches(batches=4)

    def build(run: Run) -> DataFrame:
        return (
            run.source("events", batches)
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        )

    reference = Run(spark, tmp_path / "rocksdb", ROCKSDB_PROVIDER_CLASS)
    reference.run(build(reference), "update")

    run = Run(spark, tmp_path / "quorumstore", PROVIDER_CLASS)
    killed: list[str] = []

    def kill_leader(batch_id: int) -> None:
        if batch_id != 2:
            return
        query_id = spark.streams.active[0].id
        partition_key = f"statestore/{query_id}/0/0/default"
        shard = _shard_of(cluster, partition_key)
        leader = cluster.leader_of(shard)
        assert leader is not None
        cluster.kill9(leader)
        killed.append(leader)

    try:
        run.run(build(run), "update", on_batch=kill_leader)
    finally:
        for node in killed:
            cluster.restart(node)
    assert killed, "no leader was killed"
    assert run.outputs == reference.outputs


def test_sparks_maintenance_thread_snapshots_and_drops_old_versions(
    spark: SparkSession, tmp_path: Path, cluster: LocalCluster
) -> None:
    """In a running query, Spark's own maintenance (not a direct call) writes snapshots and
    deletes the versions below minBatchesToRetain; results stay those of RocksDB."""
    from quorumstore import Client

    batches = _keys_batches(batches=8)
    confs = {
        "spark.sql.streaming.minBatchesToRetain": "2",
        "spark.quorumstore.stateStore.snapshotInterval": "2",
    }

    def build(run: Run) -> DataFrame:
        return run.source("events", batches).groupBy("k").agg(F.count("*").alias("n"))

    reference = Run(spark, tmp_path / "rocksdb", ROCKSDB_PROVIDER_CLASS, confs)
    reference.run(build(reference), "update")

    run = Run(spark, tmp_path / "quorumstore", PROVIDER_CLASS, confs)
    seen: dict[str, list[int]] = {}

    def versions(client: Client, pk: str, kind: str) -> list[int]:
        keys = client.list(f"{pk}/{kind}/{0:020d}//", f"{pk}/{kind}/~//", partition_key=pk)
        return sorted({int(k.split("/")[-3]) for k in keys})

    def await_maintenance(batch_id: int) -> None:
        # Before batch b runs, versions 1..b are committed. Batches come faster than the
        # 1 s maintenance interval, so the first snapshot is awaited at batch 3 (it then
        # lands at version 3 at most): one first taken at version 6 would leave nothing
        # below 6 - minBatchesToRetain that cleanup could keep as the new base.
        # At batch 6, versions 5 and 6 must stay loadable and the rest may go.
        if batch_id not in (3, 6):
            return
        pk = f"statestore/{spark.streams.active[0].id}/0/0/default"
        with Client(",".join(cluster.nodes)) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                seen["snapshot"] = versions(client, pk, "snapshot")
                seen["delta"] = versions(client, pk, "delta")
                if seen["snapshot"] and (batch_id == 3 or 1 not in seen["delta"]):
                    return
                time.sleep(0.2)

    run.run(build(run), "update", on_batch=await_maintenance)
    assert seen["snapshot"], f"no snapshot was written by Spark's maintenance: {seen}"
    assert 1 not in seen["delta"], f"old deltas were not dropped: {seen}"
    assert {5, 6} <= set(seen["delta"]) | set(seen["snapshot"]), seen
    assert run.outputs == reference.outputs


def _shard_of(cluster: LocalCluster, partition_key: str) -> int:
    """The shard quorumstore's provider routes a partition key to (low 32 bits of XXH3-64)."""
    h = xxhash.xxh3_64_intdigest(partition_key.encode()) & 0xFFFFFFFF
    for m in cluster.status().metadata.shards:
        if m.hash_range.min_hash_inclusive <= h <= m.hash_range.max_hash_inclusive:
            return m.shard
    raise AssertionError(f"no shard covers {partition_key!r}")
