"""The cluster harness of the process and Spark tiers: real quorumstore processes on loopback.

`LocalCluster` starts N `quorumstore node` processes and one `quorumstore coordinator`
process, each on a free loopback port, each node with its own data directory under the
test's directory. It knows every process's pid and injects the faults the tests need:
kill -9 of a node or of the coordinator, SIGSTOP/SIGCONT, restart (same port, same data
directory, same metadata path), and wiping a node's data. `close()` kills everything it
started. `WriteLoad` writes through the official Oxia client meanwhile and reads every
acknowledged write back.

State is observed the way an operator would: the coordinator's `CoordinatorAdmin`
service (`GetClusterStatus`) and each node's `NodeControl.GetStatus` on its internal
port, with the cluster secret the harness writes for its processes.

Every quorumstore process a test starts goes through `start_cli` or `run_cli`, so each
runs this interpreter's package the same way.
"""

from __future__ import annotations

# First: importing quorumstore turns gRPC's fork handlers off, which works only before
# grpc is imported (quorumstore/__init__.py). Scripts that import this harness, the
# benches among them, may start Spark's JVM (a fork) after their clients ran.
import quorumstore  # noqa: F401

# isort: split
import contextlib
import itertools
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

import grpc
import oxia
import oxia.ex
import pytest
import xxhash

from quorumstore.proto import quorumstore_data_pb2 as data_pb
from quorumstore.proto import quorumstore_data_pb2_grpc as data_grpc
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.testing import official_oxia_client
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.tls import TlsConfig, open_channel

T = TypeVar("T")

NAMESPACE = "default"
#: How long a process may take to serve after it is started.
PROCESS_START_TIMEOUT_S = 30.0
#: How long the cluster may take to elect every shard's first leader.
ONLINE_TIMEOUT_S = 30.0
#: Shards of the `quorumstore standalone` that a process-tier test module shares.
STANDALONE_SHARDS = 3
_RPC_TIMEOUT_S = 2.0
_POLL_INTERVAL_S = 0.05


# ------------------------------------------------------------------ polling


class PollTimeout(AssertionError):
    """A condition did not become true before its deadline."""


class PollAbort(AssertionError):
    """Raised by a polled condition that can never become true (e.g. its process died)."""


def poll_until(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    describe: Callable[[], str] | None = None,
    interval_s: float = _POLL_INTERVAL_S,
) -> T:
    """Calls `condition` until it returns something truthy (returned) or `timeout_s` passes.

    Exceptions from `condition` count as "not yet"; the last one is quoted on timeout,
    with `describe()` (the state at that moment) if given.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except PollAbort:
            raise
        except Exception as e:  # noqa: BLE001 - "not ready yet" comes in many shapes
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            if describe is not None:
                try:
                    detail += f"\nstate: {describe()}"
                except Exception as e:  # noqa: BLE001 - best effort
                    detail += f"\nstate: unavailable ({e!r})"
            raise PollTimeout(f"timed out after {timeout_s:.1f} s waiting for {what}{detail}")
        time.sleep(interval_s)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive free TCP ports, below the ephemeral range.

    Below it, so that no outgoing connection takes a killed node's port before the node
    is restarted on it.
    """
    high = _ephemeral_low() - count
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(20000, high)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"found no {count} consecutive free ports in 20000-{high}")


# ------------------------------------------------------------------ processes


def _command(args: Sequence[str]) -> list[str]:
    """`quorumstore <args>` run by this interpreter, so the child imports the package under test."""
    return [sys.executable, "-m", "quorumstore.cli", *args]


def start_cli(
    *args: str,
    stdout: int | IO[Any] = subprocess.PIPE,
    stderr: int | IO[Any] = subprocess.STDOUT,
    place: Place | None = None,
) -> subprocess.Popen[str]:
    """Starts `quorumstore <args>` with text output, in a session of its own: a Ctrl-C of
    pytest does not reach it, the test's teardown stops it. `place` runs it on another
    host (a network namespace) instead of this one."""
    return subprocess.Popen(
        _command(args) if place is None else place.command(_command(args)),
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def run_cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs `quorumstore <args>` to its end; returns its exit status and output."""
    return subprocess.run(
        _command(args), capture_output=True, text=True, timeout=timeout_s, check=False
    )


class Place(Protocol):
    """Another host to run a process on (`tests/multihost/netns.py`'s `Host`)."""

    address: str

    def command(self, argv: Sequence[str]) -> list[str]: ...


class ManagedProcess:
    """One `quorumstore ...` child; its output appended to `log_path` across restarts."""

    def __init__(self, name: str, argv: list[str], log_path: Path, place: Place | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.place = place
        self.popen: subprocess.Popen[str] | None = None

    def start(self) -> None:
        assert not self.alive, f"{self.name} is already running"
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = start_cli("--log-level", "INFO", *self.argv, stdout=log, place=self.place)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL, then reap: no shutdown code of the process runs."""
        assert self.popen is not None and self.alive, f"{self.name} is not running"
        os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def ensure_dead(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"


# ------------------------------------------------------------------ the oxia client


def close_in_background(client: oxia.Client) -> None:
    """Closes a client without waiting for it (its discovery thread may be in a back-off sleep)."""

    def close() -> None:
        try:
            client.close()
        except Exception:  # noqa: BLE001, S110 - an abandoned client; nothing to report
            pass

    threading.Thread(target=close, name="oxia-close", daemon=True).start()


# ------------------------------------------------------------------ the cluster


@dataclass(frozen=True, order=True)
class HashRange:
    shard: int
    low: int
    high: int


class LocalCluster:
    """N node processes plus a coordinator process on loopback, with fault injection."""

    def __init__(
        self,
        root: Path,
        *,
        nodes: int = 3,
        shards: int = 1,
        replication_factor: int = 3,
        fsync: bool = True,
        host: str = "127.0.0.1",
        node_args: Sequence[str] = (),
        coordinator_args: Sequence[str] = (),
        public_tls: TlsConfig | None = None,
        internal_tls: TlsConfig | None = None,
        places: Sequence[Place] = (),
    ):
        """`public_tls` and `internal_tls` are how the harness itself dials the status
        port and the nodes' internal ports, when `node_args` and `coordinator_args` give
        them TLS. `places`, when given, are the hosts node i (at index i) and the
        coordinator (last) run on, each at its host's address."""
        self.root = root
        self._public_tls = public_tls
        self._internal_tls = internal_tls
        self.shards = shards
        self.replication_factor = replication_factor
        self.host = host
        base = free_ports(2 * nodes + 1, host)
        hosts = [place.address for place in places] or [host] * (nodes + 1)
        self.nodes: list[str] = [f"{hosts[i]}:{base + i}" for i in range(nodes)]
        self.admin_address = f"{hosts[nodes]}:{base + nodes}"
        #: Node address -> its internal address (node control, replication).
        self.internal = {n: f"{hosts[i]}:{base + nodes + 1 + i}" for i, n in enumerate(self.nodes)}
        self.metadata_path = root / "coordinator" / "metadata.pb"
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.secret = ClusterSecret.generate()
        self.secret_file = root / "cluster-secret"
        self.secret.write_file(self.secret_file)
        secret_flag = ["--cluster-secret-file", str(self.secret_file)]
        no_fsync = [] if fsync else ["--no-fsync"]
        self._processes: dict[str, ManagedProcess] = {}
        for i, address in enumerate(self.nodes):
            port = address.rpartition(":")[2]
            argv = [
                "node",
                "--host",
                hosts[i],
                "--port",
                port,
                "--internal-port",
                self.internal[address].rpartition(":")[2],
                *secret_flag,
                "--data-dir",
                str(self.node_dir(address)),
                *no_fsync,
                *node_args,
            ]
            self._processes[address] = ManagedProcess(
                f"node{i}",
                argv,
                root / "logs" / f"node{i}-{port}.log",
                places[i] if places else None,
            )
        self.coordinator = ManagedProcess(
            "coordinator",
            [
                "coordinator",
                "--nodes",
                ",".join(self.nodes),
                "--internal-addresses",
                ",".join(self.internal.values()),
                *secret_flag,
                "--shards",
                str(shards),
                "--replication-factor",
                str(replication_factor),
                "--metadata",
                str(self.metadata_path),
                "--host",
                hosts[nodes],
                "--admin-port",
                self.admin_address.rpartition(":")[2],
                *coordinator_args,
            ],
            root / "logs" / "coordinator.log",
            places[nodes] if places else None,
        )
        self._channels: dict[str, grpc.Channel] = {}
        self._hash_ranges: list[HashRange] = []

    # -------------------------------------------------------------- lifecycle

    def start(self) -> pb.ClusterStatus:
        """Starts every node and the coordinator at once; returns once all shards have a leader."""
        for node in self.nodes:
            self._processes[node].start()
        self.coordinator.start()  # it keeps trying to reach nodes that are still starting
        for node in self.nodes:
            self._wait_node_serving(node)
        status = self.wait_online()
        for node in self.nodes:  # fully formed: every replica follows its leader
            self.wait_rejoined(node)
        self._hash_ranges = sorted(
            HashRange(m.shard, m.hash_range.min_hash_inclusive, m.hash_range.max_hash_inclusive)
            for m in status.metadata.shards
        )
        return status

    def close(self) -> None:
        """Kills every process this cluster started; safe to call more than once."""
        for process in [self.coordinator, *self._processes.values()]:
            process.ensure_dead()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def pid(self, name: str) -> int | None:
        """Pid of a node (by address) or of "coordinator"; None if never started."""
        return self.coordinator.pid if name == "coordinator" else self._processes[name].pid

    def pids(self) -> dict[str, int | None]:
        return {
            "coordinator": self.coordinator.pid,
            **{n: p.pid for n, p in self._processes.items()},
        }

    def is_alive(self, node: str) -> bool:
        return self._processes[node].alive

    def live_nodes(self) -> list[str]:
        return [n for n in self.nodes if self.is_alive(n)]

    def node_dir(self, node: str) -> Path:
        return self.root / "data" / node.replace(":", "_")

    # -------------------------------------------------------------- faults

    def kill9(self, node: str) -> float:
        """kill -9 of a node process; returns the monotonic time of the kill."""
        at = time.monotonic()
        self._processes[node].kill9()
        self._drop_channel(self.internal[node])
        return at

    def pause(self, name: str) -> float:
        """SIGSTOP of a node (by address) or of "coordinator" (alive but silent: a long GC
        pause, a frozen VM); returns the monotonic time of the pause. Teardown's SIGKILL
        ends it even while stopped."""
        at = time.monotonic()
        self._signal(name, signal.SIGSTOP)
        return at

    def limit_file_size(self, node: str, max_bytes: int) -> None:
        """Caps the size every file of the running node may grow to (RLIMIT_FSIZE on the live
        process): a write past it fails with EFBIG, as writes fail on a full disk. Python
        ignores SIGXFSZ, so the node sees the error instead of being killed."""
        pid = self.pid(node)
        assert pid is not None and self.is_alive(node), f"{node} is not running"
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (max_bytes, resource.RLIM_INFINITY))

    def log_size(self, node: str) -> int:
        return self._processes[node].log_path.stat().st_size

    def log_text(self, node: str) -> str:
        return self._processes[node].log_path.read_text(errors="replace")

    def wait_exited(self, node: str, timeout_s: float) -> int:
        """Waits until a node process exits by itself; returns its exit status."""
        process = self._processes[node]

        def exited() -> tuple[int] | None:
            assert process.popen is not None, f"{process.name} was never started"
            code = process.popen.poll()
            return None if code is None else (code,)

        return poll_until(
            exited, timeout_s, f"{process.name} ({node}) to exit", describe=process.log_tail
        )[0]

    def resume(self, name: str) -> None:
        """SIGCONT of a paused process: it goes on from where it stopped, unaware of the gap."""
        self._signal(name, signal.SIGCONT)

    def _signal(self, name: str, sig: signal.Signals) -> None:
        pid = self.pid(name)
        assert pid is not None, f"{name} was never started"
        os.kill(pid, sig)

    def restart(self, node: str, *, wait: bool = True) -> None:
        """Starts a stopped node again on its port and data directory; waits until it
        serves, unless told not to (a node that cannot join, for instance)."""
        self._processes[node].start()
        if wait:
            self._wait_node_serving(node)

    def add_node_args(self, *args: str) -> None:
        """Appends `args` to every node's command line from its next start on (a flag
        given again overrides the earlier one)."""
        for process in self._processes.values():
            process.argv.extend(args)

    def wipe(self, node: str) -> None:
        """Deletes a stopped node's whole data directory."""
        assert not self.is_alive(node), f"wipe {node} only while it is down"
        shutil.rmtree(self.node_dir(node), ignore_errors=True)

    def kill9_coordinator(self) -> float:
        at = time.monotonic()
        self.coordinator.kill9()
        self._drop_channel(self.admin_address)
        return at

    def restart_coordinator(self) -> pb.ClusterStatus:
        """Starts the coordinator again with the same metadata path; returns its first status."""
        self.coordinator.start()
        return poll_until(
            self.status, PROCESS_START_TIMEOUT_S, "the restarted coordinator to serve status"
        )

    # -------------------------------------------------------------- observation

    def _channel(self, address: str) -> grpc.Channel:
        channel = self._channels.get(address)
        if channel is None:
            internal = address in self.internal.values()
            tls = self._internal_tls if internal else self._public_tls
            channel = open_channel(address, [], tls)
            self._channels[address] = channel
        return channel

    def _drop_channel(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            channel.close()

    def status(self) -> pb.ClusterStatus:
        """The coordinator's view (CoordinatorAdmin.GetClusterStatus)."""
        stub = pb_grpc.CoordinatorAdminStub(self._channel(self.admin_address))
        return stub.GetClusterStatus(pb.Empty(), timeout=_RPC_TIMEOUT_S)

    def shard_metadata(self, shard: int) -> pb.ShardMetadata:
        for m in self.status().metadata.shards:
            if m.namespace == NAMESPACE and m.shard == shard:
                return m
        raise KeyError(f"no shard {shard} in the coordinator's metadata")

    def leader_of(self, shard: int) -> str | None:
        """The shard's leader per the coordinator, or None while it has none (election)."""
        m = self.shard_metadata(shard)
        return m.leader if m.status == pb.ONLINE and m.leader else None

    def node_status(self, node: str, shard: int) -> pb.GetStatusResponse:
        """One replica's own status (NodeControl.GetStatus on that node's internal port)."""
        stub = pb_grpc.NodeControlStub(self._channel(self.internal[node]))
        return stub.GetStatus(
            pb.GetStatusRequest(namespace=NAMESPACE, shard=shard),
            timeout=_RPC_TIMEOUT_S,
            metadata=self.secret.metadata,
        )

    def listed_leader(self, node: str, shard: int) -> str | None:
        """The shard's leader in the node's own map (ListShards on its client port)."""
        stub = data_grpc.QuorumstoreDataStub(self._channel(node))
        listed = stub.ListShards(
            data_pb.ListShardsRequest(namespace=NAMESPACE), timeout=_RPC_TIMEOUT_S
        )
        return next((s.leader or None for s in listed.shards if s.shard == shard), None)

    def _wait_node_serving(self, node: str) -> None:
        process = self._processes[node]

        def serving() -> bool:
            if not process.alive:
                raise PollAbort(f"{process.name} exited early; its log:\n{process.log_tail()}")
            self.node_status(node, 0)
            return True

        poll_until(serving, PROCESS_START_TIMEOUT_S, f"{process.name} ({node}) to serve")

    def wait_online(self, timeout_s: float = ONLINE_TIMEOUT_S) -> pb.ClusterStatus:
        """Waits until the coordinator reports every shard ONLINE with a leader."""

        def online() -> pb.ClusterStatus | None:
            if not self.coordinator.alive:
                raise PollAbort(f"the coordinator exited; its log:\n{self.coordinator.log_tail()}")
            status = self.status()
            ok = len(status.metadata.shards) == self.shards and all(
                m.status == pb.ONLINE and m.leader for m in status.metadata.shards
            )
            return status if ok else None

        return poll_until(
            online,
            timeout_s,
            "every shard to be online",
            describe=lambda: str(self.status().metadata),
        )

    def wait_new_leader(
        self, shard: int, not_on: str, after_term: int, timeout_s: float = ONLINE_TIMEOUT_S
    ) -> tuple[str, int]:
        """Waits for a leader of `shard` other than `not_on`, in a term after `after_term`."""

        def elected() -> tuple[str, int] | None:
            m = self.shard_metadata(shard)
            if m.status == pb.ONLINE and m.leader and m.leader != not_on and m.term > after_term:
                return m.leader, m.term
            return None

        return poll_until(
            elected,
            timeout_s,
            f"a new leader of shard {shard} (not {not_on})",
            describe=lambda: self.describe_shard(shard),
        )

    def wait_following(
        self, node: str, shard: int, timeout_s: float = ONLINE_TIMEOUT_S
    ) -> pb.GetStatusResponse:
        """Waits until `node` follows the current leader of `shard` in the leader's term."""

        def following() -> pb.GetStatusResponse | None:
            leader = self.leader_of(shard)
            if leader is None or leader == node:
                return None
            leader_status = self.node_status(leader, shard)
            mine = self.node_status(node, shard)
            if (
                mine.role == pb.FOLLOWER
                and mine.term == leader_status.term
                and leader_status.role == pb.LEADER
            ):
                return mine
            return None

        return poll_until(
            following,
            timeout_s,
            f"{node} to follow the leader of shard {shard}",
            describe=lambda: self.describe_shard(shard),
        )

    def wait_rejoined(self, node: str, timeout_s: float = ONLINE_TIMEOUT_S) -> None:
        """Waits until `node` serves every shard it holds a replica of: it follows (or leads)
        in the shard's current term, and the shard is online."""

        def rejoined() -> bool:
            for m in self.status().metadata.shards:
                if node not in m.ensemble:
                    continue
                if m.status != pb.ONLINE:
                    return False
                mine = self.node_status(node, m.shard)
                if mine.term != m.term or mine.role not in (pb.FOLLOWER, pb.LEADER):
                    return False
            return True

        poll_until(
            rejoined,
            timeout_s,
            f"{node} to follow or lead each of its shards",
            describe=lambda: self.describe_node(node),
        )

    def describe_node(self, node: str) -> str:
        return "\n".join(
            self.describe_shard(m.shard)
            for m in self.status().metadata.shards
            if node in m.ensemble
        )

    def wait_caught_up(
        self, node: str, shard: int, timeout_s: float = ONLINE_TIMEOUT_S
    ) -> tuple[pb.GetStatusResponse, pb.GetStatusResponse]:
        """Waits (with no writes running) until `node`'s replica has the leader's head and commit.

        Returns (leader's status, node's status).
        """

        def caught_up() -> tuple[pb.GetStatusResponse, pb.GetStatusResponse] | None:
            leader = self.leader_of(shard)
            if leader is None or leader == node:
                return None
            lead, mine = self.node_status(leader, shard), self.node_status(node, shard)
            same = (
                mine.role == pb.FOLLOWER
                and mine.term == lead.term
                and (mine.head.offset, mine.head.checksum) == (lead.head.offset, lead.head.checksum)
                and mine.commit_offset == lead.commit_offset
            )
            return (lead, mine) if same else None

        return poll_until(
            caught_up,
            timeout_s,
            f"{node} to converge with the leader of shard {shard}",
            describe=lambda: self.describe_shard(shard),
        )

    def describe_shard(self, shard: int) -> str:
        """One line per replica of `shard` (role, term, head, commit) plus the coordinator's view."""
        lines = []
        try:
            m = self.shard_metadata(shard)
            lines.append(
                f"coordinator: term {m.term} leader {m.leader or '-'} state {pb.ShardState.Name(m.status)} "
                f"eligible {list(m.eligible)} known commit {m.last_known_commit_offset}"
            )
        except Exception as e:  # noqa: BLE001 - best effort
            lines.append(f"coordinator: unavailable ({e!r})")
        for node in self.nodes:
            if not self.is_alive(node):
                lines.append(f"{node}: down")
                continue
            try:
                s = self.node_status(node, shard)
                followers = ", ".join(f"{f.name}@{f.acked_offset}" for f in s.followers)
                lines.append(
                    f"{node}: {pb.ReplicaRole.Name(s.role)} term {s.term} head {s.head.term}/{s.head.offset} "
                    f"commit {s.commit_offset}" + (f" followers [{followers}]" if followers else "")
                )
            except Exception as e:  # noqa: BLE001 - best effort
                lines.append(f"{node}: status unavailable ({e!r})")
        return "\n  ".join(["", *lines])

    def shard_of(self, key: str) -> int:
        """The shard the Oxia client routes `key` to (xxh64 of the key, low 32 bits)."""
        h = xxhash.xxh64(key).intdigest() & 0xFFFFFFFF
        for r in self._hash_ranges:
            if r.low <= h <= r.high:
                return r.shard
        raise KeyError(f"no shard covers hash {h:#010x} of {key!r}")

    def open_client(self, node: str | None = None) -> oxia.Client:
        """The official Oxia client (unmodified), bootstrapped from `node` (default: a live node).

        oxia 0.2.1 cannot follow a changing shard map, so nodes serve it in gateway mode
        (quorumstore.node.oxia.relay): its bootstrap node relays each call to the leader.
        """
        return official_oxia_client(node or self.live_nodes()[0])

    def log_tails(self, chars: int = 2500) -> str:
        parts = [
            f"----- {p.name} ({p.log_path.name}) -----\n{p.log_tail(chars)}"
            for p in [self.coordinator, *self._processes.values()]
        ]
        return "\n".join(parts)


# ------------------------------------------------------------------ the write load

#: Concurrent writers of a WriteLoad, unless told otherwise.
WRITERS = 8
#: Puts per second each writer issues at most: a steady load that leaves CPU for the
#: cluster's own work (restarts, elections) on a small machine.
WRITES_PER_SECOND = 10.0
#: A writer retrying a failed put waits this long first (a back-off, not a poll).
RETRY_BACKOFF_S = 0.05
#: A writer whose puts have failed this long reopens its client on another live node.
REOPEN_AFTER_S = 2.0


@dataclass(frozen=True)
class AckedWrite:
    key: str
    value: bytes
    shard: int
    started_at: float
    acked_at: float


class WriterStuck(AssertionError):
    """A writer thread did not return from its last put in time after being asked to stop."""


class WriteLoad:
    """`clients` threads, each with its own official Oxia client, writing distinct keys.

    Writer i puts `/load/w<i>-<seq>` (at most `rate` a second) with a value unique to
    this run and records every acknowledged put (key, value, shard, when it was issued, when acknowledged). A
    failed put has an unknown outcome: the writer retries the same key with the same
    value. A writer whose bootstrap node died, or whose puts keep failing, reopens its
    client on a live node, as a client behind a load balancer would.
    """

    def __init__(
        self, cluster: LocalCluster, clients: int = WRITERS, rate: float = WRITES_PER_SECOND
    ):
        self.cluster = cluster
        self.clients = clients
        self.interval_s = 1.0 / rate
        self.run_id = uuid.uuid4().hex[:8]
        self.acked: list[AckedWrite] = []
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._in_put: dict[int, float] = {}

    def start(self) -> None:
        for i in range(self.clients):
            thread = threading.Thread(
                target=self._write_loop, args=(i,), name=f"writer-{i}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop_nowait(self) -> None:
        """Asks the writers to stop (teardown: whatever they are doing, they are daemons)."""
        self._stop.set()

    def stop(self, timeout_s: float = 40.0) -> None:
        """Stops the writers; fails if one is stuck in a put (the oxia client has no timeout)."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        self._threads = [t for t in self._threads if t.is_alive()]
        if stuck:
            now = time.monotonic()
            since = {i: f"{now - at:.1f} s" for i, at in dict(self._in_put).items()}
            raise WriterStuck(
                f"writers {stuck} still inside a put {timeout_s:.0f} s after stop: {since}"
            )

    def _open(self, index: int) -> tuple[oxia.Client, str]:
        while True:
            live = self.cluster.live_nodes()
            node = live[index % len(live)]
            try:
                return self.cluster.open_client(node), node
            except Exception as e:  # the node died meanwhile: pick another
                self._note_failure(e)
                if self._stop.wait(RETRY_BACKOFF_S):
                    raise

    def _note_failure(self, error: BaseException) -> None:
        with self._lock:
            self.failures += 1
            self.last_error = f"{type(error).__name__}: {str(error)[:200]}"

    def _write_loop(self, index: int) -> None:
        try:
            client, node = self._open(index)
        except Exception:  # noqa: BLE001 - stopped before it could connect
            return
        seq = 0
        failing_since: float | None = None
        try:
            while not self._stop.is_set():
                key = f"/load/w{index}-{seq:06d}"
                value = f"{self.run_id}:{index}:{seq}".encode()
                started = time.monotonic()
                self._in_put[index] = started
                try:
                    client.put(key, value)
                except Exception as e:  # noqa: BLE001 - any failure: outcome unknown, retry
                    self._in_put.pop(index, None)
                    self._note_failure(e)
                    failing_since = failing_since or started
                    if (
                        not self.cluster.is_alive(node)
                        or time.monotonic() - failing_since > REOPEN_AFTER_S
                    ):
                        close_in_background(client)
                        client, node = self._open(index)
                        failing_since = None
                    self._stop.wait(RETRY_BACKOFF_S)
                    continue
                acked = time.monotonic()
                self._in_put.pop(index, None)
                failing_since = None
                write = AckedWrite(key, value, self.cluster.shard_of(key), started, acked)
                with self._lock:
                    self.acked.append(write)
                seq += 1
                self._stop.wait(max(0.0, started + self.interval_s - acked))  # pacing
        finally:
            close_in_background(client)

    # -------------------------------------------------------------- observations

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def writes_issued_after(self, at: float, shard: int | None = None) -> list[AckedWrite]:
        """Acknowledged writes issued after `at` (to `shard`, if given), by ack time."""
        with self._lock:
            found = [
                w for w in self.acked if w.started_at > at and (shard is None or w.shard == shard)
            ]
        return sorted(found, key=lambda w: w.acked_at)

    def wait_for_write_after(
        self, at: float, shard: int | None, timeout_s: float, count: int = 1
    ) -> AckedWrite:
        """The first acknowledged write issued after `at`, once `count` such writes exist."""

        def written() -> AckedWrite | None:
            found = self.writes_issued_after(at, shard)
            return found[0] if len(found) >= count else None

        where = "any shard" if shard is None else f"shard {shard}"
        return poll_until(
            written,
            timeout_s,
            f"{count} acknowledged write(s) to {where} issued after the fault "
            f"(failed puts so far: {self.failures}, last: {self.last_error})",
        )

    def largest_gap(self, start: float, end: float, shard: int | None = None) -> float:
        """Longest time without an acknowledgement within [start, end]."""
        with self._lock:
            times = sorted(
                w.acked_at
                for w in self.acked
                if start <= w.acked_at <= end and (shard is None or w.shard == shard)
            )
        return max(b - a for a, b in itertools.pairwise([start, *times, end]))

    def verify(self, readers: int = 4) -> str:
        """Reads back every acknowledged write with fresh official clients; returns a summary.

        Each key is read with `get` (its value must be the acknowledged one; `readers`
        clients in parallel) and all of them once more with one range scan across shards.
        """
        with self._lock:
            acked = list(self.acked)
        assert acked, "the load acknowledged no writes at all"
        started = time.monotonic()
        missing: list[str] = []
        wrong: list[str] = []

        def read_back(index: int) -> None:
            part = acked[index::readers]
            live = self.cluster.live_nodes()
            with self.cluster.open_client(live[index % len(live)]) as client:
                for write in part:
                    try:
                        _, value, _ = client.get(write.key)
                    except oxia.ex.KeyNotFound:
                        missing.append(write.key)
                        continue
                    if value != write.value:
                        wrong.append(f"{write.key}: {value!r} != {write.value!r}")

        with ThreadPoolExecutor(readers) as pool:
            list(pool.map(read_back, range(readers)))
        with self.cluster.open_client() as client:
            scanned = {key: value for key, value, _ in client.range_scan("/load/", "/load/~")}
        assert not missing, (
            f"{len(missing)} of {len(acked)} acknowledged writes are lost, e.g. {sorted(missing)[:5]}"
        )
        assert not wrong, (
            f"{len(wrong)} acknowledged writes have another value, e.g. {sorted(wrong)[:5]}"
        )
        disagree = [w.key for w in acked if scanned.get(w.key) != w.value]
        assert not disagree, (
            f"the range scan disagrees with get on {len(disagree)} keys, e.g. {disagree[:5]}"
        )
        return (
            f"verified {len(acked)} acknowledged writes by get and by range scan ({len(scanned)} keys) "
            f"in {time.monotonic() - started:.1f} s; {self.failures} put attempts had failed"
        )


# ------------------------------------------------------------------ S3

#: The bucket the tests' S3-compatible server holds.
S3_BUCKET = "qs-archive"


@contextmanager
def moto_s3() -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """An S3-compatible server (moto) on loopback with `S3_BUCKET`; yields its endpoint
    and functions that stop it and start it again (its contents survive)."""
    import s3fs
    from moto.server import ThreadedMotoServer

    port = free_ports(1)
    servers = [ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)]
    servers[0].start()

    def stop() -> None:
        servers[-1].stop()

    def start() -> None:
        servers.append(ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False))
        servers[-1].start()

    endpoint = f"http://127.0.0.1:{port}"
    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=endpoint)
    # moto keeps its buckets per process: an earlier server of this process made it.
    fs.makedirs(S3_BUCKET, exist_ok=True)
    try:
        yield endpoint, stop, start
    finally:
        servers[-1].stop()


#: Azurite's well-known development account (documented with the emulator; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
#: The container the tests' Azure Blob Storage emulator holds.
AZURE_CONTAINER = "quorumstore"


@contextmanager
def azurite_blob(workdir: Path) -> Iterator[str]:
    """Azurite's Blob Storage emulator (`azurite-blob`, from npm) on loopback, keeping
    its data in `workdir`, with `AZURE_CONTAINER`; yields its connection string, and
    stops it afterwards."""
    import fsspec

    port = free_ports(1)
    workdir.mkdir(parents=True, exist_ok=True)
    log = (workdir / "azurite.log").open("w")
    server = subprocess.Popen(
        [
            "azurite-blob",
            *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
            *("--location", str(workdir), "--skipApiVersionCheck", "--silent"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        poll_until(
            lambda: _accepts(port),
            30,
            f"azurite-blob to listen on port {port}",
            describe=lambda: (workdir / "azurite.log").read_text()[-2000:],
        )
        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
        )
        fs = fsspec.filesystem("abfs", connection_string=connection, skip_instance_cache=True)
        fs.mkdir(AZURE_CONTAINER)
        yield connection
    finally:
        server.kill()
        server.wait()
        log.close()


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def azure_environment(monkeypatch: pytest.MonkeyPatch, connection: str) -> None:
    """Points adlfs, here and in the processes a test starts, at the emulator."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)


def s3_environment(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Points fsspec's S3 filesystem, here and in the processes a test starts, at `endpoint`
    (fsspec reads its environment once, at import: this process needs its config too)."""
    import fsspec.config

    monkeypatch.setitem(
        fsspec.config.conf,
        "s3",
        {"endpoint_url": endpoint, "key": "testing", "secret": "testing"},
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", endpoint)
