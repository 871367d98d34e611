"""Use quorumstore as Spark's structured-streaming state store.

    from quorumstore.spark.state_store import spark_confs
    builder = SparkSession.builder
    for key, value in spark_confs("127.0.0.1:6648").items():
        builder = builder.config(key, value)

`state_store_jar()` finds the provider jar, which an installed quorumstore carries as package
data (built when its wheel was built), and `spark_confs()` returns the Spark confs that
load it. See docs/state-store.md.
"""

from __future__ import annotations

from pathlib import Path

from quorumstore.spark import jar_build
from quorumstore.wire.metadata import DEFAULT_NAMESPACE

#: The StateStoreProvider implemented by the jar.
PROVIDER_CLASS = "io.quorumstore.spark.state.QuorumStateStoreProvider"
#: Spark's own RocksDB provider, the reference the quorumstore provider is tested against.
ROCKSDB_PROVIDER_CLASS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def state_store_jar(force: bool = False) -> Path:
    """Path of the provider jar inside the package.

    In a checkout (an editable install) it is built first if missing or older than its
    Scala sources; an installed wheel carries it ready-made.
    """
    if jar_build.have_sources():
        try:
            return jar_build.build(force=force)
        except jar_build.JarBuildError as e:
            raise RuntimeError(f"cannot build the quorumstore state-store jar: {e}") from e
    if not jar_build.JAR.is_file():
        raise FileNotFoundError(
            f"{jar_build.JAR} is missing: this quorumstore installation was built without its "
            "state-store jar; reinstall it from a wheel built with pyspark and a JDK at hand"
        )
    return jar_build.JAR


def spark_confs(
    address: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    *,
    prefix: str | None = None,
    timeout_ms: int | None = None,
    snapshot_interval: int | None = None,
    local_dir: str | None = None,
) -> dict[str, str]:
    """Spark confs that make quorumstore (at `address`, "host:port[,host:port...]") the
    state store of every streaming query of the session. Without `address`, a cluster
    the session hosts (`quorumstore.spark.start`) sets it once it serves.

    The jar goes in `spark.jars` alone: spark-submit adds it to the driver's class loader
    when the JVM starts, and Spark serves it to every executor, which adds it to the class
    loader its tasks load the provider with; so no path needs to exist on every host.
    `local_dir` is where executors keep their local copies of the state (default: Spark's
    first local dir).
    """
    jar = str(state_store_jar())
    confs = {
        "spark.sql.streaming.stateStore.providerClass": PROVIDER_CLASS,
        "spark.jars": jar,
        "spark.quorumstore.namespace": namespace,
    }
    optional = {
        "spark.quorumstore.address": address,
        "spark.quorumstore.stateStore.prefix": prefix,
        "spark.quorumstore.timeoutMs": timeout_ms,
        "spark.quorumstore.stateStore.snapshotInterval": snapshot_interval,
        "spark.quorumstore.stateStore.localDir": local_dir,
    }
    confs.update({key: str(value) for key, value in optional.items() if value is not None})
    return confs
