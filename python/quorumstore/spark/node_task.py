"""Executor side of Spark hosting: the task body that runs one quorumstore storage node.

The driver (`quorumstore.spark.node_jobs`) runs `serve_partition` as the body of
long-running tasks, one task per node; the function pickles by reference, and executors
import it from the quorumstore installed in their Python environment (the package's
other modules are needed there anyway). Either placement:

* barrier: one barrier job whose tasks are all the nodes; after its node is up, each
  task exchanges its address through ``BarrierTaskContext.allGather``, which tells
  every task that all nodes were scheduled and checks they share one machine when
  they advertise a loopback address;
* independent: one single-task job per node.

A task never ends on its own. A failing node is restarted inside the task (stop,
back off, start again from its data directory) instead of failing the task, because
failing it costs far more: Spark kills every task of a barrier stage when one fails,
and only the driver's supervisor brings them back. The task ends when Spark kills it
(``cancelJobGroup`` on stop, or a failed sibling in barrier mode); a killed task runs
no ``finally`` blocks, which is safe because every acknowledged write is already in
the node's fsynced WAL.

Each task writes the pid of the Python worker running it to ``<data_dir>/node<i>.pid``,
so an operator (or a fault test) can find and kill -9 the process of one node.

Node ``i`` serves node control and replication on its internal port,
``internal_base_port + i``, and admits only calls with the cluster secret, which the
driver makes at start and hands over in the task spec (inside the job's closure).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorumstore import event_loops
from quorumstore.backoff import restart_backoff
from quorumstore.node.auth.check import AuthConfig
from quorumstore.node.data_format import DataFormatError
from quorumstore.node.limits import RequestLimits
from quorumstore.node.node import Node, NodeConfig
from quorumstore.spark.config import node_path
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.channels import probe_port
from quorumstore.wire.tls import TlsConfig

log = logging.getLogger("quorumstore.spark.node_task")


class NodeConfigError(RuntimeError):
    """A node cannot run where Spark placed it; restarting would not help, so the task fails."""


@dataclass(frozen=True)
class NodeTaskSpec:
    """What every node task needs to know; pickled into the job's closure by the driver."""

    host: str
    base_port: int
    internal_base_port: int
    cluster_secret: ClusterSecret
    #: Node i's certificate from the cluster's CA: the internal plane's mutual TLS.
    internal_tls: tuple[TlsConfig, ...]
    #: The client ports' TLS (None: plaintext) and auth config (None: open).
    tls: TlsConfig | None
    auth: dict[str, Any] | None
    data_dir: str
    wal_sync: bool
    kv_memory_bytes: int
    relay_timeout_ms: int
    limits: RequestLimits
    barrier: bool
    log_level: str

    def node_dir(self, index: int) -> Path:
        return node_path(self.data_dir, index)

    def pid_file(self, index: int) -> Path:
        return node_path(self.data_dir, index, ".pid")

    def start_error_file(self, index: int) -> Path:
        """Why the node's last start failed, while it is failing; read by the driver's
        start timeout on local masters, as the pid file is."""
        return node_path(self.data_dir, index, ".start-error")


def serve_partition(spec: NodeTaskSpec, indices: Iterable[int]) -> Iterator[str]:
    """``mapPartitions`` body: runs the node whose index is the partition's only element.

    Runs until Spark kills the task, so it never yields.
    """
    (index,) = list(indices)
    _configure_logging(spec.log_level)
    spec.pid_file(index).parent.mkdir(parents=True, exist_ok=True)
    spec.pid_file(index).write_text(f"{os.getpid()}\n")
    event_loops.run(_supervise(spec, index))
    return iter(())


async def _supervise(spec: NodeTaskSpec, index: int) -> None:
    node = await _start_until_up(spec, index)
    if spec.barrier:
        await asyncio.to_thread(_gather_addresses, spec, index, node.name)
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
    while True:
        node = Node(
            NodeConfig(
                spec.node_dir(index),
                host=spec.host,
                port=spec.base_port + index,
                internal_port=spec.internal_base_port + index,
                cluster_secret=spec.cluster_secret,
                internal_tls=spec.internal_tls[index],
                tls=spec.tls,
                auth=None if spec.auth is None else AuthConfig.parse(spec.auth),
                wal_sync=spec.wal_sync,
                kv_memory_bytes=spec.kv_memory_bytes,
                relay_timeout_ms=spec.relay_timeout_ms,
                limits=spec.limits,
            )
        )
        try:
            _check_port_free(spec, index, spec.base_port + index)
            _check_port_free(spec, index, spec.internal_base_port + index)
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
        log.info(
            "node %d serving on %s (pid %d, data in %s)",
            index,
            address,
            os.getpid(),
            spec.node_dir(index),
        )
        return node


def _check_port_free(spec: NodeTaskSpec, index: int, port: int) -> None:
    """Refuses to start while anything listens on one of the node's ports.

    The node's own bind would fail then too (it binds without SO_REUSEPORT); probing
    first tells the causes apart: an address this machine does not own is a
    configuration error, which retrying cannot fix, while a port in use (an earlier
    incarnation that Spark has not finished killing) is retried.
    """
    try:
        probe_port(spec.host, port)
    except OSError as e:
        if e.errno == errno.EADDRNOTAVAIL:
            raise NodeConfigError(
                f"node {index} runs on {socket.gethostname()}, which does not own the address "
                f"{spec.host}; every storage node must run on the machine spark.quorumstore.host names"
            ) from None
        if e.errno == errno.EADDRINUSE:
            raise OSError(
                e.errno,
                f"port {port} is in use (an earlier incarnation of node {index} still exiting, or another program)",
            ) from None
        raise


def _gather_addresses(spec: NodeTaskSpec, index: int, address: str) -> None:
    """Barrier placement: waits until every node task is up and checks where they run."""
    from pyspark import BarrierTaskContext

    me = json.dumps({"address": address, "machine": socket.gethostname(), "pid": os.getpid()})
    peers = [json.loads(m) for m in BarrierTaskContext.get().allGather(me)]
    machines = sorted({p["machine"] for p in peers})
    if len(machines) > 1 and ipaddress.ip_address(socket.gethostbyname(spec.host)).is_loopback:
        raise NodeConfigError(
            f"storage nodes run on {len(machines)} machines ({', '.join(machines)}) but advertise the "
            f"loopback address {spec.host}; hosting needs every executor on one machine"
        )
    if index == 0:
        log.info(
            "all %d nodes up: %s",
            len(peers),
            ", ".join(f"{p['address']} (pid {p['pid']})" for p in peers),
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
