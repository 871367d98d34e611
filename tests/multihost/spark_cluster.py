"""A Spark standalone cluster across `Hosts`: the master on the bridge, one worker per host.

The master runs in the root namespace bound to the bridge address, each worker inside its
host with `SPARK_LOCAL_IP` (and `SPARK_LOCAL_HOSTNAME`, so nothing waits on reverse DNS)
set to the host's address, so the executors it launches bind there too. Everything comes
from the installed pyspark wheel: SPARK_HOME is its package directory, and `spark-class`
finds java the way pyspark's own launcher does (JAVA_HOME, else `java` on PATH). Each
process logs to its own file in the cluster's directory; `log_tails()` is what a failing
test prints. The driver is the test process itself, in the root namespace (`session()`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
from netns import Host, Hosts
from pyspark.sql import SparkSession

SPARK_HOME = Path(pyspark.__file__).resolve().parent
#: How long the master and every worker may take to come up and register (2 shared cores).
START_TIMEOUT_S = 180.0
_STOP_GRACE_S = 20.0
_WORKER_WEBUI_PORT = 8081
#: Every JVM of the cluster is short-lived and shares two cores: the C1 compiler alone and
#: the serial collector spend less CPU starting up than the defaults.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_MASTER = "org.apache.spark.deploy.master.Master"
_WORKER = "org.apache.spark.deploy.worker.Worker"


class ClusterStartError(RuntimeError):
    """The master or a worker did not come up; the message holds their log tails."""


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class SparkCluster:
    """One master and one worker per host; `stop()` ends them all (and `hosts.close()`
    would kill whatever survives)."""

    def __init__(
        self, hosts: Hosts, directory: Path, *, cores: int = 1, memory: str = "1g"
    ) -> None:
        self.hosts = hosts
        self.directory = directory
        self.cores = cores
        self.memory = memory
        self.master_port = _free_port(hosts.gateway)
        self.webui_port = _free_port(hosts.gateway)
        self.master: subprocess.Popen[Any] | None = None
        self.workers: list[subprocess.Popen[Any]] = []
        self.logs: list[Path] = []
        self._session: SparkSession | None = None

    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts.gateway}:{self.master_port}"

    @property
    def status_url(self) -> str:
        return f"http://{self.hosts.gateway}:{self.webui_port}/json/"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Starts the master and the workers, then waits until the master counts every
        worker ALIVE."""
        gateway = self.hosts.gateway
        master = [_MASTER, "--host", gateway, "--port", self.master_port]
        master += ["--webui-port", self.webui_port]
        self.master = self._spawn(self.hosts.root, "master", master)
        for host in self.hosts:
            self.workers.append(self.start_worker(host))
        self.wait_alive(len(self.hosts))

    def start_worker(self, host: Host) -> subprocess.Popen[Any]:
        """Starts `host`'s worker (again, after the host was killed); its directories are
        kept, as a host's disk is."""
        resources = ["--cores", self.cores, "--memory", self.memory]
        resources += ["--webui-port", _WORKER_WEBUI_PORT]
        return self._spawn(
            host,
            f"worker-h{host.index}",
            [_WORKER, self.master_url, "--host", host.address, *resources],
        )

    def _spawn(self, host: Host, name: str, args: list[Any]) -> subprocess.Popen[Any]:
        directory = self.directory / name
        (directory / "work").mkdir(parents=True, exist_ok=True)
        (directory / "local").mkdir(exist_ok=True)
        (directory / "conf").mkdir(exist_ok=True)  # empty: no site configuration leaks in
        address = host.address
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_CONF_DIR": str(directory / "conf"),
            "SPARK_LOCAL_IP": address,
            "SPARK_LOCAL_HOSTNAME": address,
            "SPARK_WORKER_DIR": str(directory / "work"),
            "SPARK_LOCAL_DIRS": str(directory / "local"),
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS,
            "PYSPARK_PYTHON": sys.executable,
        }
        log = directory / "process.log"
        self.logs.append(log)
        with open(log, "ab") as out:
            return host.popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *map(str, args)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def status(self) -> dict[str, Any]:
        """The master's JSON status page."""
        # No proxy: a configured one must never see (or route) the bridge address.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.status_url, timeout=5) as response:
            return dict(json.load(response))

    def alive_workers(self) -> list[str]:
        """The host address of each worker the master counts ALIVE."""
        workers = self.status().get("workers", [])
        return sorted(w["host"] for w in workers if w.get("state") == "ALIVE")

    def wait_alive(self, count: int) -> None:
        """Waits until the master counts a worker ALIVE on `count` hosts (a killed host's
        old worker stays listed until the master's worker timeout; its new one counts)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        alive: list[str] = []
        while time.monotonic() < deadline:
            dead = [p.args for p in [self.master, *self.workers] if p and p.poll() is not None]
            if dead:
                raise ClusterStartError(f"exited while starting: {dead}\n{self.log_tails()}")
            with contextlib.suppress(OSError, ValueError):
                alive = self.alive_workers()
                if len(set(alive)) == count:
                    return
            time.sleep(1.0)
        raise ClusterStartError(
            f"{len(alive)} of {count} workers ALIVE after {START_TIMEOUT_S} s: {alive}\n"
            + self.log_tails()
        )

    def session(self, app_name: str = "quorumstore-multihost", **conf: str) -> SparkSession:
        """The driver: a session of this process on the cluster, bound to the bridge
        address; `getOrCreate` waits until every worker's executor registered."""
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        total_cores = str(self.cores * len(self.hosts))
        settings = {
            "spark.driver.host": self.hosts.gateway,
            "spark.driver.bindAddress": self.hosts.gateway,
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": "512m",
            "spark.executor.extraJavaOptions": JVM_OPTIONS,
            "spark.driver.extraJavaOptions": JVM_OPTIONS,
            "spark.cores.max": total_cores,
            # The first job waits for every executor, so its tasks spread over all hosts.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": total_cores,
            **conf,
        }
        builder = SparkSession.builder.master(self.master_url).appName(app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        self._session = builder.getOrCreate()
        return self._session

    def stop(self) -> list[str]:
        """Stops the driver's session, then the workers and the master (SIGTERM, SIGKILL
        after a grace). Returns what needed the SIGKILL (nothing, when all stop cleanly)."""
        if self._session is not None:
            self._session.stop()
            self._session = None
        killed = []
        for proc in [*self.workers, self.master]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for proc in [*self.workers, self.master]:
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(str(proc.args))
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        return killed

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of every process's log."""
        parts = []
        for path in self.logs:
            try:
                tail = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError as error:
                tail = [f"({error})"]
            parts.append(f"----- {path} (last {lines} lines)\n" + "\n".join(tail))
        return "\n".join(parts)


@contextlib.contextmanager
def running_spark_cluster(
    hosts: Hosts, directory: Path, *, cores: int = 1
) -> Iterator[SparkCluster]:
    """A started `SparkCluster`, stopped on leaving; its log tails are printed when
    anything inside fails."""
    started = SparkCluster(hosts, directory, cores=cores)
    try:
        started.start()
        yield started
    except BaseException:
        print(started.log_tails())
        raise
    finally:
        started.stop()
