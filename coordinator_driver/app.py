"""spark-submit application: a quorumstore cluster on this application's executors.

    PYSPARK_PYTHON="$(python -c 'import sys; print(sys.executable)')" SPARK_CONF_DIR=conf \
      spark-submit coordinator_driver/app.py

Settings come from conf/quorumstore.conf, overridden by ``--conf spark.quorumstore.*``
(see python/quorumstore/spark/config.py for the keys). The coordinator runs in this
driver process, the storage nodes in executor tasks (coordinator_driver/ is the
driver side, executor_node/ the executor side). It prints the client endpoint, serves
until SIGTERM or SIGINT, then stops the cluster and the application.

SIGTERM usually reaches spark-submit's JVM rather than this Python process: the JVM
then stops the SparkContext (killing the node tasks) and exits without signalling us,
so the serving loop also watches the SparkContext and stops when it goes away.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import threading
from pathlib import Path

CONF_FILE = Path(__file__).resolve().parents[1] / "conf" / "quorumstore.conf"
POLL_S = 0.5


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


def main() -> int:
    from pyspark.sql import SparkSession

    import quorumstore.spark
    from quorumstore.spark.config import HostingConfig
    from quorumstore.spark.node_jobs import spark_stopped

    spark = SparkSession.builder.getOrCreate()
    stop = threading.Event()
    # Installed after the session is created, because PySpark installs a SIGINT handler.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # The session's settings (spark-submit --conf, spark-defaults.conf) win over the file.
        settings = {**read_conf_file(CONF_FILE), **dict(spark.sparkContext.getConf().getAll())}
        cluster = quorumstore.spark.start(
            spark, **dataclasses.asdict(HostingConfig.resolve(settings))
        )
    except (ValueError, RuntimeError, OSError) as e:
        print(f"quorumstore: error: {e}", file=sys.stderr, flush=True)
        spark.stop()
        return 2
    config = cluster.config
    print(f"quorumstore client endpoint: {cluster.address}", flush=True)
    print(
        f"  {config.nodes} nodes ({', '.join(cluster.addresses)}), {config.shards} shards, replication factor "
        f"{config.replication_factor}, {config.placement} placement, data in {config.data_dir}\n"
        f"  status: quorumstore status --coordinator {cluster.admin_address}\n{cluster.status()}\n"
        "Serving until SIGTERM (or Ctrl-C).",
        flush=True,
    )
    while not stop.wait(POLL_S) and not spark_stopped(spark.sparkContext):
        pass
    if spark_stopped(spark.sparkContext):
        _silence_output()  # the JVM that relays our output has exited or is exiting
    cluster.stop()
    spark.stop()
    try:
        print("quorumstore stopped", flush=True)
    except BrokenPipeError:  # Ctrl-C: the JVM got SIGINT too and exited meanwhile
        _silence_output()
    return 0


def _silence_output() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.dup2(devnull, sys.stderr.fileno())


if __name__ == "__main__":
    sys.exit(main())
