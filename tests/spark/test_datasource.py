"""The `quorumstore` Spark data source against real servers: batch read/write, change feed, sink.

One Spark session (`local[2,3]`: two task slots, a failed task is tried up to 3 times)
and one `quorumstore standalone` server (4 shards) serve the module; the failover test
starts its own 3-node cluster of OS processes (tests/cluster_harness.py's LocalCluster)
and kills a shard leader with SIGKILL while a stream reads the change feed.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cluster_harness import LocalCluster
from quorumstore import Client
from quorumstore.client.data_service import DataClient
from quorumstore.spark.datasource import register
from quorumstore.spark.datasource_values import parse_schema
from quorumstore.testing import standalone_server
from quorumstore.wire.metadata import ClientSerial

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SHARDS = 4
ROUND_TRIP_ROWS = 100_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(address, data dir) of a standalone server with 4 shards."""
    data = tmp_path_factory.mktemp("standalone")
    with standalone_server(data, SHARDS, fsync=False) as address:
        yield address, data


@pytest.fixture(scope="module")
def spark(server: tuple[str, Path]) -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("quorumstore-datasource-test")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def address(server: tuple[str, Path]) -> str:
    return server[0]


def read(spark: SparkSession, address: str, **options: str) -> DataFrame:
    return spark.read.format("quorumstore").option("address", address).options(**options).load()


def kv_frame(spark: SparkSession, prefix: str, n: int, partitions: int = 4) -> DataFrame:
    return spark.range(0, n, numPartitions=partitions).select(
        F.format_string(f"{prefix}%07d", "id").alias("key"),
        F.sha2(F.col("id").cast("string"), 256).cast("binary").alias("value"),
    )


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}/"


def staging_dirs(server: tuple[str, Path]) -> list[str]:
    root = server[1] / "node" / "data-staging"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


# ------------------------------------------------------------------ batch round trip


def test_round_trip_is_equal_row_for_row(
    spark: SparkSession, address: str, server: tuple[str, Path]
) -> None:
    prefix = unique("rt")
    source = kv_frame(spark, prefix, ROUND_TRIP_ROWS)
    source.write.format("quorumstore").option("address", address).mode("append").save()
    back = read(spark, address, keyPrefix=prefix)
    assert back.rdd.getNumPartitions() == SHARDS
    expected = source.toArrow().sort_by("key")
    got = back.select("key", "value", "modifications_count", "shard").toArrow().sort_by("key")
    assert got.num_rows == ROUND_TRIP_ROWS
    assert got.column("key").equals(expected.column("key"))  # row for row
    assert got.column("value").equals(expected.column("value"))
    assert pc.unique(got.column("modifications_count")).to_pylist() == [0]
    assert sorted(pc.unique(got.column("shard")).to_pylist()) == list(range(SHARDS))
    assert staging_dirs(server) == []


def test_values_as_json_decode_into_typed_columns(spark: SparkSession, address: str) -> None:
    prefix = unique("people")
    people = spark.createDataFrame(
        [(f"{prefix}ann", "Ann", 31, ["a", "b"]), (f"{prefix}bob", "Bob", None, [])],
        "key STRING, name STRING, age INT, tags ARRAY<STRING>",
    )
    people.write.format("quorumstore").option("address", address).option(
        "valueFormat", "json"
    ).mode("append").save()
    back = read(
        spark,
        address,
        keyPrefix=prefix,
        valueFormat="json",
        valueSchema="name STRING, age INT, tags ARRAY<STRING>",
    )
    assert back.columns[:4] == ["key", "name", "age", "tags"]
    assert sorted(map(tuple, back.select("key", "name", "age", "tags").collect())) == sorted(
        map(tuple, people.collect())
    )
    as_text = read(spark, address, keyPrefix=prefix, valueFormat="string")
    assert (
        as_text.where(F.col("key").endswith("ann")).first().value
        == '{"name":"Ann","age":31,"tags":["a","b"]}'
    )


TYPED_DDL = (
    "blob BINARY, at TIMESTAMP, day DATE, price DECIMAL(10,2), "
    "attrs MAP<STRING, BINARY>, parts ARRAY<STRUCT<name: STRING, data: BINARY>>, "
    "note STRING, score DOUBLE, ratio FLOAT, hits ARRAY<BIGINT>, ok BOOLEAN"
)


def typed_frame(spark: SparkSession, prefix: str) -> DataFrame:
    """Six rows of TYPED_DDL's columns: binary, maps, dates, timestamps, decimals, nested,
    and strings that need escaping in JSON, whole and tiny doubles, floats, booleans."""
    return spark.range(6).select(
        F.format_string(f"{prefix}%02d", "id").alias("key"),
        F.expr("substring(unhex(sha2(cast(id as string), 256)), 1, cast(id as int))").alias("blob"),
        F.expr("timestamp_millis(1700000000000 + id * 1001)").alias("at"),  # to_json writes ms
        F.expr("date_add(date'2024-02-28', cast(id as int))").alias("day"),
        F.expr("cast(id * 1.25 as decimal(10,2))").alias("price"),
        F.expr("map('k', unhex('00ff'), concat('k', id), cast(null as binary))").alias("attrs"),
        F.expr(
            "array(named_struct('name', 'p', 'data', unhex(repeat('ab', cast(id as int)))))"
        ).alias("parts"),
        F.expr("concat('q\"', id, '\\\\', char(10), char(1), 'é')").alias("note"),
        F.expr("if(id % 2 = 0, id * 50.0D, id * 1e-7D)").alias("score"),
        F.expr("cast(id / 3 as float)").alias("ratio"),
        F.expr("array(id, cast(null as bigint), 4611686018427387904L)").alias("hits"),
        F.expr("id % 2 = 0").alias("ok"),
    )


def test_json_values_of_every_type_match_sparks_own_json(spark: SparkSession, address: str) -> None:
    """What a json write stores reads back as it was, and Spark's from_json of the stored
    text agrees, as does our read of text Spark's to_json wrote."""
    prefix = unique("typed")
    ddl = TYPED_DDL
    source = typed_frame(spark, prefix)
    source.write.format("quorumstore").option("address", address).option(
        "valueFormat", "json"
    ).mode("append").save()
    columns = ["key", *parse_schema(ddl).names]
    back = read(spark, address, keyPrefix=prefix, valueFormat="json", valueSchema=ddl)
    expected = sorted(source.collect())
    assert sorted(back.select(*columns).collect()) == expected
    as_text = read(spark, address, keyPrefix=prefix, valueFormat="string")
    parsed = as_text.select("key", F.from_json("value", ddl).alias("v")).select("key", "v.*")
    assert sorted(parsed.collect()) == expected

    spark_prefix = unique("spark-json")
    source.select(
        F.regexp_replace("key", prefix, spark_prefix).alias("key"),
        F.to_json(F.struct(*columns[1:])).cast("binary").alias("value"),
    ).write.format("quorumstore").option("address", address).mode("append").save()
    from_spark = read(spark, address, keyPrefix=spark_prefix, valueFormat="json", valueSchema=ddl)
    renamed = from_spark.select(
        F.regexp_replace("key", spark_prefix, prefix).alias("key"), *columns[1:]
    )
    assert sorted(renamed.collect()) == expected


def test_arrow_values_of_every_type_round_trip(spark: SparkSession, address: str) -> None:
    prefix = unique("typed-arrow")
    source = typed_frame(spark, prefix)
    source.write.format("quorumstore").option("address", address).option(
        "valueFormat", "arrow"
    ).mode("append").save()
    back = read(spark, address, keyPrefix=prefix, valueFormat="arrow", valueSchema=TYPED_DDL)
    assert sorted(back.select(*source.columns).collect()) == sorted(source.collect())
    some = read(spark, address, keyPrefix=prefix, valueFormat="arrow", valueSchema="day DATE")
    assert sorted(some.select("key", "day").collect()) == sorted(
        source.select("key", "day").collect()
    )


# ------------------------------------------------------------------ pushdown


def test_key_filters_are_pushed_down_and_prune_shards_and_ranges(
    spark: SparkSession, address: str
) -> None:
    prefix = unique("push")
    kv_frame(spark, prefix, 2000).write.format("quorumstore").option("address", address).mode(
        "append"
    ).save()
    df = read(spark, address)
    one_key = df.where(F.col("key") == f"{prefix}0000042")
    plan = one_key._jdf.queryExecution().explainString(
        spark._jvm.org.apache.spark.sql.execution.ExplainMode.fromString("formatted")
    )
    assert f"PushedFilters: [IsNotNull(key), EqualTo(key,{prefix}0000042)]" in plan
    assert "Filter" not in plan.split("(2)")[0]  # nothing left for Spark to filter
    assert one_key.rdd.getNumPartitions() == 1  # the one shard the key hashes to
    assert [r.key for r in one_key.collect()] == [f"{prefix}0000042"]

    with DataClient(address) as client:
        keys = [f"{prefix}{i:07d}" for i in (1, 2, 3, 4, 5, 6, 7)]
        shards = {client.shard_of(k) for k in keys}
    some = df.where(F.col("key").isin(*keys))
    assert some.rdd.getNumPartitions() == len(shards)
    assert sorted(r.key for r in some.collect()) == keys

    ranged = df.where(
        (F.col("key") >= f"{prefix}0000100")
        & (F.col("key") < f"{prefix}0000200")
        & F.col("key").startswith(prefix)
    )
    assert "StringStartsWith(key," in ranged._jdf.queryExecution().explainString(
        spark._jvm.org.apache.spark.sql.execution.ExplainMode.fromString("formatted")
    )
    assert sorted(r.key for r in ranged.select("key").collect()) == [
        f"{prefix}{i:07d}" for i in range(100, 200)
    ]
    assert df.where("shard = 2").rdd.getNumPartitions() == 1
    # A negation (Spark pushes Not(EqualTo(key, ...))) is left for Spark to evaluate.
    others = df.where((F.col("key") != f"{prefix}0000042") & F.col("key").startswith(prefix))
    assert others.count() == 1999
    assert df.where(F.col("key").startswith("a") & F.col("key").startswith("b")).count() == 0
    split = read(spark, address, keyPrefix=prefix, maxRowsPerPartition="100")
    assert split.rdd.getNumPartitions() >= 2000 // 100
    assert split.count() == 2000


# ------------------------------------------------------------------ writes: retries, failures, overwrite


def _fail_first_attempt_after(rows: int):
    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        seen = 0
        for batch in batches:
            yield batch
            seen += batch.num_rows
            if context.attemptNumber() == 0 and context.partitionId() == 0 and seen >= rows:
                raise RuntimeError("injected failure of the first attempt, mid-write")

    return fn


def test_a_task_retried_mid_write_writes_nothing_twice(
    spark: SparkSession, address: str, server: tuple[str, Path]
) -> None:
    prefix = unique("retry")
    n = 20_000
    source = kv_frame(spark, prefix, n, partitions=2)
    failing = source.mapInArrow(_fail_first_attempt_after(7_000), source.schema)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        # Chunks of 200 rows: the failed attempt staged several before it died.
        failing.write.format("quorumstore").option("address", address).option(
            "chunkRows", "200"
        ).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    back = (
        read(spark, address, keyPrefix=prefix)
        .select("key", "value", "modifications_count")
        .collect()
    )
    assert len(back) == n
    assert sorted((r.key, r.value) for r in back) == sorted(map(tuple, source.collect()))
    assert {r.modifications_count for r in back} == {0}  # no key was put twice
    assert staging_dirs(server) == []


def _always_fail_partition_one():
    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        for batch in batches:
            yield batch
            if TaskContext.get().partitionId() == 1:
                raise RuntimeError("injected failure of every attempt")

    return fn


def test_a_failed_job_leaves_nothing_visible(
    spark: SparkSession, address: str, server: tuple[str, Path]
) -> None:
    prefix = unique("failed")
    source = kv_frame(spark, prefix, 4000, partitions=2)
    failing = source.mapInArrow(_always_fail_partition_one(), source.schema)
    with pytest.raises(Exception, match="injected failure of every attempt"):
        failing.write.format("quorumstore").option("address", address).option(
            "chunkRows", "100"
        ).mode("append").save()
    assert read(spark, address, keyPrefix=prefix).count() == 0
    assert staging_dirs(server) == []


@pytest.mark.parametrize(
    ("column", "condition"), [("key", "QUORUMSTORE_NULL_KEY"), ("value", "QUORUMSTORE_NULL_VALUE")]
)
def test_a_null_key_or_value_fails_the_job_naming_it_and_writes_nothing(
    spark: SparkSession, address: str, server: tuple[str, Path], column: str, condition: str
) -> None:
    """One null, in the last partition after other rows were staged: the job fails with
    the condition and what to do, and no row of it becomes visible."""
    prefix = unique(f"null-{column}")
    source = kv_frame(spark, prefix, 4000, partitions=2)
    last = F.col("key") == f"{prefix}{3999:07d}"
    nulled = source.withColumn(column, F.when(last, F.lit(None)).otherwise(F.col(column)))
    with pytest.raises(Exception, match=f"{condition}.*drop those rows") as failure:
        nulled.write.format("quorumstore").option("address", address).option(
            "chunkRows", "100"
        ).mode("append").save()
    assert "1 row(s) to write" in str(failure.value)
    assert read(spark, address, keyPrefix=prefix).count() == 0
    assert staging_dirs(server) == []


def test_overwrite_replaces_the_written_key_range_in_one_entry_per_shard(
    spark: SparkSession, address: str
) -> None:
    prefix = unique("ow")
    kv_frame(spark, prefix, 100).write.format("quorumstore").option("address", address).mode(
        "append"
    ).save()
    with DataClient(address) as client:
        before = {s.shard: client.offsets(s.shard).commit_offset for s in client.shards()}
    replacement = spark.createDataFrame(
        [(f"{prefix}{i:07d}", b"new") for i in range(20, 30, 2)], "key STRING, value BINARY"
    )
    replacement.write.format("quorumstore").option("address", address).mode("overwrite").save()
    # Taken before the read below, whose scans each commit a no-op entry first
    # (docs/protocol.md, Reads).
    with DataClient(address) as client:
        after = {s.shard: client.offsets(s.shard).commit_offset for s in client.shards()}
    rows = {r.key: r.value for r in read(spark, address, keyPrefix=prefix).collect()}
    # The written range is [20, 28]: 21, 23, 25 and 27 (inside it, not rewritten) are gone; 29 stays.
    expected_keys = {f"{prefix}{i:07d}" for i in [*range(20), *range(20, 30, 2), *range(29, 100)]}
    assert set(rows) == expected_keys
    assert {k for k, v in rows.items() if v == b"new"} == {
        f"{prefix}{i:07d}" for i in range(20, 30, 2)
    }
    with DataClient(address) as client:
        for s in client.shards():
            end = after[s.shard]
            assert end == before[s.shard] + 1  # every shard: one entry
            changes = pa.Table.from_batches(list(client.changes(s.shard, before[s.shard], end)))
            assert changes.column("operation").to_pylist()[0] == 2  # the range delete comes first
            assert changes.column("range_end").to_pylist()[0] == f"{prefix}0000028\x00"


# ------------------------------------------------------------------ bad options


def _fails_before_any_task(spark: SparkSession, action, condition: str, fragment: str) -> None:
    group = uuid.uuid4().hex
    spark.sparkContext.setJobGroup(group, "bad options")
    try:
        with pytest.raises(PySparkException) as caught:
            action()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    message = str(caught.value)
    assert condition in message and fragment.lower() in message.lower(), message
    assert list(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == []


def test_bad_options_fail_clearly_before_any_task_runs(spark: SparkSession, address: str) -> None:
    good = kv_frame(spark, unique("bad"), 10)
    _fails_before_any_task(
        spark,
        lambda: read(spark, address, keyPrefx="a").count(),
        "QUORUMSTORE_UNKNOWN_OPTION",
        "did you mean keyPrefix?",
    )
    _fails_before_any_task(
        spark,
        lambda: read(spark, "127.0.0.1:1", connectTimeout="1").count(),
        "QUORUMSTORE_UNREACHABLE",
        "127.0.0.1:1",
    )
    _fails_before_any_task(
        spark, lambda: read(spark, "no-port").count(), "QUORUMSTORE_INVALID_OPTION", "host:port"
    )
    _fails_before_any_task(
        spark,
        lambda: read(spark, address, valueFormat="json", valueSchema="name STRNG").count(),
        "QUORUMSTORE_INVALID_SCHEMA",
        "'STRNG'",
    )
    _fails_before_any_task(
        spark,
        lambda: (
            good.withColumnRenamed("key", "k")
            .write.format("quorumstore")
            .option("address", address)
            .mode("append")
            .save()
        ),
        "QUORUMSTORE_MISSING_COLUMN",
        "no column 'key'",
    )
    _fails_before_any_task(
        spark,
        lambda: (
            good.write.format("quorumstore")
            .option("address", address)
            .option("valueFormat", "string")
            .mode("append")
            .save()
        ),
        "QUORUMSTORE_INVALID_SCHEMA",
        "valueFormat 'string'",
    )


def test_a_stream_with_a_batch_read_option_fails_with_that_error_alone(
    spark: SparkSession, address: str
) -> None:
    """The option error of a change feed names the option as written and the use it
    belongs to, and comes alone: raised while PySpark creates the stream reader, it came
    chained to PySpark's own UnboundLocalError. No micro-batch runs."""
    query = (
        spark.readStream.format("quorumstore")
        .option("address", address)
        .option("readFrom", "leader")
        .load()
        .writeStream.format("noop")
        .start()
    )
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(120)
    message = str(caught.value)
    assert "QUORUMSTORE_UNKNOWN_OPTION" in message, message
    assert "option 'readFrom' applies to spark.read, not to spark.readStream" in message, message
    assert "UnboundLocalError" not in message, message
    assert query.recentProgress == []


# ------------------------------------------------------------------ change feed and sink


def _feed(spark: SparkSession, address: str, out: Path, checkpoint: Path, **options: str) -> None:
    query = (
        spark.readStream.format("quorumstore")
        .option("address", address)
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None


def test_a_stream_restarted_from_its_checkpoint_continues_where_it_stopped(
    spark: SparkSession, address: str, tmp_path: Path
) -> None:
    prefix = unique("feed")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    kv_frame(spark, prefix, 300).write.format("quorumstore").option("address", address).mode(
        "append"
    ).save()
    _feed(spark, address, out, checkpoint)
    first = spark.read.parquet(str(out)).where(F.col("key").startswith(prefix)).count()
    assert first == 300
    spark.createDataFrame(
        [(f"{prefix}{i:07d}", b"again") for i in range(5)], "key STRING, value BINARY"
    ).write.format("quorumstore").option("address", address).mode("append").save()
    _feed(spark, address, out, checkpoint)  # the same checkpoint: only what is new
    rows = spark.read.parquet(str(out)).where(F.col("key").startswith(prefix)).collect()
    assert len(rows) == 305
    again = sorted(r.key for r in rows if r.value == b"again")
    assert again == [f"{prefix}{i:07d}" for i in range(5)]
    assert {r.operation for r in rows} == {"put"}
    assert all(r.modifications_count == 1 for r in rows if r.value == b"again")


def test_a_change_feed_with_a_key_prefix_or_range_has_only_their_changes(
    spark: SparkSession, address: str, tmp_path: Path
) -> None:
    prefix = unique("feed-prefix")
    with Client(address) as client:
        for group in ("a", "b"):
            for i in range(20):
                client.put(f"{prefix}{group}/{i:02d}", f"{group}{i}")
        client.delete(f"{prefix}a/00")
        client.delete(f"{prefix}b/00")
        client.delete_range(f"{prefix}a/10", f"{prefix}a/15")
        client.delete_range(f"{prefix}b/10", f"{prefix}b/15")
    out = tmp_path / "out"
    _feed(spark, address, out, tmp_path / "checkpoint", keyPrefix=f"{prefix}a/")
    rows = spark.read.parquet(str(out)).collect()
    changes = sorted((r.operation, r.key, r.range_end or "") for r in rows)
    assert changes == sorted(
        [("put", f"{prefix}a/{i:02d}", "") for i in range(20)]
        + [("delete", f"{prefix}a/00", "")]
        # A range delete without a partition key goes to every shard, each with its change.
        + [("delete_range", f"{prefix}a/10", f"{prefix}a/15")] * SHARDS
    )
    ranged = tmp_path / "ranged"
    bounds = {"keyStart": f"{prefix}a/05", "keyEnd": f"{prefix}a/12"}
    _feed(spark, address, ranged, tmp_path / "ranged-checkpoint", **bounds)
    rows = spark.read.parquet(str(ranged)).collect()
    changes = sorted((r.operation, r.key, r.range_end or "") for r in rows)
    assert changes == sorted(
        [("put", f"{prefix}a/{i:02d}", "") for i in range(5, 12)]
        + [("delete_range", f"{prefix}a/10", f"{prefix}a/15")] * SHARDS
    )


def test_the_sink_writes_each_micro_batch_once_even_when_replayed(
    spark: SparkSession, address: str, tmp_path: Path
) -> None:
    prefix = unique("sink")
    source_dir, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    source_dir.mkdir()
    for i in range(3):
        spark.createDataFrame(
            [(f"{prefix}{i}-{j:04d}", f"v{j}".encode()) for j in range(200)],
            "key STRING, value BINARY",
        ).write.parquet(str(source_dir / f"part{i}"))

    def run() -> None:
        stream = (
            spark.readStream.schema("key STRING, value BINARY")
            .option("recursiveFileLookup", "true")
            .parquet(str(source_dir))
        )
        query = (
            stream.writeStream.format("quorumstore")
            .option("address", address)
            .option("chunkRows", "50")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None

    run()
    # Forget that the last micro-batch committed: the restarted query runs it again.
    commits = sorted(
        (checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1
    )
    last = commits[-1]
    assert last.name.isdigit()
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    run()
    assert (checkpoint / "commits" / last.name).exists()  # it was replayed
    back = read(spark, address, keyPrefix=prefix).select("key", "modifications_count").collect()
    assert len(back) == 600
    assert {r.modifications_count for r in back} == {0}


# ------------------------------------------------------------------ failover under the change feed


@pytest.mark.timeout(300)
def test_the_change_feed_delivers_every_change_once_across_a_leader_kill(
    spark: SparkSession, tmp_path: Path
) -> None:
    cluster = LocalCluster(
        tmp_path / "cluster", nodes=3, shards=2, replication_factor=3, fsync=False
    )
    query = None
    stop = threading.Event()
    written: list[str] = []
    errors: list[BaseException] = []
    try:
        cluster.start()
        address = ",".join(cluster.nodes)

        def writer() -> None:
            try:
                with DataClient(address, retry_s=60) as client:
                    i = 0
                    while not stop.is_set():
                        keys = [f"kill/{i:05d}-{j}" for j in range(10)]
                        table = pa.table({"key": keys, "value": [k.encode() for k in keys]})
                        for shard, part in client.route(table).items():
                            client.write(
                                shard, part, origin=ClientSerial(f"kill-writer/{shard}", i)
                            )
                        written.extend(keys)
                        i += 1
                        time.sleep(0.02)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        feed = (
            spark.readStream.format("quorumstore")
            .option("address", address)
            .option("startingOffsets", "earliest")
            .load()
        )
        query = (
            feed.writeStream.format("memory")
            .queryName("killfeed")
            .trigger(processingTime="1 second")
            .start()
        )
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        time.sleep(8)
        seen = spark.sql("SELECT count(*) AS n FROM killfeed").first().n
        assert seen > 0, "the stream has delivered nothing before the kill"
        leader = cluster.leader_of(0)
        term = cluster.shard_metadata(0).term
        cluster.kill9(leader)
        cluster.wait_new_leader(0, not_on=leader, after_term=term)
        time.sleep(8)
        stop.set()
        thread.join(90)
        assert not errors, errors
        expected = sorted(written)
        assert len(expected) > 100
        deadline = time.monotonic() + 120
        while True:
            rows = spark.sql("SELECT key FROM killfeed WHERE key LIKE 'kill/%'").collect()
            if (
                len(rows) >= len(expected)
                or time.monotonic() > deadline
                or query.exception() is not None
            ):
                break
            time.sleep(1)
        assert query.exception() is None
        assert sorted(r.key for r in rows) == expected  # every change, once
    finally:
        stop.set()
        if query is not None:
            query.stop()
        cluster.close()
        shutil.rmtree(tmp_path / "cluster", ignore_errors=True)
