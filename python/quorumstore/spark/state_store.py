"""Use quorumstore as Spark's structured-streaming state store.

    from quorumstore.spark.state_store import spark_confs
    builder = SparkSession.builder
    for key, value in spark_confs("127.0.0.1:6648").items():
        builder = builder.config(key, value)

`state_store_jar()` finds the provider jar (building it from the checkout's Scala sources
with the compiler inside the pyspark wheel when it is missing or stale) and
`spark_confs()` returns the Spark confs that load it. See docs/state-store.md.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: The StateStoreProvider implemented by the jar.
PROVIDER_CLASS = "io.quorumstore.spark.state.QuorumStateStoreProvider"
#: Spark's own RocksDB provider, the reference the quorumstore provider is tested against.
ROCKSDB_PROVIDER_CLASS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

_BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "executor_node" / "build_jar.py"


def state_store_jar(force: bool = False) -> Path:
    """Path of the provider jar, built first if missing or older than its sources."""
    if not _BUILD_SCRIPT.is_file():
        raise FileNotFoundError(
            f"{_BUILD_SCRIPT} not found: the state-store jar is built from a quorumstore "
            "checkout (executor_node/); build it there and pass its path in spark.jars"
        )
    spec = importlib.util.spec_from_file_location("quorumstore_build_jar", _BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(module.build(force=force))


def spark_confs(
    address: str,
    namespace: str = "default",
    *,
    prefix: str | None = None,
    timeout_ms: int | None = None,
    snapshot_interval: int | None = None,
    local_dir: str | None = None,
) -> dict[str, str]:
    """Spark confs that make quorumstore (at `address`, "host:port[,host:port...]") the
    state store of every streaming query of the session.

    The jar goes on the driver's and executors' class path as well as in `spark.jars`:
    Spark loads the provider class by name from its own class loader. `local_dir` is where
    executors keep their local copies of the state (default: Spark's first local dir).
    """
    jar = str(state_store_jar())
    confs = {
        "spark.sql.streaming.stateStore.providerClass": PROVIDER_CLASS,
        "spark.jars": jar,
        "spark.driver.extraClassPath": jar,
        "spark.executor.extraClassPath": jar,
        "spark.quorumstore.address": address,
        "spark.quorumstore.namespace": namespace,
    }
    optional = {
        "spark.quorumstore.stateStore.prefix": prefix,
        "spark.quorumstore.timeoutMs": timeout_ms,
        "spark.quorumstore.stateStore.snapshotInterval": snapshot_interval,
        "spark.quorumstore.stateStore.localDir": local_dir,
    }
    confs.update({key: str(value) for key, value in optional.items() if value is not None})
    return confs
