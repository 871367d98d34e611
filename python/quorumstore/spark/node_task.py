"""Executor side of Spark hosting: the task body that runs one quorumstore storage node.

The driver (`quorumstore.spark.node_jobs`) runs `serve_partition` as the body of
long-running tasks, one task per node; the function pickles by reference, and executors
import it from the quorumstore installed in their Python environment (the package's
other modules are needed there anyway). Either placement:

* barrier: one barrier job whose tasks are all the nodes; after its node is up, each
  task exchanges its address through ``BarrierTaskContext.allGather``, which tells
  every task that all nodes were scheduled and checks that nodes on several machines
  do not advertise a loopback address;
* independent: one single-task job per node.

Node ``i`` is the member ``node<i>`` wherever it runs. It binds the address of its
host that routes to the coordinator (or the configured host), on free ports (or fixed
ones), and registers its addresses with the coordinator in the driver
(`quorumstore.node.registration`). Its data lives on its host: under the configured
data directory, else under the executor's local directories, in
``quorumstore/<cluster name>/node<i>``.

A task never ends on its own. A failing node is restarted inside the task (stop,
back off, start again from its data directory) instead of failing the task, because
failing it costs far more: Spark kills every task of a barrier stage when one fails,
and only the driver's supervisor brings them back. The task ends when Spark kills it
(``cancelJobGroup`` on stop, or a failed sibling in barrier mode); a killed task runs
no ``finally`` blocks, which is safe because every acknowledged write is already in
the node's fsynced WAL.

Each task writes the pid of the Python worker running it to ``node<i>.pid`` beside the
node's data directory, so an operator (or a fault test) can find and kill -9 the
process of one node.

Node ``i`` serves node control and replication on its internal port and admits only
members: mutual TLS with the certificate the driver made for it, and the cluster
secret, both handed over in the task spec (inside the job's closure).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quorumstore import event_loops
from quorumstore.archive.restore import LatestRestore
from quorumstore.archive.shipper import ArchiveSettings
from quorumstore.backoff import restart_backoff
from quorumstore.node.auth.check import AuthConfig
from quorumstore.node.data_format import DataFormatError
from quorumstore.node.limits import RequestLimits
from quorumstore.node.node import Node, NodeConfig
from quorumstore.spark.config import node_path
from quorumstore.wire.addresses import host_of
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.channels import probe_port
from quorumstore.wire.tls import TlsConfig

log = logging.getLogger("quorumstore.spark.node_task")


class NodeConfigError(RuntimeError):
    """A node cannot run where Spark placed it; restarting would not help, so the task fails."""


@dataclass(frozen=True)
class NodeTaskSpec:
    """What every node task needs to know; pickled into the job's closure by the driver."""

    #: The address every node binds; None: the one of its host that routes to `coordinator`.
    host: str | None
    #: Node i's client and internal ports (0: a free one).
    client_ports: tuple[int, ...]
    internal_ports: tuple[int, ...]
    #: The coordinator's registry, where each node says where it is.
    coordinator: str
    cluster_secret: ClusterSecret
    #: Node i's certificate from the cluster's CA: the internal plane's mutual TLS.
    internal_tls: tuple[TlsConfig, ...]
    #: The client ports' TLS (None: plaintext) and auth config (None: open).
    tls: TlsConfig | None
    auth: dict[str, Any] | None
    #: Where nodes keep their data on every host; None: the executors' local directories.
    data_dir: str | None
    cluster_name: str
    wal_sync: bool
    kv_memory_bytes: int
    relay_timeout_ms: int
    limits: RequestLimits
    barrier: bool
    log_level: str
    #: Where the nodes archive (None: nowhere), and how.
    archive_url: str | None = None
    archive: ArchiveSettings = field(default_factory=ArchiveSettings)
    #: The restore the driver planned (the coordinator had no metadata and the archive
    #: holds a cluster): each node rebuilds its replicas by it before it starts.
    restore: LatestRestore | None = None

    def data_root(self) -> Path:
        """The directory of this host that holds the cluster's node directories."""
        if self.data_dir is not None:
            return Path(self.data_dir)
        return executor_local_dir() / "quorumstore" / self.cluster_name

    def node_dir(self, index: int) -> Path:
        return node_path(self.data_root(), index)

    def bind_host(self) -> str:
        """The address node tasks on this host bind and advertise."""
        if self.host is not None:
            return self.host
        return routed_address(host_of(self.coordinator))

    def pid_file(self, index: int) -> Path:
        return node_path(self.data_root(), index, ".pid")

    def ports_file(self, index: int) -> Path:
        """The ports node `index` last served on, on this host (see `_ports`)."""
        return node_path(self.data_root(), index, ".ports")

    def start_error_file(self, index: int) -> Path:
        """Why the node's last start failed, while it is failing; read by the driver's
        start timeout on local masters, as the pid file is."""
        return node_path(self.data_root(), index, ".start-error")


def serve_partition(spec: NodeTaskSpec, indices: Iterable[int]) -> Iterator[str]:
    """``mapPartitions`` body: runs the node whose index is the partition's only element.

    Runs until Spark kills the task, so it never yields.
    """
    (index,) = list(indices)
    _configure_logging(spec.log_level)
    log.warning(
        "quorumstore node %d starting on %s (pid %d): binds %s, data in %s, coordinator at %s",
        index,
        socket.gethostname(),
        os.getpid(),
        spec.bind_host(),
        spec.node_dir(index),
        spec.coordinator,
    )
    spec.pid_file(index).parent.mkdir(parents=True, exist_ok=True)
    spec.pid_file(index).write_text(f"{os.getpid()}\n")
    event_loops.run(_supervise(spec, index))
    return iter(())


async def _supervise(spec: NodeTaskSpec, index: int) -> None:
    if spec.restore is not None:
        await asyncio.to_thread(_restore, spec.restore, index, spec.node_dir(index))
    node = await _start_until_up(spec, index)
    if spec.barrier:
        await asyncio.to_thread(_gather_addresses, index, node.address)
    backoff = restart_backoff()
    while True:
        started = time.monotonic()
        try:
            await node.wait()
            failure = "its gRPC server stopped"
        except Exception as e:  # noqa: BLE001 - any failure of the node restarts it
            failure = f"{type(e).__name__}: {e}"
        delay = backoff.delay_after(time.monotonic() - started)
        log.warning(
            "node %d (%s) failed: %s; restarting it from %s in %.1f s",
            index,
            node.name,
            failure,
            spec.node_dir(index),
            delay,
        )
        await _stop_quietly(node)
        await asyncio.sleep(delay)
        node = await _start_until_up(spec, index)


async def _start_until_up(spec: NodeTaskSpec, index: int) -> Node:
    """Starts node `index`, retrying with backoff until it serves; returns it."""
    backoff = restart_backoff()
    host = spec.bind_host()
    while True:
        client_port, internal_port = _ports(spec, index, host)
        node = Node(
            NodeConfig(
                spec.node_dir(index),
                host=host,
                port=client_port,
                internal_port=internal_port,
                name=f"node{index}",
                coordinator=spec.coordinator,
                cluster_secret=spec.cluster_secret,
                internal_tls=spec.internal_tls[index],
                tls=spec.tls,
                auth=None if spec.auth is None else AuthConfig.parse(spec.auth),
                wal_sync=spec.wal_sync,
                kv_memory_bytes=spec.kv_memory_bytes,
                relay_timeout_ms=spec.relay_timeout_ms,
                limits=spec.limits,
                archive_url=spec.archive_url,
                archive=spec.archive,
            )
        )
        try:
            _check_port_free(host, index, client_port)
            _check_port_free(host, index, internal_port)
            address = await node.start()
        except (NodeConfigError, DataFormatError):
            raise
        except Exception as e:  # noqa: BLE001 - a node that cannot start is retried, not fatal
            delay = backoff.delay_after()
            log.warning(
                "node %d could not start (%s: %s); retrying in %.1f s",
                index,
                type(e).__name__,
                e,
                delay,
            )
            spec.start_error_file(index).write_text(f"{type(e).__name__}: {e}\n")
            await _stop_quietly(node)
            await asyncio.sleep(delay)
            continue
        spec.start_error_file(index).unlink(missing_ok=True)
        _remember_ports(spec, index, host, node)
        log.warning(
            "quorumstore node %d serving on %s (pid %d, data in %s)",
            index,
            address,
            os.getpid(),
            spec.node_dir(index),
        )
        return node


def _restore(restore: LatestRestore, index: int, node_dir: Path) -> None:
    """Rebuilds node `index`'s replicas from the archive, once: a task restarted after
    the restore finds the directory marked as its work and keeps it. Data the directory
    held before (of the cluster whose metadata is gone) is moved aside, not deleted."""
    if restore.rebuilt(node_dir):
        return
    if (node_dir / "shards").exists():
        aside = node_dir.with_name(
            f"{node_dir.name}.before-restore-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        log.warning(
            "node %d: the cluster is restored from its archive; the data in %s is moved to %s",
            index,
            node_dir,
            aside,
        )
        os.replace(node_dir, aside)
    elif node_dir.exists():
        shutil.rmtree(node_dir)  # no replica: a format marker at most
    log.warning(
        "node %d: restoring its replicas from the archive at %s", index, restore.archive_url
    )
    restore.rebuild_member(
        f"node{index}", node_dir, progress=lambda line: log.warning("node %d: %s", index, line)
    )


def _ports(spec: NodeTaskSpec, index: int, host: str) -> tuple[int, int]:
    """The node's client and internal ports: the configured ones; else the ones it had
    on this host before, while they are free, so that clients holding its old address
    (a state store provider's bootstrap list) still find it after a restart; else 0."""
    fixed = spec.client_ports[index], spec.internal_ports[index]
    if fixed != (0, 0):
        return fixed
    try:
        last = json.loads(spec.ports_file(index).read_text())
        ports = int(last["client"]), int(last["internal"])
        if last["host"] != host:
            return 0, 0
        for port in ports:
            probe_port(host, port)
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0
    return ports


def _remember_ports(spec: NodeTaskSpec, index: int, host: str, node: Node) -> None:
    ports = {
        "host": host,
        "client": int(node.address.rpartition(":")[2]),
        "internal": int(node.internal_address.rpartition(":")[2]),
    }
    try:
        spec.ports_file(index).write_text(json.dumps(ports))
    except OSError as e:
        log.warning(
            "node %d: cannot remember its ports in %s: %s", index, spec.ports_file(index), e
        )


def _check_port_free(host: str, index: int, port: int) -> None:
    """Refuses to start while anything listens on one of the node's fixed ports.

    The node's own bind would fail then too (it binds without SO_REUSEPORT); probing
    first tells the causes apart: an address this machine does not own is a
    configuration error, which retrying cannot fix, while a port in use (an earlier
    incarnation that Spark has not finished killing) is retried.
    """
    try:
        probe_port(host, port)
    except OSError as e:
        if e.errno == errno.EADDRNOTAVAIL:
            raise NodeConfigError(
                f"node {index} runs on {socket.gethostname()}, which does not own the address "
                f"{host} (spark.quorumstore.host); leave that setting unset on a cluster of "
                "several hosts, so that each node binds its own host's address"
            ) from None
        if e.errno == errno.EADDRINUSE:
            raise OSError(
                e.errno,
                f"port {port} is in use (an earlier incarnation of node {index} still exiting, or another program)",
            ) from None
        raise


def routed_address(destination: str) -> str:
    """This host's address on the route to `destination`: the one the coordinator
    there can reach it at. A connected UDP socket sends nothing; the kernel picks the
    source address of the route when it connects."""
    family = socket.AF_INET6 if ":" in destination else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((destination, 9))
        return str(probe.getsockname()[0])


#: The names Spark gives its per-application directories under a local directory.
_SPARK_APP_DIR = re.compile(r"(spark|executor|blockmgr)-[0-9a-f-]{8,}")


def executor_local_dir() -> Path:
    """The first local directory configured for this host's executors, which outlives
    the application: Spark hands its Python workers only the per-application
    directories under it (``<dir>/spark-<id>/executor-<id>/blockmgr-<id>``, deleted
    when the application ends), so the names Spark gives those are stripped. Without
    any (YARN's per-application LOCAL_DIRS aside), the system's temporary directory."""
    for variable in ("SPARK_EXECUTOR_DIRS", "SPARK_LOCAL_DIRS", "LOCAL_DIRS"):
        separator = os.pathsep if variable == "SPARK_EXECUTOR_DIRS" else ","
        dirs = [d.strip() for d in os.environ.get(variable, "").split(separator) if d.strip()]
        if dirs:
            path = Path(dirs[0])
            while _SPARK_APP_DIR.fullmatch(path.name) and path.parent != path:
                path = path.parent
            return path
    return Path(tempfile.gettempdir())


def _gather_addresses(index: int, address: str) -> None:
    """Barrier placement: waits until every node task is up and checks where they run."""
    from pyspark import BarrierTaskContext

    me = json.dumps({"address": address, "machine": socket.gethostname(), "pid": os.getpid()})
    peers = [json.loads(m) for m in BarrierTaskContext.get().allGather(me)]
    machines = sorted({p["machine"] for p in peers})
    hosts = {host_of(p["address"]) for p in peers}
    loopback = [h for h in hosts if ipaddress.ip_address(socket.gethostbyname(h)).is_loopback]
    if len(machines) > 1 and loopback:
        raise NodeConfigError(
            f"storage nodes run on {len(machines)} machines ({', '.join(machines)}) but some "
            f"advertise a loopback address ({', '.join(sorted(hosts))}); leave "
            "spark.quorumstore.host unset so that each node binds its own host's address"
        )
    if index == 0:
        log.warning(
            "all %d quorumstore nodes up: %s",
            len(peers),
            ", ".join(f"{p['address']} on {p['machine']} (pid {p['pid']})" for p in peers),
        )


async def _stop_quietly(node: Node) -> None:
    try:
        await node.stop()
    except Exception as e:  # noqa: BLE001 - a broken node is being replaced anyway
        log.warning("stopping node %s failed: %s", node.name or "(not started)", e)


def _configure_logging(level: str) -> None:
    """Node logs go to the worker's stderr (the executor log; the console in local mode)."""
    root = logging.getLogger("quorumstore")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level.upper())
