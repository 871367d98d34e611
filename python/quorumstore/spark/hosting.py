"""A quorumstore cluster hosted by a Spark application: coordinator in the driver, nodes in tasks.

`start` runs the coordinator inside the driver process and each storage node in a
long-running executor task, waits until every shard has a leader and all its replicas,
and returns a `HostedCluster` handle. See docs/running-on-spark.md for placements and supervision.

>>> import quorumstore.spark
>>> cluster = quorumstore.spark.start(spark, nodes=3, shards=8, replication_factor=3)  # doctest: +SKIP
>>> with cluster.client() as client:  # doctest: +SKIP
...     client.put("/greeting", b"hello")
>>> print(cluster.status())  # doctest: +SKIP
>>> cluster.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from pyspark.sql import SparkSession

from quorumstore.client import Client
from quorumstore.coordinator.cluster_status import all_replicas_serving, format_status
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
from quorumstore.proto import replication_pb2 as pb
from quorumstore.spark.conf_keys import warn_unknown_keys
from quorumstore.spark.config import TOKEN_CONF, HostingConfig, node_path
from quorumstore.spark.coordinator_thread import CoordinatorThread
from quorumstore.spark.node_jobs import (
    NodeJob,
    NodeJobState,
    process_running,
    spark_stopped,
    submit_node_jobs,
    wait_for_exit,
)
from quorumstore.spark.slots import check_free_slots
from quorumstore.wire.addresses import host_port
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.certificates import CertificateAuthority
from quorumstore.wire.metadata import DEFAULT_NAMESPACE
from quorumstore.wire.tls import TlsConfig

log = logging.getLogger(__name__)

#: How long `stop()` waits for Spark to kill the node processes after cancelling.
_EXIT_TIMEOUT_S = 30.0


class ClusterStartError(RuntimeError):
    """The hosted cluster did not come up; the message says why and where to look."""


@dataclass(frozen=True)
class HostedClusterStatus:
    """The coordinator's view of the cluster plus the state of the node jobs.

    ``str(status)`` is the table ``quorumstore status`` prints, followed by one line
    per node job; `cluster` is the coordinator's ``ClusterStatus`` message itself.
    """

    cluster: pb.ClusterStatus
    node_jobs: tuple[NodeJobState, ...]

    @property
    def online(self) -> bool:
        """Every shard has a leader and every node's health stream is up."""
        shards = self.cluster.metadata.shards
        return all(s.status == pb.ONLINE for s in shards) and all(self.cluster.nodes_alive.values())

    @property
    def leaders(self) -> dict[int, str]:
        """Shard id -> leader address ("" while the shard has none)."""
        return {s.shard: s.leader for s in self.cluster.metadata.shards}

    def __str__(self) -> str:
        return "\n".join([format_status(self.cluster), *map(str, self.node_jobs)])


class HostedCluster:
    """Handle of a running cluster; returned by `start`, stopped by `stop()` or at exit.

    Attributes
    ----------
    address : str
        A node's client address (``host:port``) for Oxia-protocol clients; any node
        answers shard discovery, and clients then follow each shard's leader.
    addresses : list of str
        Every node's address, node ``i`` at index ``i``.
    admin_address : str
        The coordinator's status endpoint (``quorumstore status --coordinator ...``).
    config : HostingConfig
        The resolved settings, including the data directory and placement.
    """

    def __init__(
        self,
        spark: SparkSession,
        config: HostingConfig,
        coordinator: CoordinatorThread,
        cluster_id: str,
        secret: ClusterSecret,
        ca: CertificateAuthority,
    ):
        self.config = config
        self.addresses = config.node_addresses
        self.address = self.addresses[0]
        self.admin_address = host_port(config.host, config.admin_port)
        self._sc = spark.sparkContext
        self._coordinator = coordinator
        self._cluster_id = cluster_id
        self._secret = secret
        self._ca = ca
        self._started_at = time.time()
        self._jobs: list[NodeJob] = []
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._spark_gone = False

    # ------------------------------------------------------------------ public

    def client(self, **options: Any) -> Client:
        """A connected `quorumstore.Client` of this cluster (close it, or use ``with``).

        `options` go to the client (see `quorumstore.AsyncClient`); `tls` defaults to
        trusting ``spark.quorumstore.tls.trustedCaFile`` and `token` to
        ``spark.quorumstore.auth.token``, when set. Any Oxia-protocol client works too,
        given `address`.
        """
        self._check_running()
        if "tls" not in options and self.config.tls_trusted_ca_file is not None:
            options["tls"] = TlsConfig.from_files(None, None, self.config.tls_trusted_ca_file)
        token = self._sc.getConf().get(TOKEN_CONF)
        if "token" not in options and token:
            options["token"] = token
        return Client(self.address, **options)

    def status(self) -> HostedClusterStatus:
        """Shards (term, leader, offsets, follower lag), live nodes and node jobs, now."""
        self._check_running()
        return HostedClusterStatus(
            self._coordinator.call(CoordinatorServer.cluster_status),
            tuple(job.state() for job in self._jobs),
        )

    def node_pids(self) -> dict[int, int]:
        """Node index -> pid of the Python worker running it, as its task last wrote it.

        Read from ``data_dir/node<i>.pid``, so only meaningful on the executors' machine
        (local and local-cluster masters); pid files older than this cluster, and processes
        that have exited, are left out.
        """
        return {
            i: int(text)
            for i, text in self._node_files(".pid").items()
            if text.isdigit() and process_running(int(text))
        }

    def _node_files(self, suffix: str) -> dict[int, str]:
        """Node index -> text of ``data_dir/node<i><suffix>``, which node tasks write on
        this machine, where not older than this cluster."""
        found = {}
        for i in range(self.config.nodes):
            path = node_path(self.config.data_dir, i, suffix)
            try:
                if path.stat().st_mtime >= self._started_at - 1:
                    found[i] = path.read_text().strip()
            except FileNotFoundError:
                continue
        return found

    def stop(self) -> None:
        """Stops the nodes (cancels their Spark jobs) and the coordinator; idempotent.

        Returns once the node processes have exited, so their ports are free again.
        """
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        atexit.unregister(self.stop)
        self._coordinator.stop()
        for job in self._jobs:
            job.cancel()
        deadline = time.monotonic() + _EXIT_TIMEOUT_S
        for job in self._jobs:
            job.wait_cancelled(max(0.0, deadline - time.monotonic()))
        left = wait_for_exit(lambda: self.node_pids().values(), self._jobs, _EXIT_TIMEOUT_S)
        if left:
            log.warning(
                "quorumstore node processes %s were still running %.0f s after stop",
                left,
                _EXIT_TIMEOUT_S,
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running"
        return (
            f"HostedCluster({state}, address={self.address!r}, nodes={self.config.nodes}, "
            f"shards={self.config.shards}, placement={self.config.placement!r}, data_dir='{self.config.data_dir}')"
        )

    # ------------------------------------------------------------------ internals

    def _spark_stopped_under_cluster(self) -> None:
        """The SparkContext stopped (``spark.stop()``) with this cluster running: the nodes
        died with their tasks, so the coordinator stops too and the handle says so."""
        with self._stop_lock:
            if self._stopped or self._spark_gone:
                return
            self._spark_gone = True
        log.warning(
            "the SparkContext stopped under the quorumstore cluster at %s, so the cluster stopped "
            "too; call its stop() before spark.stop() to shut the nodes down cleanly",
            self.address,
        )
        # Not on the caller's thread: stop() waits for the node job threads, the caller's too.
        threading.Thread(target=self.stop, name="quorumstore-stop", daemon=True).start()

    def _check_running(self) -> None:
        if self._stopped:
            raise RuntimeError(
                f"{self!r} was stopped; start a new one with quorumstore.spark.start"
            )

    def _launch(self) -> None:
        """Submits the node jobs; returns when every shard has a leader and all its replicas.

        A node job failing before that is a setup problem (the executors' Python lacks
        quorumstore, nodes on several machines, ...), not a crash to supervise, so it
        fails the start with the job's error instead of being resubmitted.
        """
        self._jobs = submit_node_jobs(
            self._sc,
            self.config,
            self._cluster_id,
            self._spark_stopped_under_cluster,
            self._secret,
            self._ca,
        )
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            status = self._coordinator.call(CoordinatorServer.cluster_status)
            if _serving(status):
                self._adopt_saved_shard_count(status)
                return
            for job in self._jobs:
                state = job.state()
                if state.last_failure is not None:
                    raise ClusterStartError(
                        f"the storage node job {state.group} failed while starting: {state.last_failure}"
                    )
            if spark_stopped(self._sc):
                raise ClusterStartError("the SparkContext stopped while the cluster was starting")
            time.sleep(0.1)
        failing = "".join(
            f"\nnode {i} could not start: {why}"
            for i, why in sorted(self._node_files(".start-error").items())
        )
        raise ClusterStartError(
            f"not every shard had a leader and all its replicas within {self.config.start_timeout_s:g} s "
            f"(spark.quorumstore.startTimeout); the node tasks' logs are in the executors' stderr."
            f"{failing}\n{self.status()}"
        )

    def _adopt_saved_shard_count(self, status: pb.ClusterStatus) -> None:
        """A restart on existing data keeps the shard count saved with it (the coordinator
        logs a warning when another was asked for); so does this handle's `config`."""
        shards = sum(1 for s in status.metadata.shards if s.namespace == DEFAULT_NAMESPACE)
        if shards != self.config.shards:
            self.config = dataclasses.replace(self.config, shards=shards)


def start(
    spark: SparkSession,
    nodes: int | None = None,
    shards: int | None = None,
    replication_factor: int | None = None,
    *,
    placement: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    metadata_url: str | None = None,
    host: str | None = None,
    base_port: int | None = None,
    wal_sync: bool | None = None,
    kv_memory_bytes: int | None = None,
    start_timeout_s: float | None = None,
    failure_timeout_s: float | None = None,
    relay_timeout_s: float | None = None,
    log_level: str | None = None,
) -> HostedCluster:
    """Starts a quorumstore cluster inside this Spark application and waits until it serves.

    The coordinator runs in this (the driver's) process; each storage node runs in a
    long-running Spark task, in one barrier job (``placement="barrier"``) or one job
    per node (``"independent"``). The driver resubmits a node job that fails, and the
    nodes restart from their data directories. Arguments left as None come from the
    session's ``spark.quorumstore.*`` settings, then from the defaults in
    `HostingConfig` (3 nodes, 8 shards, replication factor 3, barrier placement, ports
    from 6648, data in ./quorumstore-data).

    Parameters
    ----------
    spark : SparkSession
        A classic (not Spark Connect) session; needs one free task slot per node.
    nodes, shards, replication_factor : int, optional
        Cluster size, number of shards of the ``default`` namespace, replicas per shard.
    placement : str, optional
        ``"barrier"`` or ``"independent"``; see docs/running-on-spark.md.
    data_dir : path, optional
        Node ``i`` keeps its data in ``data_dir/node<i>``; reused on restart.
    metadata_url : str, optional
        Path or fsspec URL of the coordinator's metadata (default under `data_dir`).
    host, base_port : optional
        Node ``i`` serves clients on ``host:base_port+i``, the coordinator's status on
        ``base_port+nodes``, and node ``i``'s internal port (node control and replication,
        for members only) is ``base_port+nodes+1+i``.
    wal_sync : bool, optional
        fsync the nodes' WALs (default True).
    kv_memory_bytes : int, optional
        Block cache and memtables that each node's shard stores share (default 512 MiB);
        count it in the executors' memory overhead.
    start_timeout_s : float, optional
        How long to wait for executors and for every shard to have a leader.
    failure_timeout_s : float, optional
        How long a node may be silent before the coordinator takes it for failed and
        elects new leaders for its shards (default 0.5 s, at least 0.2 s).
    relay_timeout_s : float, optional
        How long a node waits for a shard's leader when it relays a gateway-mode
        client's call (the official Python client) before retrying at a new leader.
    log_level : str, optional
        Level of the nodes' logs in the executors' stderr (default WARNING).

    Returns
    -------
    HostedCluster
        With ``address``, ``client()``, ``status()`` and ``stop()``.

    Raises
    ------
    NotEnoughSlotsError
        Fewer free task slots than nodes (checked before anything starts).
    ClusterStartError
        A node job failed, or the shards had no leaders within the timeout.
    ValueError
        An invalid setting, named in the message.

    Examples
    --------
    >>> cluster = quorumstore.spark.start(spark, nodes=3, shards=8)  # doctest: +SKIP
    >>> cluster.address  # doctest: +SKIP
    '127.0.0.1:6648'
    >>> cluster.stop()  # doctest: +SKIP
    """
    sc = spark.sparkContext
    settings = dict(sc.getConf().getAll())
    config = HostingConfig.resolve(
        settings,
        nodes=nodes,
        shards=shards,
        replication_factor=replication_factor,
        placement=placement,
        data_dir=data_dir,
        metadata_url=metadata_url,
        host=host,
        base_port=base_port,
        wal_sync=wal_sync,
        kv_memory_bytes=kv_memory_bytes,
        start_timeout_s=start_timeout_s,
        failure_timeout_s=failure_timeout_s,
        relay_timeout_s=relay_timeout_s,
        log_level=log_level,
    )
    return launch(spark, config)


def launch(spark: SparkSession, config: HostingConfig) -> HostedCluster:
    """Starts the cluster `config` describes (see `start`, which resolves it from the
    session's settings and its arguments; the spark-submit app resolves it from its
    settings file too)."""
    sc = spark.sparkContext
    warn_unknown_keys(dict(sc.getConf().getAll()), "Spark settings")
    check_free_slots(sc, config.nodes, config.start_timeout_s)
    # A new secret and CA for each cluster, made here and kept in memory: the coordinator
    # holds them, and the node tasks get theirs inside their closure (docs/security.md).
    secret = ClusterSecret.generate()
    ca = CertificateAuthority.create()
    coordinator = CoordinatorThread(coordinator_config(config, secret, ca))
    coordinator.start()
    cluster = HostedCluster(
        spark, config, coordinator, f"quorumstore-{uuid.uuid4().hex[:8]}", secret, ca
    )
    atexit.register(cluster.stop)
    try:
        cluster._launch()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def coordinator_config(
    config: HostingConfig, secret: ClusterSecret, ca: CertificateAuthority
) -> CoordinatorServerConfig:
    """The settings of the coordinator a hosted cluster runs in the driver."""
    return CoordinatorServerConfig(
        nodes=config.node_addresses,
        metadata_url=config.metadata_url,
        internal_addresses=config.internal_addresses,
        cluster_secret=secret,
        internal_tls=ca.internal_tls("coordinator"),
        tls=config.public_tls,
        namespaces={DEFAULT_NAMESPACE: config.shards},
        replication_factor=config.replication_factor,
        admin_host=config.host,
        admin_port=config.admin_port,
        failure_timeout_ms=config.failure_timeout_ms,
    )


def _serving(status: pb.ClusterStatus) -> bool:
    """The coordinator reaches every node, and every replica of every shard follows its
    leader: a majority elects the leader and the last member joins a moment later, and
    ``start()`` returns only once the whole cluster is in place."""
    return all(status.nodes_alive.values()) and all_replicas_serving(status)
