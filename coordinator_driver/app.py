"""spark-submit application: a quorumstore cluster on this application's executors.

    PYSPARK_PYTHON="$(python -c 'import sys; print(sys.executable)')" SPARK_CONF_DIR=conf \
      spark-submit coordinator_driver/app.py

Settings come from conf/quorumstore.conf, overridden by ``--conf spark.quorumstore.*``
(see python/quorumstore/spark/config.py for the keys). The coordinator runs in this
driver process, the storage nodes in executor tasks (coordinator_driver/ is the
driver side, quorumstore.spark.node_task the executor side). It prints the client endpoint, serves
until SIGTERM or SIGINT, then stops the cluster and the application.

SIGTERM usually reaches spark-submit's JVM rather than this Python process. Left alone,
the JVM's shutdown hooks stop the SparkContext first, which kills the node tasks
mid-flight: Spark reports each as a crashed Python worker and the coordinator as a lost
node. So this process registers a JVM shutdown hook ordered before Spark's, which asks
it to stop the cluster and waits until it has. The serving loop also watches the
SparkContext, in case the JVM stops it some other way.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONF_FILE = Path(__file__).resolve().parents[1] / "conf" / "quorumstore.conf"
POLL_S = 0.5
#: Rank of the stop hook among Hadoop's shutdown hooks, which run highest first: above
#: Spark's own (FileSystem.SHUTDOWN_HOOK_PRIORITY + 30 = 40), so the SparkContext still works.
STOP_HOOK_PRIORITY = 50
#: How long the JVM's exit waits for the cluster to stop (HostedCluster.stop waits up to 30 s
#: for the node processes).
STOP_HOOK_TIMEOUT_S = 45


#: A setting line as Java properties (and so spark-defaults.conf) read it: the key ends at
#: the first whitespace, '=' or ':'; one '=' or ':' may follow; the rest is the value.
_SETTING = re.compile(r"([^\s=:]+)\s*[=:]?\s*(.*)")


def read_conf_file(path: Path) -> dict[str, str]:
    """``key value`` lines (spark-defaults format; ``key=value`` also works), # comments."""
    settings = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        match = _SETTING.fullmatch(line)
        if match is not None:
            settings[match[1]] = match[2].strip()
    return settings


class StopClusterHook:
    """A JVM shutdown hook, called through Py4J: stop the cluster before Spark stops itself.

    Registered with Hadoop's shutdown hook manager, which runs Spark's hooks too, highest
    priority first and one at a time.
    """

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._manager: Any = None
        self._java_hook: Any = None
        self.called = False
        self.cluster_stopped = threading.Event()

    def install(self, spark: SparkSession) -> None:
        from pyspark.java_gateway import ensure_callback_server_started

        sc = spark.sparkContext
        assert sc._jvm is not None, "the SparkContext is stopped"
        ensure_callback_server_started(sc._gateway)
        seconds = sc._jvm.java.util.concurrent.TimeUnit.SECONDS
        self._manager = sc._jvm.org.apache.hadoop.util.ShutdownHookManager.get()
        # Wrapped in a Thread (only run(), never started) because Hadoop finds a hook to
        # remove by reference, and Py4J makes a new Java proxy each time `self` is passed.
        self._java_hook = sc._jvm.java.lang.Thread(self, "quorumstore-stop-cluster")
        self._manager.addShutdownHook(
            self._java_hook, STOP_HOOK_PRIORITY, STOP_HOOK_TIMEOUT_S, seconds
        )

    def withdraw(self) -> bool:
        """Unregisters the hook; False when too late because the JVM is exiting (Ctrl-C
        reaches both processes), in which case the hook still runs and must be answered."""
        if self.called:
            return False
        try:
            return bool(self._manager.removeShutdownHook(self._java_hook))
        except Exception:  # noqa: BLE001 - "Shutdown in progress", or the JVM has gone
            return False

    def run(self) -> None:
        self.called = True
        self._stop.set()
        self.cluster_stopped.wait(STOP_HOOK_TIMEOUT_S)

    class Java:
        implements: ClassVar[list[str]] = ["java.lang.Runnable"]  # read by Py4J


#: Where nodes keep their data when no dataDir is set.
EXECUTOR_DIRS = "the executors' local directories"


def main() -> int:
    from pyspark.sql import SparkSession

    from quorumstore.spark.conf_keys import warn_unknown_keys
    from quorumstore.spark.config import HostingConfig
    from quorumstore.spark.hosting import launch
    from quorumstore.spark.node_jobs import spark_stopped

    spark = SparkSession.builder.getOrCreate()
    stop = threading.Event()
    # Installed after the session is created, because PySpark installs a SIGINT handler.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # The session's settings (spark-submit --conf, spark-defaults.conf) win over the file.
        file_settings = read_conf_file(CONF_FILE)
        warn_unknown_keys(file_settings, str(CONF_FILE))
        settings = {**file_settings, **dict(spark.sparkContext.getConf().getAll())}
        cluster = launch(spark, HostingConfig.resolve(settings))
    except (ValueError, RuntimeError, OSError) as e:
        print(f"quorumstore: error: {e}", file=sys.stderr, flush=True)
        spark.stop()
        return 2
    hook = StopClusterHook(stop)
    hook.install(spark)
    config = cluster.config
    print(f"quorumstore client endpoint: {cluster.address}", flush=True)
    print(
        f"  {config.nodes} nodes ({', '.join(cluster.addresses)}), {config.shards} shards, replication factor "
        f"{config.replication_factor}, {config.placement} placement, data in "
        f"{config.data_dir or EXECUTOR_DIRS}\n"
        f"  status: quorumstore status --coordinator {cluster.admin_address}\n{cluster.status()}\n"
        "Serving until SIGTERM (or Ctrl-C).",
        flush=True,
    )
    while not stop.wait(POLL_S) and not spark_stopped(spark.sparkContext):
        pass
    if spark_stopped(spark.sparkContext):
        _silence_output()  # the JVM that relays our output has exited or is exiting
    cluster.stop()
    jvm_exiting = not hook.withdraw()
    if not jvm_exiting:
        spark.stop()  # else Spark's own shutdown hook does, after ours returns
    try:
        print("quorumstore stopped", flush=True)
    except BrokenPipeError:  # the JVM exited meanwhile
        _silence_output()
    hook.cluster_stopped.set()
    if jvm_exiting:
        # Exiting now would cut off the reply to the hook's call; Spark's own hook, which
        # stops the SparkContext, runs only after that call has returned.
        deadline = time.monotonic() + STOP_HOOK_TIMEOUT_S
        while not spark_stopped(spark.sparkContext) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    return 0


def _silence_output() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.dup2(devnull, sys.stderr.fileno())


if __name__ == "__main__":
    sys.exit(main())
