"""The `quorumstore` command: run a standalone server, a local cluster, or ask for status.

    quorumstore standalone --shards 4
    quorumstore cluster --nodes 3 --shards 8 --replication-factor 3 --data-dir ./qs
    quorumstore status --coordinator 127.0.0.1:6651

`node` and `coordinator` run the two halves on their own (what `cluster` starts).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from quorumstore import event_loops
from quorumstore.addresses import host_port
from quorumstore.backoff import restart_backoff
from quorumstore.coordinator.failure_timeout import (
    DEFAULT_FAILURE_TIMEOUT_MS,
    check_failure_timeout,
)
from quorumstore.coordinator.metadata_store import MetadataError, MetadataStore
from quorumstore.node.data_format import DataFormatError
from quorumstore.node.failures import ReplicaFailure
from quorumstore.storage.wal import WalError

if TYPE_CHECKING:
    from quorumstore.coordinator.server import CoordinatorServer
    from quorumstore.node.node import Node, NodeConfig
    from quorumstore.node.shard_host import WalRetention

DEFAULT_CLIENT_PORT = 6648

log = logging.getLogger(__name__)


class CliError(Exception):
    """A problem to report in one line (bad flag values, unreachable addresses)."""


# ------------------------------------------------------------------ helpers


def _whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= `minimum`."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {number}")
        return number

    return parse


_positive = _whole_number(1)
_non_negative = _whole_number(0)


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return number


def _port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port must be within 0-65535, got {number}")
    return number


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {value!r}")
    return value


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve_until_signal(node: Node) -> None:
    """Returns on SIGINT or SIGTERM; raises the node's ReplicaFailure if a shard fails first."""
    signalled = asyncio.ensure_future(_wait_for_signal())
    failed = asyncio.ensure_future(node.wait())
    done, pending = await asyncio.wait([signalled, failed], return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if failed in done:
        failed.result()


async def _wait_until_online(coordinator: CoordinatorServer, timeout_s: float) -> int:
    """Waits until every shard has a leader; returns how many shards there are."""
    from quorumstore.protocol.coordinator import ShardState

    assert coordinator.engine is not None, "the coordinator is not started"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = coordinator.engine.metadata
        if all(m.state is ShardState.ONLINE for m in meta.shards.values()):
            return len(meta.shards)
        await asyncio.sleep(0.05)
    raise CliError(f"shards did not all elect a leader within {timeout_s:.0f} s; see the log above")


def _check_layout(data_dir: Path, mine: str, other: str, other_command: str) -> None:
    """`standalone` keeps its node in D/node, `cluster` in D/node0, D/node1, ...: started on
    the other's directory, a command would find its node's directory empty and serve an
    empty store next to the data it was meant to serve."""
    if (data_dir / other).is_dir() and not (data_dir / mine).exists():
        raise CliError(
            f"{data_dir} holds the data of `quorumstore {other_command}` ({data_dir / other}); "
            f"start it with `quorumstore {other_command}`, or give another --data-dir"
        )


def _advertise_host(args: argparse.Namespace) -> str | None:
    """The host in the node's address, which other nodes and clients dial."""
    if args.advertise_host:
        return str(args.advertise_host)
    if args.host in ("0.0.0.0", "::", ""):
        raise CliError(
            f"--host {args.host!r} listens on every interface, so it is no address to "
            "dial; add --advertise-host with the name or address other machines reach this one by"
        )
    return None


def _node_config(args: argparse.Namespace, data_dir: Path) -> NodeConfig:
    """The node of `standalone` or `node`, from their shared flags."""
    from quorumstore.node.node import NodeConfig

    return NodeConfig(
        data_dir,
        host=args.host,
        port=args.port,
        advertise_host=_advertise_host(args),
        wal_sync=not args.no_fsync,
        wal_retention=_retention(args),
        kv_memory_bytes=args.kv_memory,
    )


def _retention(args: argparse.Namespace) -> WalRetention:
    from quorumstore.node.shard_host import WalRetention

    return WalRetention(
        keep_entries=args.wal_keep_entries,
        keep_bytes=args.wal_keep_bytes,
        check_interval_s=args.wal_trim_interval,
        segment_bytes=args.wal_segment_bytes,
    )


def _storage_flags(args: argparse.Namespace) -> list[str]:
    """The storage flags of `cluster` (WAL retention, KV memory), passed on to its nodes."""
    return [
        "--wal-keep-entries",
        str(args.wal_keep_entries),
        "--wal-keep-bytes",
        str(args.wal_keep_bytes),
        "--wal-trim-interval",
        str(args.wal_trim_interval),
        "--wal-segment-bytes",
        str(args.wal_segment_bytes),
        "--kv-memory",
        str(args.kv_memory),
    ]


def _add_storage_flags(p: argparse.ArgumentParser) -> None:
    from quorumstore.node.shard_host import WalRetention
    from quorumstore.storage.kv import DEFAULT_KV_MEMORY_BYTES

    defaults = WalRetention()
    p.add_argument(
        "--wal-keep-entries",
        type=_non_negative,
        default=defaults.keep_entries,
        help=f"WAL entries kept below the applied offset for lagging followers (default {defaults.keep_entries})",
    )
    p.add_argument(
        "--wal-keep-bytes",
        type=_non_negative,
        default=defaults.keep_bytes,
        help=f"at most this many bytes of those entries are kept (default {defaults.keep_bytes})",
    )
    p.add_argument(
        "--wal-trim-interval",
        type=_positive_float,
        default=defaults.check_interval_s,
        help=f"seconds between WAL trims (default {defaults.check_interval_s:g})",
    )
    p.add_argument(
        "--wal-segment-bytes",
        type=_positive,
        default=defaults.segment_bytes,
        help=f"WAL segment size, the unit of trimming (default {defaults.segment_bytes})",
    )
    p.add_argument(
        "--kv-memory",
        type=_positive,
        default=DEFAULT_KV_MEMORY_BYTES,
        help="bytes of block cache and memtables that all of a node's shard stores share "
        f"(default {DEFAULT_KV_MEMORY_BYTES})",
    )


def _failure_timeout(value: str) -> int:
    milliseconds = _positive(value)
    try:
        check_failure_timeout(milliseconds)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return milliseconds


def _add_failure_timeout_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--failure-timeout-ms",
        type=_failure_timeout,
        default=DEFAULT_FAILURE_TIMEOUT_MS,
        help="a node silent this long is taken for failed and its shards get new leaders: "
        "raise it to ride out stalls, lower it to fail over sooner "
        f"(default {DEFAULT_FAILURE_TIMEOUT_MS})",
    )


# ------------------------------------------------------------------ commands


def _adopt_standalone_shards(metadata_url: str, address: str) -> None:
    """A standalone server's node is its data directory, not its port: restarted on
    another port (`--port 0` picks a new one each time), it takes over the shards that
    the directory's metadata placed on the old address."""
    from quorumstore.protocol.coordinator import placed_nodes, replace_node

    store = MetadataStore(metadata_url)
    metadata = store.load()
    if metadata is None:
        return
    placed = placed_nodes(metadata)
    if placed == {address}:
        return
    if len(placed) != 1:
        raise CliError(
            f"{metadata_url} describes a cluster of {len(placed)} nodes ({', '.join(sorted(placed))}), "
            "not a standalone server; run it with `quorumstore cluster` or give standalone another --data-dir"
        )
    (old,) = placed
    store.save(replace_node(metadata, old, address))
    log.info("standalone data from %s now served at %s", old, address)


async def _run_standalone(args: argparse.Namespace) -> None:
    from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
    from quorumstore.node.node import Node

    data_dir = Path(args.data_dir).resolve()
    _check_layout(data_dir, mine="node", other="node0", other_command="cluster")
    node = Node(_node_config(args, data_dir / "node"))
    address = await node.start()
    coordinator: CoordinatorServer | None = None
    try:
        metadata_url = str(data_dir / "coordinator" / "metadata.pb")
        await asyncio.get_running_loop().run_in_executor(
            None, _adopt_standalone_shards, metadata_url, address
        )
        coordinator = CoordinatorServer(
            CoordinatorServerConfig(
                nodes=[address],
                metadata_url=metadata_url,
                namespaces={"default": args.shards},
                replication_factor=1,
                admin_host=args.host,
                admin_port=args.admin_port,
            )
        )
        await coordinator.start()
        shards = await _wait_until_online(coordinator, 30)
        print(f"quorumstore standalone listening on {address}", flush=True)
        print(
            f"  shards: {shards}, data: {data_dir}, status: quorumstore status --coordinator {coordinator.admin_address}",
            flush=True,
        )
        await _serve_until_signal(node)
    finally:
        if coordinator is not None:
            await coordinator.stop()
        await node.stop()


async def _run_node(args: argparse.Namespace) -> None:
    from quorumstore.node.node import Node

    node = Node(_node_config(args, Path(args.data_dir).resolve()))
    address = await node.start()
    print(f"quorumstore node listening on {address}", flush=True)
    try:
        await _serve_until_signal(node)
    finally:
        await node.stop()


async def _run_coordinator(args: argparse.Namespace) -> None:
    from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig

    if args.replication_factor > len(args.nodes):
        raise CliError(
            f"--replication-factor {args.replication_factor} needs at least that many --nodes, got {len(args.nodes)}"
        )
    coordinator = CoordinatorServer(
        CoordinatorServerConfig(
            nodes=args.nodes,
            metadata_url=args.metadata,
            namespaces={"default": args.shards},
            replication_factor=args.replication_factor,
            admin_host=args.host,
            admin_port=args.admin_port,
            failure_timeout_ms=args.failure_timeout_ms,
        )
    )
    await coordinator.start()
    print(f"quorumstore coordinator admin on {coordinator.admin_address}", flush=True)
    try:
        await _wait_for_signal()
    finally:
        await coordinator.stop()


#: Set in the environment of a `cluster` child: the pid of the `cluster` that owns it.
_CLUSTER_PID_ENV = "QUORUMSTORE_CLUSTER_PID"
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _follow_cluster_parent() -> None:
    """In a `cluster` child, first thing: take the stop signals (a child restarted while
    `cluster` blocks them inherits the block) and get SIGTERM when the `cluster` process
    dies, however it dies (kill -9 included), so no node outlives the command that owns
    it. Done here rather than between fork and exec, which is unsafe once `cluster` runs
    gRPC's threads."""
    owner = os.environ.pop(_CLUSTER_PID_ENV, None)
    if owner is None:
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(owner):  # `cluster` died before the line above took effect
        sys.exit(f"quorumstore: `quorumstore cluster` (pid {owner}) is gone; not starting")


def _spawn(argv: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    # The child gets its own copy of the descriptor; ours is closed once it is spawned.
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "quorumstore.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, _CLUSTER_PID_ENV: str(os.getpid())},
        )


def _check_port_free(host: str, port: int, what: str) -> None:
    from quorumstore.node.transport import probe_port

    try:
        probe_port(host, port)
    except OSError as e:
        raise CliError(
            f"cannot listen on {host_port(host, port)} for {what}: {e.strerror}; is another cluster "
            "still running there? Stop it or pick another --base-port"
        ) from None


def _log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a child's log, to say why it stopped."""
    try:
        with open(path, errors="replace") as log_file:  # logs append across runs: stream it
            tail = deque((line for line in log_file if line.strip()), maxlen=lines)
    except OSError:
        return ""
    return "\n".join("    " + line.rstrip() for line in tail)


class _Stop(Exception):
    """SIGTERM or SIGHUP reached `cluster` while it was starting its children."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def _run_cluster(args: argparse.Namespace) -> None:
    if args.replication_factor > args.nodes:
        raise CliError(
            f"--replication-factor {args.replication_factor} needs at least that many --nodes, got {args.nodes}"
        )
    if args.base_port + args.nodes > 65535:
        raise CliError(
            f"--base-port {args.base_port} leaves no room for {args.nodes} nodes and the "
            f"coordinator (ports up to {args.base_port + args.nodes}); use at most {65535 - args.nodes}"
        )
    data_dir = Path(args.data_dir).resolve()
    _check_layout(data_dir, mine="node0", other="node", other_command="standalone")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot use {data_dir} as the data directory: {e.strerror}") from None
    nodes = [host_port(args.host, args.base_port + i) for i in range(args.nodes)]
    admin = host_port(args.host, args.base_port + args.nodes)
    for i in range(args.nodes):
        _check_port_free(args.host, args.base_port + i, f"node {i}")
    _check_port_free(args.host, args.base_port + args.nodes, "the coordinator's status port")
    fsync = ["--no-fsync"] if args.no_fsync else []
    fsync += _storage_flags(args)
    commands = [
        (
            ["node", "--host", args.host, "--port", str(args.base_port + i),
             "--data-dir", str(data_dir / f"node{i}"), *fsync],
            data_dir / f"node{i}.log",
        )
        for i in range(args.nodes)
    ]  # fmt: skip
    commands.append(
        (
            ["coordinator", "--nodes", ",".join(nodes), "--shards", str(args.shards),
             "--replication-factor", str(args.replication_factor),
             "--metadata", str(data_dir / "coordinator" / "metadata.pb"),
             "--host", args.host, "--admin-port", str(args.base_port + args.nodes),
             "--failure-timeout-ms", str(args.failure_timeout_ms)],
            data_dir / "coordinator.log",
        )
    )  # fmt: skip
    children: list[_Child] = []
    # Closing the terminal (SIGHUP) or SIGTERM must stop the children as Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    try:
        for argv, log_file in commands:
            children.append(_Child(argv, log_file))
        status = _wait_for_cluster(admin, children, timeout_s=60)
        shards = len(status.metadata.shards)  # type: ignore[attr-defined]
        print(
            f"quorumstore cluster: {args.nodes} nodes, {shards} shards, replication factor {args.replication_factor}",
            flush=True,
        )
        if shards != args.shards:
            print(
                f"  (the data directory holds {shards} shards; shard counts are fixed when it is created)",
                flush=True,
            )
        print(f"client address: {nodes[0]}   (all nodes: {', '.join(nodes)})", flush=True)
        print(f"coordinator:    {admin}   (quorumstore status --coordinator {admin})", flush=True)
        print(f"data and logs:  {data_dir}", flush=True)
        print(_format_status(status), flush=True)
        print("Ctrl-C stops the cluster.", flush=True)
        # Signals wait for _watch_children from here on, so none lands mid-restart.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        _watch_children(children)
    except _Stop:
        pass
    finally:
        for child in children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.process.kill()
        print("cluster stopped", flush=True)


class _Child:
    """One process of a `cluster`: a node or the coordinator, restarted when it stops."""

    def __init__(self, argv: list[str], log_file: Path) -> None:
        self.argv = argv
        self.log_file = log_file
        self.process = _spawn(argv, log_file)
        self.started = time.monotonic()
        self.backoff = restart_backoff()
        #: When the stopped process starts again; None while it runs.
        self.restart_at: float | None = None

    @property
    def name(self) -> str:
        return self.log_file.stem

    def check(self, now: float) -> None:
        """Says why the process stopped and when it restarts, or restarts it when due."""
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.process = _spawn(self.argv, self.log_file)
                self.started, self.restart_at = now, None
                print(f"{self.name} restarted (pid {self.process.pid})", flush=True)
            return
        code = self.process.poll()
        if code is None:
            return
        delay = self.backoff.delay_after(now - self.started)
        self.restart_at = now + delay
        how = f"exit status {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
        print(
            f"{self.name} exited ({how}); the end of {self.log_file}:\n{_log_tail(self.log_file)}\n"
            f"  restarting it in {delay:.1f} s from its data directory; the other processes go on",
            flush=True,
        )


def _watch_children(children: list[_Child]) -> None:
    """Until a stop signal (blocked by the caller): restarts each child that stops, after
    a wait that grows while it keeps failing. Meanwhile the cluster serves without it,
    as it does with any node down."""
    while signal.sigtimedwait(_STOP_SIGNALS, 0.2) is None:
        now = time.monotonic()
        for child in children:
            child.check(now)


def _check_children(children: list[_Child]) -> None:
    for child in children:
        if child.process.poll() is not None:
            raise CliError(
                f"a cluster process exited early ({' '.join(child.argv)}); the end of "
                f"{child.log_file}:\n" + _log_tail(child.log_file)
            )


def _wait_for_cluster(admin: str, children: list[_Child], timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while time.monotonic() < deadline:
        _check_children(children)
        try:
            status = _fetch_status(admin, timeout=1)
            if all_replicas_serving(status):
                return status
        except CliError as e:
            last_error = str(e)
        time.sleep(0.2)
    raise CliError(
        f"the cluster did not come online within {timeout_s:.0f} s ({last_error or 'shards still electing'})"
    )


def all_replicas_serving(status: object) -> bool:
    """Every shard has a leader and every replica follows it in the leader's term.

    ONLINE alone is not enough to hand out the client address: a replica still fenced
    in the new term does not know the leader yet, so its node answers clients (or relays
    for them) with "not leader" until the leader's first Append reaches it.
    """
    from quorumstore.proto import replication_pb2 as pb

    shards = {(m.namespace, m.shard): m for m in status.metadata.shards}  # type: ignore[attr-defined]
    if not shards or any(m.status != pb.ONLINE for m in shards.values()):
        return False
    serving = {
        (r.namespace, r.shard, r.node)
        for r in status.replicas  # type: ignore[attr-defined]
        if r.role in (pb.LEADER, pb.FOLLOWER)
        and (r.namespace, r.shard) in shards
        and r.term == shards[(r.namespace, r.shard)].term
    }
    return all(
        (m.namespace, m.shard, node) in serving for m in shards.values() for node in m.ensemble
    )


def _fetch_status(address: str, timeout: float = 5) -> object:
    from quorumstore.proto import replication_pb2 as pb
    from quorumstore.proto import replication_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            return pb_grpc.CoordinatorAdminStub(channel).GetClusterStatus(
                pb.Empty(), timeout=timeout
            )
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise CliError(
                    f"{address} answers gRPC but is no coordinator's status port (a node's "
                    "client port?); `quorumstore cluster` and `standalone` print the status port"
                ) from None
            raise CliError(
                f"cannot reach the coordinator at {address}: {e.code().name.lower()} ({e.details()})"
            ) from None


def _format_status(status: object) -> str:
    from quorumstore.proto import replication_pb2 as pb

    state_names = {pb.ELECTION: "election", pb.ONLINE: "online", pb.OFFLINE: "OFFLINE"}
    # Keyed by node too: a leader that went down leaves its last report behind, and the
    # shard's current leader must not be hidden behind it.
    leaders = {
        (r.namespace, r.shard, r.node, r.term): r
        for r in status.replicas  # type: ignore[attr-defined]
        if r.role == pb.LEADER
    }
    alive = status.nodes_alive  # type: ignore[attr-defined]
    rows = [("shard", "state", "term", "leader", "head", "commit", "followers (lag)", "eligible")]
    for m in status.metadata.shards:  # type: ignore[attr-defined]
        report = leaders.get((m.namespace, m.shard, m.leader, m.term))
        if report is not None:
            head, commit = str(report.head.offset), str(report.commit_offset)
            # A follower that is down keeps its last acked offset: say so beside its lag.
            followers = (
                ", ".join(
                    f"{f.name} ({max(0, report.commit_offset - f.acked_offset)}"
                    f"{'' if alive.get(f.name, True) else ', down'})"
                    for f in report.followers
                )
                or "-"
            )
        else:
            head, commit, followers = "?", "?", "-"
        rows.append(
            (
                f"{m.namespace}/{m.shard}",
                state_names[m.status],
                str(m.term),
                m.leader or "-",
                head,
                commit,
                followers,
                ", ".join(m.eligible) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    down = [n for n, up in sorted(alive.items()) if not up]
    if down:
        lines.append(f"unreachable nodes: {', '.join(down)}")
    return "\n".join(lines)


format_status = _format_status  # public name: quorumstore.spark's status() prints the same table


def _run_status(args: argparse.Namespace) -> None:
    print(_format_status(_fetch_status(args.coordinator)))


# ------------------------------------------------------------------ parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quorumstore", description="A quorum-replicated KV store with Oxia's client protocol."
    )
    levels = ["DEBUG", "INFO", "WARNING", "ERROR"]
    parser.add_argument(
        "--log-level", default=os.environ.get("QUORUMSTORE_LOG_LEVEL", "WARNING"), choices=levels
    )
    # Accepted after the command too (`quorumstore standalone --log-level INFO`); there it
    # has no default, so it overrides the one before the command only when given.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=levels)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("standalone", help="one process, one replica per shard", parents=[common])
    p.add_argument("--shards", type=_positive, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--port", type=_port, default=DEFAULT_CLIENT_PORT, help="client port (Oxia's default: 6648)"
    )
    p.add_argument(
        "--admin-port",
        type=_port,
        default=0,
        help="coordinator status port (default: any free port)",
    )
    p.add_argument(
        "--advertise-host",
        help="the name or address clients and other nodes reach this one by (default: --host; "
        "required when --host listens on every interface, e.g. 0.0.0.0)",
    )
    p.add_argument("--data-dir", default="quorumstore-data", help="default: ./quorumstore-data")
    p.add_argument(
        "--no-fsync",
        action="store_true",
        help="do not fsync the WAL (faster, loses recent writes on power loss)",
    )
    _add_storage_flags(p)

    p = sub.add_parser(
        "cluster",
        help="a coordinator and N node processes on this machine, each restarted when it stops",
        parents=[common],
    )
    p.add_argument("--nodes", type=_positive, default=3)
    p.add_argument("--shards", type=_positive, default=1)
    p.add_argument("--replication-factor", type=_positive, default=3)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--base-port",
        type=_port,
        default=DEFAULT_CLIENT_PORT,
        help="nodes listen on base, base+1, ...; the coordinator after them",
    )
    p.add_argument("--no-fsync", action="store_true")
    _add_storage_flags(p)
    _add_failure_timeout_flag(p)

    p = sub.add_parser("node", help="one storage node", parents=[common])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=DEFAULT_CLIENT_PORT)
    p.add_argument(
        "--advertise-host",
        help="the name or address clients and other nodes reach this one by (default: --host; "
        "required when --host listens on every interface, e.g. 0.0.0.0)",
    )
    p.add_argument("--no-fsync", action="store_true")
    _add_storage_flags(p)

    p = sub.add_parser("coordinator", help="the coordinator of a set of nodes", parents=[common])
    p.add_argument(
        "--nodes",
        type=lambda v: [_address(a) for a in v.split(",")],
        required=True,
        help="comma-separated host:port",
    )
    p.add_argument("--shards", type=_positive, default=1)
    p.add_argument("--replication-factor", type=_positive, default=3)
    p.add_argument(
        "--metadata", required=True, help="path or fsspec URL of the coordinator's metadata"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--admin-port", type=_port, default=0)
    _add_failure_timeout_flag(p)

    p = sub.add_parser(
        "status",
        help="per shard: term, leader, offsets, follower lag, eligible set",
        parents=[common],
    )
    p.add_argument(
        "--coordinator", type=_address, required=True, help="the coordinator's host:port"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    _follow_cluster_parent()
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.command == "standalone":
            event_loops.run(_run_standalone(args))
        elif args.command == "node":
            event_loops.run(_run_node(args))
        elif args.command == "coordinator":
            event_loops.run(_run_coordinator(args))
        elif args.command == "cluster":
            _run_cluster(args)
        elif args.command == "status":
            _run_status(args)
    except (CliError, DataFormatError, MetadataError, WalError) as e:
        print(f"quorumstore: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"quorumstore: error: {e}", file=sys.stderr)
        return 2
    except ReplicaFailure as e:
        print(f"quorumstore: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
