"""A Spark-hosted cluster with TLS on its client ports, an auth config, and its own CA
on the internal plane; every Spark surface used through it with a token: the hosted
client, the DataFrame sink and source, and the JVM state store provider running a
stateful streaming query. Without the token, the same calls are refused.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from quorumstore.client import Unauthenticated
from quorumstore.spark.datasource import register
from quorumstore.spark.hosting import HostedCluster, start
from quorumstore.spark.state_store import spark_confs
from quorumstore.wire.certificates import CertificateAuthority

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

TOKEN = "spark-app-token-0123456789abcdef"
NODES = 3


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SparkSession, HostedCluster, Path]]:
    work = tmp_path_factory.mktemp("secured")
    ca = CertificateAuthority.create("test public CA")
    material = ca.issue("nodes", ["127.0.0.1", "localhost"])
    assert material.cert_chain is not None and material.private_key is not None
    (work / "cert.pem").write_bytes(material.cert_chain)
    (work / "key.pem").write_bytes(material.private_key)
    (work / "ca.pem").write_bytes(ca.cert)
    auth = work / "auth.json"
    auth.write_text(json.dumps({"tokens": {"spark-app": TOKEN}}))
    auth.chmod(0o600)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    addresses = ",".join(f"127.0.0.1:{7648 + i}" for i in range(NODES))
    confs = {
        **spark_confs(addresses, timeout_ms=60_000, local_dir=str(work / "local")),
        "spark.quorumstore.tls.certFile": str(work / "cert.pem"),
        "spark.quorumstore.tls.keyFile": str(work / "key.pem"),
        "spark.quorumstore.tls.trustedCaFile": str(work / "ca.pem"),
        "spark.quorumstore.auth.config": str(auth),
        "spark.quorumstore.auth.token": TOKEN,
    }
    builder = (
        SparkSession.builder.master(f"local[{NODES + 2}]")
        .appName("quorumstore-secured")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in confs.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cluster = start(spark, nodes=NODES, shards=2, data_dir=work / "data", base_port=7648)
    try:
        yield spark, cluster, work
    finally:
        cluster.stop()
        spark.stop()


def test_the_hosted_client_uses_the_sessions_tls_and_token(
    secured: tuple[SparkSession, HostedCluster, Path],
) -> None:
    _, cluster, _ = secured
    with cluster.client() as client:
        client.put("/hosted", b"1")
        assert client.get("/hosted")[1] == b"1"
    with pytest.raises(Unauthenticated):
        cluster.client(token=None, connect_timeout_s=5).close()


def test_dataframes_and_the_state_store_with_tls_and_a_token(
    secured: tuple[SparkSession, HostedCluster, Path],
) -> None:
    spark, cluster, work = secured
    register(
        spark, address=cluster.addresses, tls_trusted_ca_file=str(work / "ca.pem"), token=TOKEN
    )
    events = work / "events"
    events.mkdir()
    batches = [["ada", "bob", "ada"], ["cy", "ada"], ["bob", "dee"]]
    for i, users in enumerate(batches):
        (events / f"part-{i}.json").write_text("\n".join(json.dumps({"user": u}) for u in users))
    counts = (
        spark.readStream.schema("user string")
        .option("maxFilesPerTrigger", 1)
        .json(str(events))
        .groupBy("user")
        .agg(F.count("*").alias("events"))
        .select(F.concat(F.lit("/counts/"), F.col("user")).alias("key"), "events")
    )

    def upsert(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        batch.write.format("quorumstore").mode("append").option("valueFormat", "json").save()

    query = (
        counts.writeStream.outputMode("update")
        .foreachBatch(upsert)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    committed = (
        spark.read.format("quorumstore")
        .option("keyPrefix", "/counts/")
        .option("valueFormat", "json")
        .option("valueSchema", "events long")
        .load()
        .select("key", "events")
        .collect()
    )
    assert {r.key: r.events for r in committed} == {
        "/counts/ada": 3,
        "/counts/bob": 2,
        "/counts/cy": 1,
        "/counts/dee": 1,
    }
    # The state store provider kept the operator's state in the cluster, over TLS.
    with cluster.client() as client:
        keys = client.list("", "")
        assert [k for k in keys if not k.startswith(("/counts/", "/hosted"))], keys

    # With another token, the data source is refused.
    with pytest.raises(Exception, match="UNAUTHENTICATED|not one of the configured tokens"):
        spark.read.format("quorumstore").option("token", "wrong-token-0123456789abcdef").load()
    # And so is the state store provider.
    spark.conf.set("spark.quorumstore.auth.token", "wrong-token-0123456789abcdef")
    try:
        failing = (
            spark.readStream.schema("user string")
            .json(str(events))
            .groupBy("user")
            .count()
            .writeStream.outputMode("update")
            .format("console")
            .option("checkpointLocation", str(work / "checkpoint-refused"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(StreamingQueryException, match="UNAUTHENTICATED"):
            failing.awaitTermination(300)
    finally:
        spark.conf.set("spark.quorumstore.auth.token", TOKEN)
