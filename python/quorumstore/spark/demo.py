"""The main job (`quorumstore demo`): quorumstore inside one Spark application, end to end.

1. starts a 3-node, replication-factor-3 quorumstore cluster on the session's own
   executors (coordinator in this driver, nodes in barrier tasks);
2. runs a stateful streaming query (event counts per user) whose operator state is kept
   in quorumstore by its StateStoreProvider, and whose updated counts are upserted into
   quorumstore after every micro-batch;
3. reads the committed state back as a DataFrame.

It runs from the installed package alone, so a fresh install can show it works:

    quorumstore demo [--base-port 6648] [--work-dir DIR]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from quorumstore.spark.datasource import register
from quorumstore.spark.hosting import start
from quorumstore.spark.state_store import spark_confs

NODES = 3
EVENTS = [
    [
        {"user": "ada", "page": "/home"},
        {"user": "bob", "page": "/home"},
        {"user": "ada", "page": "/docs"},
    ],
    [{"user": "cy", "page": "/home"}, {"user": "ada", "page": "/blog"}],
    [
        {"user": "bob", "page": "/docs"},
        {"user": "bob", "page": "/blog"},
        {"user": "dee", "page": "/home"},
    ],
]


def run(base_port: int = 6648, work_dir: Path | None = None) -> None:
    """Runs the main job: nodes listen on `base_port` + i; data, checkpoints and input
    go to `work_dir` (default: a new temporary directory)."""
    work = Path(work_dir or tempfile.mkdtemp(prefix="quorumstore-main-job-")).resolve()
    addresses = [f"127.0.0.1:{base_port + i}" for i in range(NODES)]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = (
        SparkSession.builder.master(f"local[{NODES + 2}]")
        .appName("quorumstore-main-job")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in spark_confs(",".join(addresses)).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    print(
        f"starting a {NODES}-node quorumstore cluster in this Spark application (data in {work}) ..."
    )
    with start(
        spark,
        nodes=NODES,
        shards=4,
        replication_factor=3,
        data_dir=work / "data",
        base_port=base_port,
    ) as cluster:
        print(cluster.status())
        register(spark, address=cluster.addresses)

        events_dir = work / "events"
        events_dir.mkdir(parents=True, exist_ok=True)
        for i, batch in enumerate(EVENTS):
            (events_dir / f"part-{i}.json").write_text("\n".join(json.dumps(e) for e in batch))

        counts = (
            spark.readStream.schema("user string, page string")
            .option("maxFilesPerTrigger", 1)
            .json(str(events_dir))
            .groupBy("user")
            .agg(F.count("*").alias("events"), F.collect_set("page").alias("pages"))
            .select(F.concat(F.lit("/clicks/"), F.col("user")).alias("key"), "events", "pages")
        )

        def upsert(batch, batch_id: int) -> None:
            # Each micro-batch's updated counts overwrite their keys in quorumstore.
            batch.write.format("quorumstore").mode("append").option("valueFormat", "json").save()

        query = (
            counts.writeStream.outputMode("update")
            .foreachBatch(upsert)
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        print(
            f"streaming query finished: {len(query.recentProgress)} micro-batches, state kept in quorumstore"
        )

        committed = (
            spark.read.format("quorumstore")
            .option("keyPrefix", "/clicks/")
            .option("valueFormat", "json")
            .option("valueSchema", "events long, pages array<string>")
            .load()
        )
        print("committed state, read back as a DataFrame:")
        committed.select("key", "events", "pages", "version_id", "shard").orderBy("key").show(
            truncate=False
        )
    spark.stop()
