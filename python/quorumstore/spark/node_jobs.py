"""Driver side of node hosting: the Spark jobs whose tasks are storage nodes, kept running.

Spark gives a long-running job no restart policy of its own that fits: it kills every
task of a barrier stage when one fails and does not retry a barrier result stage, and a
plain job fails after ``spark.task.maxFailures`` attempts (1 in local mode). So each
node job runs in its own driver thread, which resubmits it whenever it ends while the
cluster is meant to be up; the new tasks reopen the nodes' data directories and the
coordinator re-elects. A job group per thread (``interruptOnCancel=True``) lets
`NodeJob.cancel` stop exactly that job, and Spark then kills its Python workers.

Placements: `barrier` is one job with a barrier task per node (gang-scheduled, addresses
exchanged, but one node's death restarts all); `independent` is one single-task job per
node, so a node fails and comes back alone.

Each submission asks Spark to run node ``i`` on the host that holds its data (the host
it last registered from; Spark's preferred locations, `located_rdd`), so a restarted
node returns to its disk while that host lives; elsewhere it starts empty and is caught
up by its shards' leaders.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from pyspark import SparkContext
from pyspark.rdd import RDD
from pyspark.serializers import BatchedSerializer, CPickleSerializer

from quorumstore.archive.restore import LatestRestore
from quorumstore.spark import node_task
from quorumstore.spark.config import HostingConfig
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.certificates import CertificateAuthority

log = logging.getLogger(__name__)

#: Pause before resubmitting a failed node job: long enough for Spark to finish
#: killing the old tasks, short against the seconds a barrier restart takes anyway.
RESUBMIT_DELAY_S = 0.5
#: How often a stopping job's group is cancelled again until its thread ends.
RECANCEL_INTERVAL_S = 0.5


@dataclass(frozen=True)
class NodeJobState:
    """One node job as the driver sees it, for `HostedCluster.status()`."""

    group: str
    nodes: tuple[int, ...]
    submissions: int
    failures: int
    last_failure: str | None

    def __str__(self) -> str:
        nodes = ", ".join(map(str, self.nodes))
        line = f"spark job group {self.group} (node {nodes}): submitted {self.submissions}x, failed {self.failures}x"
        return f"{line}; last failure: {self.last_failure}" if self.last_failure else line


class NodeJob(threading.Thread):
    """Runs one node job and resubmits it after every failure until `cancel()`."""

    def __init__(
        self,
        sc: SparkContext,
        group: str,
        description: str,
        nodes: list[int],
        barrier: bool,
        body: Callable[[Iterable[int]], Iterator[str]],
        on_spark_stopped: Callable[[], None],
        preferred_hosts: Callable[[], Mapping[int, str]],
    ):
        super().__init__(name=f"quorumstore-{group}", daemon=True)
        self._sc = sc
        self.group = group
        self._description = description
        self._nodes = nodes
        self._barrier = barrier
        self._body = body
        self._on_spark_stopped = on_spark_stopped
        self._preferred_hosts = preferred_hosts
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._submissions = 0
        self._failures: list[str] = []

    def _ended(self) -> bool:
        """Cancelled, or the SparkContext stopped under the job (then reported)."""
        if self._stopping.is_set():
            return True
        if spark_stopped(self._sc):
            self._on_spark_stopped()
            return True
        return False

    def run(self) -> None:
        while not self._ended():
            with self._lock:
                self._submissions += 1
            self._sc.setJobGroup(self.group, self._description, interruptOnCancel=True)
            try:
                hosts = self._preferred_hosts()
                rdd = located_rdd(self._sc, [(i, hosts.get(i)) for i in self._nodes])
                (rdd.barrier() if self._barrier else rdd).mapPartitions(self._body).collect()
                failure = "the node tasks returned"
            except Exception as e:  # noqa: BLE001 - every way a job ends is a failure here
                failure = describe_failure(e)
            if self._ended():
                return
            with self._lock:
                self._failures.append(failure)
            log.warning(
                "quorumstore node job %s failed, resubmitting in %.1f s: %s",
                self.group,
                RESUBMIT_DELAY_S,
                failure,
            )
            self._stopping.wait(RESUBMIT_DELAY_S)

    def cancel(self) -> None:
        """Stops resubmitting and cancels the running job; Spark then kills its tasks."""
        self._stopping.set()
        self._cancel_group()

    def wait_cancelled(self, timeout_s: float) -> None:
        """After `cancel()`: waits up to `timeout_s` for this thread to end.

        Cancels the job group again meanwhile: a cancel that lands after the loop checked
        `_stopping` but before `collect()` submitted the job finds no job to cancel, and
        the job would then run, holding its nodes' ports, until Spark stops."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.join(max(0.0, min(RECANCEL_INTERVAL_S, deadline - time.monotonic())))
            if not self.is_alive() or time.monotonic() >= deadline:
                return
            self._cancel_group()

    def _cancel_group(self) -> None:
        try:
            self._sc.cancelJobGroup(self.group)
        except Exception:
            if not spark_stopped(self._sc):
                raise

    def running_tasks(self) -> int:
        """Tasks of this job group Spark still counts as running (they hold slots)."""
        if spark_stopped(self._sc):
            return 0
        tracker = self._sc.statusTracker()
        running = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else []:
                stage = tracker.getStageInfo(stage_id)
                running += stage.numActiveTasks if stage is not None else 0
        return running

    def state(self) -> NodeJobState:
        with self._lock:
            return NodeJobState(
                self.group,
                tuple(self._nodes),
                self._submissions,
                len(self._failures),
                self._failures[-1] if self._failures else None,
            )


def node_task_spec(
    config: HostingConfig,
    coordinator: str,
    secret: ClusterSecret,
    ca: CertificateAuthority,
    *,
    barrier: bool,
    restore: LatestRestore | None,
) -> node_task.NodeTaskSpec:
    """What every node task of `config` gets: its ports, the coordinator's registry at
    `coordinator`, the cluster secret, each node's certificate from `ca`, and the
    `restore` to carry out before starting, if any."""
    return node_task.NodeTaskSpec(
        host=config.host,
        client_ports=tuple(config.client_port(i) for i in range(config.nodes)),
        internal_ports=tuple(config.internal_port(i) for i in range(config.nodes)),
        coordinator=coordinator,
        cluster_secret=secret,
        internal_tls=tuple(ca.internal_tls(name) for name in config.node_names),
        tls=config.public_tls,
        auth=config.auth,
        data_dir=None if config.data_dir is None else str(config.data_dir),
        cluster_name=config.cluster_name,
        wal_sync=config.wal_sync,
        kv_memory_bytes=config.kv_memory_bytes,
        relay_timeout_ms=config.relay_timeout_ms,
        limits=config.limits,
        barrier=barrier,
        log_level=config.log_level,
        archive_url=config.archive_url,
        archive=config.archive,
        restore=restore,
    )


def submit_node_jobs(
    sc: SparkContext,
    config: HostingConfig,
    cluster_id: str,
    coordinator: str,
    on_spark_stopped: Callable[[], None],
    preferred_hosts: Callable[[], Mapping[int, str]],
    secret: ClusterSecret,
    ca: CertificateAuthority,
    restore: LatestRestore | None = None,
) -> list[NodeJob]:
    """Starts the node jobs of `config.placement`; each runs until cancelled, or until
    the SparkContext stops under it, which it reports through `on_spark_stopped`. The
    nodes register with the coordinator's registry at `coordinator`. The cluster
    `secret`, each node's certificate from the cluster's `ca`, and the client ports' TLS
    and auth config travel to the executors inside the tasks' closure, and so does the
    `restore` the nodes carry out before they start, if any."""
    barrier = config.placement == "barrier"
    spec = node_task_spec(config, coordinator, secret, ca, barrier=barrier, restore=restore)
    body = functools.partial(node_task.serve_partition, spec)
    if barrier:
        groups = [
            (
                f"{cluster_id}-nodes",
                f"quorumstore storage nodes 0-{config.nodes - 1} (barrier)",
                list(range(config.nodes)),
            )
        ]
    else:
        groups = [
            (f"{cluster_id}-node{i}", f"quorumstore storage node {i}", [i])
            for i in range(config.nodes)
        ]
    jobs = [
        NodeJob(sc, group, description, nodes, barrier, body, on_spark_stopped, preferred_hosts)
        for group, description, nodes in groups
    ]
    for job in jobs:
        job.start()
    return jobs


def located_rdd(sc: SparkContext, items: list[tuple[int, str | None]]) -> RDD[int]:
    """An RDD with one partition per item, each holding the item's int and preferring
    the item's host (Spark's ``makeRDD`` with locations, which PySpark does not offer).

    Each partition's single element is pickled the way `SparkContext.parallelize`
    batches them (a list per batch), so the Python side reads it as any PySpark RDD.
    """
    jvm = sc._jvm
    assert jvm is not None
    converters = jvm.scala.jdk.javaapi.CollectionConverters
    serializer = CPickleSerializer()
    pairs = jvm.java.util.ArrayList()
    for item, host in items:
        hosts = jvm.java.util.ArrayList()
        if host:
            hosts.add(host)
        element = bytearray(serializer.dumps([item]))
        pairs.add(jvm.scala.Tuple2(element, converters.asScala(hosts).toSeq()))
    byte_array = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
    jrdd = sc._jsc.sc().makeRDD(converters.asScala(pairs).toSeq(), byte_array)
    return RDD(jrdd.toJavaRDD(), sc, BatchedSerializer(CPickleSerializer(), 1))


def spark_stopped(sc: SparkContext) -> bool:
    """True once the SparkContext is stopped or its JVM is gone (spark-submit got SIGTERM)."""
    try:
        return sc._jsc is None or sc._jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 - py4j fails in many ways once the JVM has exited
        return True


def describe_failure(error: BaseException) -> str:
    """Why a node job failed, in one line, from the Py4J error that wraps Spark's report.

    A Python exception raised in a task is quoted from the traceback Spark embeds;
    otherwise the innermost SparkException message ("Python worker exited unexpectedly
    (crashed)" for a killed worker) is used.
    """
    lines = str(error).splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith("Traceback (most recent call last):"):
            raised = next((f for f in lines[i + 1 :] if f and not f[0].isspace()), None)
            if raised is not None:
                return raised.strip()[:500]
    causes = [line.rsplit("SparkException: ", 1)[1] for line in lines if "SparkException: " in line]
    if causes:
        return causes[-1].split(". Consider setting")[0][:500]
    return lines[0][:500] if lines else type(error).__name__


def wait_for_exit(
    running_pids: Callable[[], Iterable[int]], jobs: list[NodeJob], timeout_s: float
) -> list[int]:
    """Waits until `running_pids()` is empty and Spark counts no task of `jobs` as running.

    Returns the pids still running at the timeout. Waiting for both makes a stopped
    cluster's ports and task slots free for the next `start`. The pids are asked for
    again each time: a task cancelled while it was being launched can still start its
    node (and write its pid file) after the job has ended.
    """
    deadline = time.monotonic() + timeout_s
    running = list(running_pids())
    while time.monotonic() < deadline:
        if not running and not any(job.running_tasks() for job in jobs):
            break
        time.sleep(0.1)
        running = list(running_pids())
    return running


def process_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
