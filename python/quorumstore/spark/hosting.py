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
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from pyspark import SparkContext
from pyspark.sql import SparkSession

from quorumstore.archive.manifest import ArchiveError
from quorumstore.archive.restore import (
    LatestRestore,
    archived_metadata,
    forget_pending,
    load_pending,
    save_pending,
)
from quorumstore.archive.store import ArchiveStore
from quorumstore.client import Client
from quorumstore.coordinator.cluster_status import (
    all_replicas_serving,
    archive_behind,
    format_status,
)
from quorumstore.coordinator.metadata_store import MetadataStore
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import placed_nodes
from quorumstore.spark.conf_keys import warn_unknown_keys
from quorumstore.spark.config import TOKEN_CONF, HostingConfig, local_master, node_path
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
from quorumstore.storage.durable_files import replace_durably
from quorumstore.wire.addresses import host_of
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.certificates import CertificateAuthority
from quorumstore.wire.metadata import DEFAULT_NAMESPACE
from quorumstore.wire.tls import TlsConfig

log = logging.getLogger(__name__)

#: How long `stop()` waits for Spark to kill the node processes after cancelling.
_EXIT_TIMEOUT_S = 30.0
#: How long `stop()` waits for the archive to take the last committed entries.
ARCHIVE_DRAIN_TIMEOUT_S = 60.0
#: A node the coordinator cannot reach for this long fails the start (it is logged
#: after `UNREACHABLE_WARNING_S`).
UNREACHABLE_START_FAILURE_S = 10.0
#: The session setting the state store provider and the DataFrame source read.
ADDRESS_CONF = "spark.quorumstore.address"
#: Values of `ADDRESS_CONF` hosted clusters of this process set (a later one replaces them).
_published: set[str] = set()


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
    #: Why this application's coordinator stopped deciding, if another coordinator took
    #: its metadata location (docs/metadata.md): `cluster` is then its last view.
    deposed: str | None = None

    @property
    def online(self) -> bool:
        """Every shard has a leader, every node's health stream is up and the coordinator
        still decides."""
        shards = self.cluster.metadata.shards
        return (
            self.deposed is None
            and all(s.status == pb.ONLINE for s in shards)
            and all(self.cluster.nodes_alive.values())
        )

    @property
    def leaders(self) -> dict[int, str]:
        """Shard id -> its leader's client address ("" while the shard has none)."""
        addresses = self.cluster.node_addresses
        return {s.shard: addresses.get(s.leader, s.leader) for s in self.cluster.metadata.shards}

    @property
    def leader_names(self) -> dict[int, str]:
        """Shard id -> its leader's node name (``node<i>``; "" while none)."""
        return {s.shard: s.leader for s in self.cluster.metadata.shards}

    def __str__(self) -> str:
        deposed = [] if self.deposed is None else [f"coordinator stopped: {self.deposed}"]
        return "\n".join([*deposed, format_status(self.cluster), *map(str, self.node_jobs)])


class HostedCluster:
    """Handle of a running cluster; returned by `start`, stopped by `stop()` or at exit.

    Attributes
    ----------
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
        self.admin_address = coordinator.server.admin_address or ""
        self._addresses: list[str] = []
        self._spark = spark
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

    @property
    def addresses(self) -> list[str]:
        """Every node's client address now (``host:port``), node ``i`` first at index
        ``i``; a node that moved to another host has a new one."""
        if self._coordinator.running:
            book = self._address_book()
            self._addresses = [book[name] for name in self.config.node_names if name in book]
        return list(self._addresses)

    def _address_book(self) -> dict[str, str]:
        """Node name -> its client address, as the coordinator knows it now."""
        return self._coordinator.call(lambda server: dict(server.addresses.client))

    @property
    def address(self) -> str:
        """The nodes' client addresses, comma-separated, for Oxia-protocol clients, the
        DataFrame source and the state store: any node answers shard discovery, and
        clients then follow each shard's leader."""
        return ",".join(self.addresses)

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
        return Client(self.addresses, **options)

    def status(self) -> HostedClusterStatus:
        """Shards (term, leader, offsets, follower lag), live nodes and node jobs, now."""
        self._check_running()
        cluster, deposed = self._coordinator.call(
            lambda server: (server.cluster_status(), server.deposed)
        )
        return HostedClusterStatus(
            cluster,
            tuple(job.state() for job in self._jobs),
            None if deposed is None else str(deposed),
        )

    def node_pids(self) -> dict[int, int]:
        """Node index -> pid of the Python worker running it, as its task last wrote it.

        Read from ``data_dir/node<i>.pid``, so only meaningful on the executors' machine
        (local and local-cluster masters, or a `data_dir` the driver shares); pid files
        older than this cluster, and processes that have exited, are left out.
        """
        return {
            i: int(text)
            for i, text in self._node_files(".pid").items()
            if text.isdigit() and process_running(int(text))
        }

    def _node_files(self, suffix: str) -> dict[int, str]:
        """Node index -> text of ``data_dir/node<i><suffix>``, which node tasks write on
        this machine, where not older than this cluster."""
        found: dict[int, str] = {}
        if self.config.data_dir is None:
            return found
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
        self._save_placement()
        self._wait_until_archived()
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

    def _wait_until_archived(self) -> None:
        """With an archive, waits (up to `ARCHIVE_DRAIN_TIMEOUT_S`) until the archive
        holds every committed entry, so that a cluster stopped cleanly is restored
        whole; cancelled node tasks run no cleanup that could finish the upload."""
        if self.config.archive_url is None or not self._coordinator.running or self._spark_gone:
            return
        deadline = time.monotonic() + ARCHIVE_DRAIN_TIMEOUT_S
        behind: dict[str, int] = {}
        while time.monotonic() < deadline:
            try:
                behind = archive_behind(self._coordinator.call(CoordinatorServer.cluster_status))
            except (RuntimeError, TimeoutError) as e:
                log.warning("cannot tell whether the archive is complete: %s", e)
                return
            if not behind:
                return
            time.sleep(0.2)
        log.warning(
            "stopping the cluster with its archive at %s behind after %.0f s (shard: entries "
            "not archived, -1 unknown): %s",
            self.config.archive_url,
            ARCHIVE_DRAIN_TIMEOUT_S,
            ", ".join(f"{shard}: {n}" for shard, n in sorted(behind.items())),
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
        """Submits the node jobs, starts the coordinator's engine; returns when every
        shard has a leader and all its replicas.

        A node job failing before that is a setup problem (the executors' Python lacks
        quorumstore, a fixed host other hosts do not own, ...), not a crash to
        supervise, so it fails the start with the job's error instead of being
        resubmitted; so does a node the coordinator cannot reach for
        `UNREACHABLE_START_FAILURE_S`.
        """
        restore = self._planned_restore()
        registry = self._coordinator.open_registry()
        assert registry is not None
        self._jobs = submit_node_jobs(
            self._sc,
            self.config,
            self._cluster_id,
            registry,
            self._spark_stopped_under_cluster,
            self._preferred_hosts,
            self._secret,
            self._ca,
            restore,
        )
        started = self._coordinator.start()
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if started.done():
                started.result()  # raises what stopped the coordinator from starting
                self.admin_address = self._coordinator.server.admin_address or ""
                status = self._coordinator.call(CoordinatorServer.cluster_status)
                if _serving(status):
                    self._restore_done()
                    self._adopt_saved_shard_count(status)
                    self._save_placement()
                    self._publish_address()
                    return
            for job in self._jobs:
                state = job.state()
                if state.last_failure is not None:
                    raise ClusterStartError(
                        f"the storage node job {state.group} failed while starting: {state.last_failure}"
                    )
            for since, reason in self._coordinator.call(lambda s: list(s.unreachable.values())):
                if time.monotonic() - since >= UNREACHABLE_START_FAILURE_S:
                    raise ClusterStartError(reason)
            if spark_stopped(self._sc):
                raise ClusterStartError("the SparkContext stopped while the cluster was starting")
            time.sleep(0.1)
        failing = "".join(
            f"\nnode {i} could not start: {why}"
            for i, why in sorted(self._node_files(".start-error").items())
        )
        raise ClusterStartError(
            f"not every shard had a leader and all its replicas within {self.config.start_timeout_s:g} s "
            f"(spark.quorumstore.startTimeout); the node tasks log their start-up and bind "
            f"address in the executors' stderr.{failing}\n"
            + (str(self.status()) if started.done() else "no node reported to the coordinator")
        )

    def _planned_restore(self) -> LatestRestore | None:
        """The whole-cluster restore this start carries out: with an archive, when the
        coordinator has no metadata and the archive holds a cluster (a new application,
        the old one's disks gone), or the restore a start that failed had planned. The
        restored metadata is saved where the coordinator reads it, and the plan beside
        it until the cluster serves; each node rebuilds its replicas by the plan before
        it starts (`node_task`)."""
        if self.config.archive_url is None:
            return None
        metadata = MetadataStore(self.config.metadata_url)
        try:
            restore = load_pending(self.config.metadata_url)
        except ArchiveError as e:
            raise ClusterStartError(f"{e}; delete it") from None
        if restore is not None:
            log.warning("carrying on with the restore planned at an earlier start")
            if metadata.load() is None:
                metadata.save(restore.metadata)
            return restore
        archive = ArchiveStore(self.config.archive_url)
        if metadata.load() is not None or archived_metadata(archive) is None:
            return None
        restore = LatestRestore.plan(archive)
        strangers = sorted(placed_nodes(restore.metadata) - set(self.config.node_names))
        if strangers:
            raise ClusterStartError(
                f"the archive at {self.config.archive_url} holds a cluster whose shards are on "
                f"{', '.join(strangers)}, which this application has no node for (its nodes are "
                f"{', '.join(self.config.node_names)}): a Spark-hosted cluster restores only an "
                "archive of a Spark-hosted cluster with at least as many nodes; restore other "
                "archives with `quorumstore restore`, or set spark.quorumstore.nodes"
            )
        save_pending(self.config.metadata_url, restore)
        metadata.save(restore.metadata)
        log.warning(
            "no quorumstore metadata at %s: restoring the cluster archived at %s, at its last "
            "archived entries (%s)",
            self.config.metadata_url,
            self.config.archive_url,
            ", ".join(
                f"{n}/{i} at offset {shard.known_commit_offset}"
                for (n, i), shard in sorted(restore.metadata.shards.items())
            ),
        )
        return restore

    def _restore_done(self) -> None:
        """Forgets the restore plan once the restored cluster serves."""
        if self.config.archive_url is not None:
            forget_pending(self.config.metadata_url)

    def _placement_file(self) -> Path | None:
        """Where the hosts holding each node's data are kept between applications:
        beside the coordinator's metadata when that is a local file."""
        url = self.config.metadata_url
        if "://" in url and not url.startswith("file://"):
            return None
        return Path(url.removeprefix("file://")).parent / "placement.json"

    def _preferred_hosts(self) -> dict[int, str]:
        """Node index -> the host to run it on: the one holding its data, where it last
        registered from in this application or (from the placement file) the one
        before; for a node without one, an executor host no other node has, so that the
        replicas of a shard do not share a host (losing it would lose their majority)."""
        hosts: dict[int, str] = {}
        path = self._placement_file()
        if path is not None and path.is_file():
            try:
                saved = json.loads(path.read_text())
                hosts.update({int(i): str(h) for i, h in saved.get("hosts", {}).items()})
            except (OSError, ValueError, AttributeError) as e:
                log.warning("ignoring %s: %s", path, e)
        if self._coordinator.running:
            book = self._address_book()
            for i, name in enumerate(self.config.node_names):
                if name in book:
                    hosts[i] = host_of(book[name])
        live = executor_hosts(self._sc)
        if live:  # a host without an executor would hold up the others' placement
            hosts = {i: h for i, h in hosts.items() if h in live}
        spare = [h for h in live if h not in hosts.values()]
        for i in range(self.config.nodes):
            if i not in hosts and spare:
                hosts[i] = spare.pop(0)
        return hosts

    def _save_placement(self) -> None:
        path = self._placement_file()
        if path is None:
            return
        try:
            hosts = self._preferred_hosts()
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_durably(path, json.dumps({"hosts": hosts}).encode())
        except (OSError, RuntimeError, TimeoutError) as e:
            log.warning("could not save the nodes' hosts to %s: %s", path, e)

    def _publish_address(self) -> None:
        """Points the session's state store and DataFrame source at this cluster, unless
        the user pointed them elsewhere: ``spark.quorumstore.address``, as a session
        setting, reaches the queries started from now on."""
        conf = self._spark.conf
        current = conf.get(ADDRESS_CONF, None)
        if current is None or current in _published:
            _published.add(self.address)
            conf.set(ADDRESS_CONF, self.address)

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
    cluster_name: str | None = None,
    metadata_url: str | None = None,
    host: str | None = None,
    base_port: int | None = None,
    wal_sync: bool | None = None,
    kv_memory_bytes: int | None = None,
    start_timeout_s: float | None = None,
    failure_timeout_s: float | None = None,
    relay_timeout_s: float | None = None,
    archive_url: str | os.PathLike[str] | None = None,
    archive_sync: bool | None = None,
    log_level: str | None = None,
) -> HostedCluster:
    """Starts a quorumstore cluster inside this Spark application and waits until it serves.

    The coordinator runs in this (the driver's) process; each storage node runs in a
    long-running Spark task, in one barrier job (``placement="barrier"``) or one job
    per node (``"independent"``). The driver resubmits a node job that fails, and the
    nodes restart from their data directories. Arguments left as None come from the
    session's ``spark.quorumstore.*`` settings, then from the defaults in
    `HostingConfig` (3 nodes, 8 shards, replication factor 3, barrier placement, free
    ports on each executor's host, data in the executors' local directories, or in
    ./quorumstore-data on local masters).

    Parameters
    ----------
    spark : SparkSession
        A classic (not Spark Connect) session; needs one free task slot per node.
    nodes, shards, replication_factor : int, optional
        Cluster size, number of shards of the ``default`` namespace, replicas per shard.
    placement : str, optional
        ``"barrier"`` or ``"independent"``; see docs/running-on-spark.md.
    data_dir : path, optional
        Node ``i`` keeps its data in ``data_dir/node<i>`` on the host it runs on (a path
        that exists on every host); reused on restart.
    cluster_name : str, optional
        Without `data_dir`, names the directory under the executors' local directories
        that holds the nodes' data (default ``default``), so a restarted application
        finds it.
    metadata_url : str, optional
        Path or fsspec URL of the coordinator's metadata (default under `data_dir`, or
        ./quorumstore-data/coordinator/<cluster_name> on the driver).
    host, base_port : optional
        Fixed addresses, for one machine: every node binds `host`, node ``i`` serves
        clients on ``base_port+i``, the coordinator its status on ``base_port+nodes``
        and registrations on ``base_port+2*nodes+1``, and node ``i``'s internal port
        (node control and replication, members only) is ``base_port+nodes+1+i``.
        Unset, each node binds its executor's host on free ports.
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
    archive_url : str or path, optional
        Path or fsspec URL (``s3://bucket/prefix``, ...) of the cluster's archive: the
        nodes ship committed entries and snapshots there, the coordinator its metadata
        (docs/archive.md). A start that finds no coordinator metadata while the archive
        holds a cluster restores that cluster, at its last archived entries, onto the
        nodes' hosts. `stop` waits until every committed entry is archived.
    archive_sync : bool, optional
        Answer a write only once it is archived (default False): no acknowledged write
        is missing from the archive, at the cost of the upload's latency per write.
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
        cluster_name=cluster_name,
        metadata_url=metadata_url,
        host=host,
        base_port=base_port,
        wal_sync=wal_sync,
        kv_memory_bytes=kv_memory_bytes,
        start_timeout_s=start_timeout_s,
        failure_timeout_s=failure_timeout_s,
        relay_timeout_s=relay_timeout_s,
        archive_url=archive_url,
        archive_sync=archive_sync,
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
    coordinator = CoordinatorThread(coordinator_config(config, driver_host(sc, config), secret, ca))
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


def executor_hosts(sc: SparkContext) -> list[str]:
    """The distinct hosts of the application's executors, by the name Spark schedules
    by; none when they all share the driver's (local masters)."""
    if spark_stopped(sc):
        return []
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    driver = sc.getConf().get("spark.driver.host")
    hosts = sorted({info.host() for info in infos} - {driver})
    return hosts if len(hosts) > 1 else []


def driver_host(sc: SparkContext, config: HostingConfig) -> str:
    """Where the coordinator serves: the configured host, else loopback when every
    executor shares the driver's machine, else the driver's address as executors
    reach it (``spark.driver.host``)."""
    if config.host is not None:
        return config.host
    if local_master(sc.master or "local"):
        return "127.0.0.1"
    return sc.getConf().get("spark.driver.host") or socket.gethostbyname(socket.gethostname())


def coordinator_config(
    config: HostingConfig, host: str, secret: ClusterSecret, ca: CertificateAuthority
) -> CoordinatorServerConfig:
    """The settings of the coordinator a hosted cluster runs in the driver, on `host`:
    it knows the nodes by name and learns their addresses when they register."""
    return CoordinatorServerConfig(
        nodes=config.node_names,
        metadata_url=config.metadata_url,
        internal_addresses={},
        cluster_secret=secret,
        internal_tls=ca.internal_tls("coordinator"),
        tls=config.public_tls,
        namespaces={DEFAULT_NAMESPACE: config.shards},
        replication_factor=config.replication_factor,
        admin_host=host,
        admin_port=config.admin_port,
        failure_timeout_ms=config.failure_timeout_ms,
        archive_url=config.archive_url,
        registry_host=host,
        registry_port=config.registry_port,
        first_reports_wait_s=config.start_timeout_s,
    )


def _serving(status: pb.ClusterStatus) -> bool:
    """The coordinator reaches every node, and every replica of every shard follows its
    leader: a majority elects the leader and the last member joins a moment later, and
    ``start()`` returns only once the whole cluster is in place."""
    return all(status.nodes_alive.values()) and all_replicas_serving(status)
