"""etcd as the benchmark's reference peer: a local 3-member cluster and an async client.

quorumstore is compared side by side with etcd, the best-known Raft KV store, on
the same machine and with the same measurement code (bench/measure.py). For that
comparison to mean anything etcd must run as it would in production: three
members talking over real sockets, each with its own data directory, and its
WAL fsynced on every commit (etcd's default; this module never passes
``--unsafe-no-fsync`` and reports the WAL fsync counters to prove it).

The client speaks etcd's own gRPC API (etcdserverpb.KV Put/Range and
Maintenance Status) through a minimal .proto in bench/etcd_proto/, compiled at
import time with grpc_tools, so no etcd client library -- whose generated code
lags behind protobuf releases -- is needed.

Usage: python bench/etcd_peer.py [--seconds S] [--latency-n N] [--inflight K] [--dir D]
"""

from __future__ import annotations

# First: importing quorumstore turns gRPC's fork handlers off, which works only before
# grpc is imported (quorumstore/__init__.py).
import quorumstore  # noqa: F401

# isort: split
import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

import grpc

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))  # measure.py and etcd_proto/ live beside this file

from measure import measure_failover, measure_latency, measure_throughput

# Compiled from the .proto at import time: nothing generated is committed, so it
# cannot go stale against the installed protobuf runtime.
etcd_pb2, etcd_grpc = grpc.protos_and_services("etcd_proto/etcd_rpc.proto")

LOCALHOST = "127.0.0.1"
STOP_GRACE_S = 10.0
STATUS_TIMEOUT_S = 1.0
WAL_FSYNC_METRIC = "etcd_disk_wal_fsync_duration_seconds_count"
# gRPC shares connections to the same address between channels, including the
# reconnect backoff of one that failed: a fresh channel to a restarted member would
# inherit the dead one's backoff and fail with "connection refused" for up to
# minutes. Every channel here gets connections of its own. The cluster is on
# loopback, so an http_proxy in the environment must not be used to reach it.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.enable_http_proxy", 0)]
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def etcd_binary() -> str:
    """Path of the etcd server binary, or a clear error saying how to install it."""
    path = shutil.which("etcd")
    if path is None:
        raise FileNotFoundError(
            "etcd not found on PATH; install it with: apt-get install etcd-server"
        )
    return path


def _free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on loopback.

    All sockets are held open until every port is picked, so the kernel cannot
    hand out the same port twice; the ports are free again when etcd binds them.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOCALHOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _read_proc_status_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (kB) of a live process; empty if it has exited."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values


class _RssSampler(threading.Thread):
    """Tracks each member's peak resident memory over a window.

    VmHWM is a process's lifetime peak, so at the window's start it is reset to the
    current RSS (``echo 5 > /proc/PID/clear_refs``); from then on it catches
    spikes between two samples. Where the kernel refuses the reset, only the
    sampled VmRSS counts. A member restarted during the window is a new pid whose
    whole lifetime lies inside it, so its VmHWM counts without a reset.
    """

    def __init__(self, pids: Callable[[], dict[int, int]], interval_s: float) -> None:
        super().__init__(name="etcd-rss-sampler", daemon=True)
        self._pids = pids
        self._interval_s = interval_s
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._peak_kb: dict[int, int] = {}
        self._initial_pids = set(pids().values())
        self._hwm_reset: set[int] = set()
        for pid in self._initial_pids:
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            except OSError:
                continue
            self._hwm_reset.add(pid)

    def run(self) -> None:
        while not self._halt.is_set():
            self._sample()
            self._halt.wait(self._interval_s)

    def _sample(self) -> None:
        for member, pid in self._pids().items():
            status = _read_proc_status_kb(pid)
            if not status:
                continue
            peak = status.get("VmRSS", 0)
            if pid in self._hwm_reset or pid not in self._initial_pids:
                peak = max(peak, status.get("VmHWM", 0))
            with self._lock:
                self._peak_kb[member] = max(self._peak_kb.get(member, 0), peak)

    def peak_mb(self) -> dict[int, float]:
        with self._lock:
            return {member: kb / 1024.0 for member, kb in sorted(self._peak_kb.items())}

    def finish(self) -> dict[int, float]:
        """Stop sampling, take one last sample, and return the peaks in MiB."""
        self._halt.set()
        self.join()
        self._sample()
        return self.peak_mb()


class EtcdCluster:
    """A local etcd cluster of `members` processes on 127.0.0.1, for benchmarks and tests.

    Use it as a context manager: leaving the block stops every member (SIGTERM, then
    SIGKILL after a grace period) whatever happened inside, so no etcd process
    outlives the benchmark. Members are numbered 0..members-1; their data and logs
    live in `base_dir`/member-<i>/ and `base_dir`/member-<i>.log, which the caller
    owns and removes.
    """

    def __init__(self, base_dir: str | os.PathLike[str], members: int = 3, fsync: bool = True):
        if not fsync:
            raise ValueError(
                "EtcdCluster always runs etcd with WAL fsync on: a benchmark against an "
                "etcd without durable writes compares nothing"
            )
        if members < 1:
            raise ValueError(f"members={members}: a cluster needs at least one member")
        self._binary = etcd_binary()
        self._base = Path(base_dir)
        ports = _free_ports(2 * members)
        self._client_ports = ports[:members]
        self._peer_ports = ports[members:]
        self._names = [f"m{i}" for i in range(members)]
        self._token = f"quorumstore-bench-{os.getpid()}-{time.time_ns()}"
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * members
        self._member_index: dict[int, int] = {}  # etcd member id -> our index
        self._sampler: _RssSampler | None = None
        self._last_rss: dict[int, float] | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        try:
            for i in range(len(self._names)):
                self._spawn(i)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _argv(self, i: int) -> list[str]:
        initial_cluster = ",".join(
            f"{name}=http://{LOCALHOST}:{port}" for name, port in zip(self._names, self._peer_ports)
        )
        client_url = f"http://{LOCALHOST}:{self._client_ports[i]}"
        peer_url = f"http://{LOCALHOST}:{self._peer_ports[i]}"
        # On restart etcd finds its data dir and ignores the --initial-* flags, so the
        # same command line serves both the first start and every restart.
        return [
            self._binary,
            f"--name={self._names[i]}",
            f"--data-dir={self._base / f'member-{i}'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={initial_cluster}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self._token}",
            "--logger=zap",
            "--log-outputs=stderr",
        ]

    def _spawn(self, i: int) -> None:
        if self._procs[i] is not None:
            raise RuntimeError(f"member {i} is already running")
        self._base.mkdir(parents=True, exist_ok=True)
        # etcd reads ETCD_* variables as flags and refuses a flag given twice.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        with open(self._log_path(i), "ab") as log:
            # A session of its own keeps a terminal's Ctrl-C away from etcd: stopping
            # the members is this class's job, done in order in stop().
            self._procs[i] = subprocess.Popen(
                self._argv(i),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def _log_path(self, i: int) -> Path:
        return self._base / f"member-{i}.log"

    def _log_tail(self, i: int, lines: int = 15) -> str:
        try:
            text = self._log_path(i).read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _running(self) -> list[int]:
        """Members that should be running; raises if one of them has exited on its own."""
        running = []
        for i, proc in enumerate(self._procs):
            if proc is None:
                continue
            if proc.poll() is not None:
                raise RuntimeError(
                    f"etcd member {i} exited with code {proc.returncode}; "
                    f"log {self._log_path(i)} ends with:\n{self._log_tail(i)}"
                )
            running.append(i)
        return running

    def stop(self) -> None:
        """Stop every member: SIGTERM, then SIGKILL whatever is left after a grace period.

        Followers go first and the leader last: a leader that is stopped hands its
        leadership to a connected follower and, if that follower is stopping too,
        waits for etcd's request timeout (about 7 s here) before giving up. With
        the followers gone it has nobody to hand over to and exits at once.
        SIGINT and SIGTERM are held back meanwhile, so that a second Ctrl-C cannot
        cut the cleanup short and leave members behind; they are delivered after.
        """
        blocked = {signal.SIGINT, signal.SIGTERM}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            if self._sampler is not None:
                self.stop_rss_sampling()
            try:
                leader, _ = self._agreed_leader()
            except RuntimeError:  # a member died on its own: no orderly hand-over to plan
                leader = None
            running = [i for i, p in enumerate(self._procs) if p is not None]
            followers = [i for i in running if i != leader]
            self._terminate(followers)
            self._terminate([i for i in running if i == leader])
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _terminate(self, members: list[int]) -> None:
        procs = [(i, p) for i, p in enumerate(self._procs) if i in members and p is not None]
        for _, proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for i, proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._procs[i] = None

    # ------------------------------------------------------------------ state

    def client_endpoints(self) -> list[str]:
        """host:port of every member's client (gRPC) listener, in member order."""
        return [f"{LOCALHOST}:{port}" for port in self._client_ports]

    def pids(self) -> dict[int, int]:
        """Process id of every member that is currently started."""
        return {i: p.pid for i, p in enumerate(self._procs) if p is not None}

    def status(self, i: int) -> Any:
        """Member i's Maintenance.Status (an etcdserverpb.StatusResponse).

        A fresh channel (with its own connection, see CHANNEL_OPTIONS) per call: a
        long-lived one would carry gRPC's reconnect backoff across a kill and
        restart and report a restarted member late.
        """
        with grpc.insecure_channel(self.client_endpoints()[i], CHANNEL_OPTIONS) as channel:
            stub = etcd_grpc.MaintenanceStub(channel)
            response = stub.Status(etcd_pb2.StatusRequest(), timeout=STATUS_TIMEOUT_S)
        self._member_index[response.header.member_id] = i
        return response

    def _agreed_leader(self) -> tuple[int | None, str]:
        """(index of the leader every running member reports, or None; why not)."""
        running = self._running()
        if not running:
            return None, "no member is running"
        try:
            leaders = {self.status(i).leader for i in running}
        except grpc.RpcError as err:
            return None, f"Status failed: {err.code().name} {err.details()}"
        if len(leaders) != 1 or 0 in leaders:
            return None, f"members report leaders {sorted(leaders)} (0 = none)"
        index = self._member_index.get(leaders.pop())
        if index not in running:
            return None, f"the reported leader (member {index}) is not running"
        return index, ""

    def _wait_for_leader(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            index, why = self._agreed_leader()
            if index is not None:
                return index
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"etcd cluster has no agreed leader after {timeout_s} s: {why} "
                    f"(logs in {self._base})"
                )
            time.sleep(0.05)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until every running member answers Status and all name the same live leader."""
        self._wait_for_leader(timeout_s)

    def leader_index(self, timeout_s: float = 10.0) -> int:
        """Index of the current leader, waiting out an election if one is under way.

        The leader is the one every running member reports through Maintenance.Status;
        right after a kill the survivors still name the dead leader until their
        election timeout, so a dead or disputed leader means: ask again.
        """
        return self._wait_for_leader(timeout_s)

    def wal_fsync_counts(self) -> dict[int, int]:
        """WAL fsyncs each running member has done so far, from its /metrics endpoint.

        The evidence that the benchmark measured etcd with durable writes: with
        fsync on these grow with every committed batch of writes.
        """
        counts = {}
        for i in self._running():
            url = f"http://{self.client_endpoints()[i]}/metrics"
            with _NO_PROXY_OPENER.open(url, timeout=5) as response:
                text = response.read().decode()
            for line in text.splitlines():
                if line.startswith(WAL_FSYNC_METRIC + " "):
                    counts[i] = int(float(line.split()[1]))
                    break
            else:
                raise RuntimeError(f"member {i} exports no {WAL_FSYNC_METRIC}")
        return counts

    # ------------------------------------------------------------------ faults

    def kill(self, i: int) -> None:
        """kill -9 member i and reap it."""
        proc = self._procs[i]
        if proc is None:
            raise RuntimeError(f"member {i} is not running")
        proc.kill()
        proc.wait()
        self._procs[i] = None

    def kill_leader(self) -> int:
        """kill -9 the current leader; returns once it is dead, with its index."""
        leader = self.leader_index()
        self.kill(leader)
        return leader

    def restart(self, i: int, timeout_s: float = 30.0) -> None:
        """Start a killed member again on its data dir and wait until it has rejoined."""
        self._spawn(i)
        self.wait_ready(timeout_s)

    # ------------------------------------------------------------------ memory

    def start_rss_sampling(self, interval_s: float = 0.05) -> None:
        """Begin tracking each member's peak RSS in a background thread."""
        if self._sampler is not None:
            raise RuntimeError("RSS sampling is already running")
        self._sampler = _RssSampler(self.pids, interval_s)
        self._sampler.start()

    def stop_rss_sampling(self) -> dict[int, float]:
        """End the window; peak RSS in MiB per member index over it."""
        if self._sampler is None:
            raise RuntimeError("RSS sampling was not started")
        self._last_rss = self._sampler.finish()
        self._sampler = None
        return self._last_rss

    def peak_rss_mb(self) -> dict[int, float]:
        """Peak RSS in MiB per member: so far in the running window, else the last window's."""
        if self._sampler is not None:
            return self._sampler.peak_mb()
        if self._last_rss is None:
            raise RuntimeError("no RSS sampling window has run")
        return self._last_rss


_FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class EtcdClient:
    """Async etcd KV client: one grpc.aio channel, moved to the next endpoint on failure.

    All calls share one channel (HTTP/2 multiplexes concurrent requests on it), like
    a single application client. When a call fails because its member is gone or
    stuck (UNAVAILABLE, DEADLINE_EXCEEDED) the client switches to the next endpoint
    round-robin and re-raises: retrying is the caller's decision, so a benchmark
    sees every failure. Any member accepts writes (followers forward them to the
    leader); put the leader first in `endpoints` to save that hop.
    """

    def __init__(self, endpoints: Sequence[str], timeout_s: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("EtcdClient needs at least one endpoint")
        self._endpoints = list(endpoints)
        self._timeout_s = timeout_s
        self._current = 0
        self._retired: list[grpc.aio.Channel] = []
        self._channel = grpc.aio.insecure_channel(self._endpoints[0], CHANNEL_OPTIONS)
        self._kv = etcd_grpc.KVStub(self._channel)

    @property
    def endpoint(self) -> str:
        """The endpoint calls currently go to."""
        return self._endpoints[self._current]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in [*self._retired, self._channel]:
            await channel.close()
        self._retired.clear()

    def _move_on(self) -> None:
        # Calls still in flight on the old channel may yet succeed; it is closed in close().
        self._retired.append(self._channel)
        self._current = (self._current + 1) % len(self._endpoints)
        self._channel = grpc.aio.insecure_channel(self._endpoints[self._current], CHANNEL_OPTIONS)
        self._kv = etcd_grpc.KVStub(self._channel)

    async def _call(self, method: str, request: Any) -> Any:
        channel = self._channel
        try:
            return await getattr(self._kv, method)(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            # Only the first of many concurrent failures on a channel moves the client.
            if err.code() in _FAILOVER_CODES and channel is self._channel:
                self._move_on()
            raise

    async def put(self, key: bytes, value: bytes) -> int:
        """Write key=value; returns the store revision the write created."""
        response = await self._call("Put", etcd_pb2.PutRequest(key=key, value=value))
        return int(response.header.revision)

    async def get(self, key: bytes) -> bytes | None:
        """Linearizable read of one key; None if it does not exist."""
        response = await self._call("Range", etcd_pb2.RangeRequest(key=key))
        return bytes(response.kvs[0].value) if response.kvs else None


# ---------------------------------------------------------------------- CLI


@dataclass
class PeerResults:
    """What one run of the CLI measured, for the printed table."""

    p50_ms: float
    p99_ms: float
    puts_per_s: float
    peak_rss_mb: dict[int, float]
    wal_fsyncs: dict[int, int]
    failover_s: float
    killed: int
    new_leader: int


async def _run_measurements(
    cluster: EtcdCluster, seconds: float, latency_n: int, inflight: int
) -> PeerResults:
    leader = cluster.leader_index()
    endpoints = cluster.client_endpoints()
    # Leader first, as a leader-aware client would connect: quorumstore's client
    # talks to the leader directly, so etcd gets no forwarding hop either.
    async with EtcdClient(endpoints[leader:] + endpoints[:leader]) as client:
        p50, p99 = await measure_latency(client.put, n=latency_n)
        cluster.start_rss_sampling()
        try:
            puts_per_s = await measure_throughput(client.put, inflight=inflight, seconds=seconds)
        finally:
            rss = cluster.stop_rss_sampling()
        fsyncs = cluster.wal_fsync_counts()
        killed: list[int] = []
        failover_s = await measure_failover(
            client.put, lambda: killed.append(cluster.kill_leader())
        )
    return PeerResults(
        p50, p99, puts_per_s, rss, fsyncs, failover_s, killed[0], cluster.leader_index()
    )


def _print_table(r: PeerResults, seconds: float, latency_n: int, inflight: int) -> None:
    version = subprocess.run(
        [etcd_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout.splitlines()[0]  # "etcd Version: 3.4.23"
    rows = [
        (f"put latency p50 (1 client, n={latency_n})", f"{r.p50_ms:.2f} ms"),
        (f"put latency p99 (1 client, n={latency_n})", f"{r.p99_ms:.2f} ms"),
        (f"put throughput ({inflight} in flight, {seconds:g} s)", f"{r.puts_per_s:.0f} puts/s"),
        (
            "failover (kill -9 leader -> first write)",
            f"{r.failover_s:.3f} s (killed m{r.killed}, new leader m{r.new_leader})",
        ),
        (
            "peak RSS during throughput",
            ", ".join(f"m{i} {mb:.1f} MiB" for i, mb in r.peak_rss_mb.items()),
        ),
        ("WAL fsyncs after throughput", ", ".join(f"m{i} {n}" for i, n in r.wal_fsyncs.items())),
    ]
    width = max(len(name) for name, _ in rows)
    members = len(r.peak_rss_mb)
    version_number = version.split(":")[-1].strip()
    print(f"etcd {version_number}: {members} members on {LOCALHOST}, WAL fsync on, 100-byte values")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM outside the event loop: raise KeyboardInterrupt, as Ctrl-C does."""
    raise KeyboardInterrupt


async def _measure_cancellable(
    cluster: EtcdCluster, seconds: float, latency_n: int, inflight: int
) -> PeerResults:
    """The measurements, cancelled (like asyncio.run does on Ctrl-C) by SIGTERM.

    Inside the loop SIGTERM must not raise from a plain signal handler: Python runs
    it wherever the main thread happens to be, gRPC's Cython callbacks included,
    where an exception does not unwind normally -- a SystemExit raised there was
    seen to end the process on the spot, leaving the etcd members running. A loop
    signal handler runs as an ordinary callback instead.
    """
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await _run_measurements(cluster, seconds, latency_n, inflight)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput run length")
    parser.add_argument("--latency-n", type=int, default=2000, help="sequential puts timed")
    parser.add_argument("--inflight", type=int, default=64, help="puts in flight for throughput")
    parser.add_argument(
        "--dir", type=Path, default=None, help="parent of the (temporary) cluster directory"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="etcd-peer-", dir=args.dir) as base,
            EtcdCluster(base, members=3) as cluster,
        ):
            cluster.wait_ready()
            try:
                results = asyncio.run(
                    _measure_cancellable(cluster, args.seconds, args.latency_n, args.inflight)
                )
            finally:
                signal.signal(signal.SIGTERM, _interrupt)  # closing the loop reset it
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every etcd member was stopped", file=sys.stderr)
        return 130
    _print_table(results, args.seconds, args.latency_n, args.inflight)
    return 0


if __name__ == "__main__":
    sys.exit(main())
