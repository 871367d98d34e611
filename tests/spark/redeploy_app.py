"""One run of a Spark application whose streaming query keeps its state in a state store
provider: quorumstore's, in a cluster this application hosts with an archive, or Spark's
RocksDB provider. `test_redeploy.py` runs it twice on one checkpoint, the second time
on empty data directories, as a redeployed application on new hosts would start.

The query counts and sums events per key (update mode) over the JSON files in
``<work>/in``; each micro-batch's output goes to ``--out`` as one JSON line. With
quorumstore, each micro-batch's rows are also upserted through the DataFrame sink, and
the application reads ``/counts/`` through the DataFrame source before its query
(``{"read_before": ...}``) and after it (``{"read_after": ...}``).

    python redeploy_app.py --provider quorumstore --work DIR --data-dir DIR \\
        --archive-url URL --base-port PORT --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from quorumstore.spark.datasource import register
from quorumstore.spark.hosting import start
from quorumstore.spark.state_store import ROCKSDB_PROVIDER_CLASS, spark_confs

NODES = 3
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", choices=("quorumstore", "rocksdb"), required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--archive-url")
    parser.add_argument("--base-port", type=int)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = (
        SparkSession.builder.master(f"local[{NODES + 2}]")
        .appName(f"quorumstore-redeploy-{args.provider}")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    )
    if args.provider == "quorumstore":
        addresses = ",".join(f"127.0.0.1:{args.base_port + i}" for i in range(NODES))
        for key, value in spark_confs(addresses).items():
            builder = builder.config(key, value)
    else:
        builder = builder.config(PROVIDER_CONF, ROCKSDB_PROVIDER_CLASS)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with args.out.open("a") as out:
        if args.provider == "quorumstore":
            with start(
                spark,
                nodes=NODES,
                shards=4,
                data_dir=args.data_dir,
                base_port=args.base_port,
                archive_url=args.archive_url,
            ) as cluster:
                register(spark, address=cluster.addresses)
                out.write(json.dumps({"read_before": _read_counts(spark)}) + "\n")
                _run_query(spark, args.work, out, upsert=True)
                out.write(json.dumps({"read_after": _read_counts(spark)}) + "\n")
        else:
            _run_query(spark, args.work, out, upsert=False)
    spark.stop()


def _run_query(spark: SparkSession, work: Path, out: object, *, upsert: bool) -> None:
    counts = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .json(str(work / "in"))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    )

    def sink(batch: DataFrame, batch_id: int) -> None:
        rows = sorted([r.k, r.n, r.total] for r in batch.collect())
        out.write(json.dumps({"batch": batch_id, "rows": rows}) + "\n")  # type: ignore[attr-defined]
        if upsert:
            (
                batch.select(
                    F.concat(F.lit("/counts/"), "k").alias("key"),
                    F.to_json(F.struct("n", "total")).alias("value"),
                )
                .write.format("quorumstore")
                .option("valueFormat", "string")
                .mode("append")
                .save()
            )

    query = (
        counts.writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")


def _read_counts(spark: SparkSession) -> dict[str, str]:
    counts = spark.read.format("quorumstore").option("keyPrefix", "/counts/")
    return {r.key: r.value for r in counts.option("valueFormat", "string").load().collect()}


if __name__ == "__main__":
    main()
