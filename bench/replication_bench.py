"""Replication benchmark: a 3-node quorumstore cluster against a 3-member etcd, same run.

Both systems run on this machine's loopback with replication factor 3 and their
WAL fsynced on every commit, and are driven from this process through Python gRPC
clients with 100-byte values, using the same measurement code (bench/measure.py):

* put latency p50/p99, one client, one put at a time;
* puts/s with 64 puts in flight, with the p99 latency of those puts;
* failover: kill -9 of the leader until the first write issued after it succeeds;
* each node's peak resident memory during the throughput run;
* CPU per put in that run's timed window, the nodes' and this driver's, and the puts/s
  that cost allows with every CPU busy: where the throughput's ceiling on this machine
  is, and which side of the comparison spends the CPU.

quorumstore is measured twice: "plain" sends each put as its own Oxia `Write` through
raw grpc.aio stubs (as the etcd client sends each put as its own `Put`), and
"client" is quorumstore's own `AsyncClient`, which batches concurrent puts per shard.
quorumstore runs one shard by default: one replicated log, as etcd has one Raft group.
Failover is measured once per quorumstore row (the killed node is restarted and
caught up in between), each time on the shard the failover writes go to.

Usage: python bench/replication_bench.py [--seconds S] [--latency-n N] [--inflight K]
                                         [--shards N] [--dir D]
"""

from __future__ import annotations

# First: importing quorumstore turns gRPC's fork handlers off, which works only before
# grpc is imported (quorumstore/__init__.py).
import quorumstore  # noqa: F401

# isort: split
import abc
import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, TypeVar

import grpc
import psutil

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

# _free_ports and _RssSampler are etcd_peer's helpers, reused so that both systems'
# ports and memory are found the same way.
from etcd_peer import (
    CHANNEL_OPTIONS,
    LOCALHOST,
    EtcdClient,
    EtcdCluster,
    _free_ports,
    _RssSampler,
    etcd_binary,
)
from measure import Put, measure_failover, measure_latency, measure_throughput

from quorumstore import AsyncClient
from quorumstore.client.routing import ShardMap
from quorumstore.proto import oxia_client_pb2 as oxia_pb
from quorumstore.proto import oxia_client_pb2_grpc as oxia_grpc
from quorumstore.proto import replication_pb2 as repl_pb
from quorumstore.proto import replication_pb2_grpc as repl_grpc

T = TypeVar("T")

NODES = 3
STOP_GRACE_S = 10.0
ONLINE_TIMEOUT_S = 60.0
#: Failover writes all carry this partition key, so they all go to the one shard
#: whose leader is killed (otherwise writes to the other shards would succeed at once).
FAILOVER_PARTITION = "bench-failover"
#: Oxia's own routing (each call to the shard's leader), which grpc-python clients must
#: ask for: quorumstore otherwise relays their calls through the node they asked.
LEADER_ROUTING = (("qs-routing", "leader"),)


# ---------------------------------------------------------------------- quorumstore


class ProcessCluster(abc.ABC):
    """Server processes this benchmark started, by name (None: killed, not restarted).

    A context manager, like EtcdCluster: leaving it stops every process it started.
    Subclasses start them and say which of them `pids` measures.
    """

    def __init__(self) -> None:
        self._procs: dict[str, subprocess.Popen[bytes] | None] = {}
        self._sampler: _RssSampler | None = None

    @abc.abstractmethod
    def pids(self) -> dict[int, int]:
        """Process id of each measured process that runs, by index."""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.finish()
            self._sampler = None
        running = [p for p in self._procs.values() if p is not None and p.poll() is None]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    def start_rss_sampling(self) -> None:
        self._sampler = _RssSampler(self.pids, 0.05)
        self._sampler.start()

    def stop_rss_sampling(self) -> dict[int, float]:
        assert self._sampler is not None
        peaks = self._sampler.finish()
        self._sampler = None
        return peaks


class QuorumstoreCluster(ProcessCluster):
    """`NODES` quorumstore node processes and a coordinator on loopback, fsync on.

    Data and logs live in `base_dir`.
    """

    def __init__(self, base_dir: Path, shards: int) -> None:
        super().__init__()
        self._base = base_dir
        self._shards = shards
        ports = _free_ports(2 * NODES + 1)
        self.nodes = [f"{LOCALHOST}:{p}" for p in ports[:NODES]]
        self.admin = f"{LOCALHOST}:{ports[NODES]}"
        #: Node -> its internal port (loopback only, so no cluster secret is needed).
        self.internal = dict(zip(self.nodes, ports[NODES + 1 :], strict=True))

    def _argv(self, name: str) -> list[str]:
        if name == "coordinator":
            return [
                "coordinator",
                f"--nodes={','.join(self.nodes)}",
                f"--internal-addresses={','.join(f'{LOCALHOST}:{p}' for p in self.internal.values())}",
                f"--shards={self._shards}",
                f"--replication-factor={NODES}",
                f"--metadata={self._base / 'coordinator' / 'metadata.pb'}",
                f"--host={LOCALHOST}",
                f"--admin-port={self.admin.rpartition(':')[2]}",
            ]
        return [
            "node",
            f"--host={LOCALHOST}",
            f"--port={name.rpartition(':')[2]}",
            f"--internal-port={self.internal[name]}",
            f"--data-dir={self._base / name.replace(':', '_')}",
        ]

    def _spawn(self, name: str) -> None:
        self._base.mkdir(parents=True, exist_ok=True)
        log = self._base / f"{name.replace(':', '_')}.log"
        with open(log, "ab") as out:
            self._procs[name] = subprocess.Popen(
                [sys.executable, "-m", "quorumstore.cli", *self._argv(name)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def __enter__(self) -> Self:
        try:
            for name in [*self.nodes, "coordinator"]:
                self._spawn(name)
            self.wait_converged()
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> repl_pb.ClusterStatus:
        with grpc.insecure_channel(self.admin, CHANNEL_OPTIONS) as channel:
            return repl_grpc.CoordinatorAdminStub(channel).GetClusterStatus(
                repl_pb.Empty(), timeout=1
            )

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"quorumstore {name} exited with code {proc.returncode}; see its log in {self._base}"
                )

    def wait_converged(self, timeout_s: float = ONLINE_TIMEOUT_S) -> repl_pb.ClusterStatus:
        """Every shard online with a leader and every node caught up (eligible)."""
        deadline = time.monotonic() + timeout_s
        why = "no status yet"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                status = self.status()
            except grpc.RpcError as e:
                why = f"coordinator: {e.code().name}"
            else:
                shards = status.metadata.shards
                if len(shards) == self._shards and all(
                    s.status == repl_pb.ONLINE and s.leader and len(s.eligible) == NODES
                    for s in shards
                ):
                    return status
                why = f"shards: {[(s.shard, s.leader, len(s.eligible)) for s in shards]}"
            time.sleep(0.1)
        raise TimeoutError(f"quorumstore did not converge within {timeout_s:g} s ({why})")

    def pids(self) -> dict[int, int]:
        return {i: p.pid for i, n in enumerate(self.nodes) if (p := self._procs.get(n)) is not None}

    def leader_of(self, shard: int) -> str:
        for s in self.status().metadata.shards:
            if s.shard == shard and s.leader:
                return s.leader
        raise RuntimeError(f"shard {shard} has no leader")

    def kill(self, node: str) -> None:
        proc = self._procs[node]
        assert proc is not None, f"{node} is not running"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self._procs[node] = None

    def restart(self, node: str) -> None:
        self._spawn(node)
        self.wait_converged()


class PlainOxiaClient:
    """quorumstore without client-side batching: each put is one unary Oxia `Write`.

    Routes with the shard map from `GetShardAssignments` (XXH3, as the server does), in
    Oxia's leader routing.
    A failed put re-fetches the map in the background and is raised: retrying is the
    caller's decision, as with EtcdClient.
    """

    def __init__(self, nodes: list[str], timeout_s: float = 5.0) -> None:
        self._nodes = nodes
        self._timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._map: ShardMap | None = None
        self._refreshing: asyncio.Task[None] | None = None

    def _stub(self, address: str) -> oxia_grpc.OxiaClientStub:
        if address not in self._channels:
            self._channels[address] = grpc.aio.insecure_channel(address, CHANNEL_OPTIONS)
        return oxia_grpc.OxiaClientStub(self._channels[address])

    async def refresh(self) -> None:
        for address in self._nodes:
            request = oxia_pb.ShardAssignmentsRequest(namespace="default")
            call = self._stub(address).GetShardAssignments(request, metadata=LEADER_ROUTING)
            try:
                message = await asyncio.wait_for(call.read(), 2.0)
            except (grpc.aio.AioRpcError, TimeoutError):
                continue
            finally:
                call.cancel()
            if message is not grpc.aio.EOF:
                self._map = ShardMap.from_proto(message.namespaces["default"])
                return
        raise RuntimeError(f"no node of {self._nodes} serves shard assignments")

    async def put(self, key: bytes, value: bytes, partition_key: str | None = None) -> None:
        if self._map is None:
            await self.refresh()
        assert self._map is not None
        k = key.decode()
        shard = self._map.shard_for(partition_key or k)
        leader = self._map.leader(shard)
        if leader is None:
            self._refresh_soon()
            raise RuntimeError(f"shard {shard} has no leader")
        request = oxia_pb.WriteRequest(
            shard=shard, puts=[oxia_pb.PutRequest(key=k, value=value, partition_key=partition_key)]
        )
        try:
            response = await self._stub(leader).Write(
                request, timeout=self._timeout_s, metadata=LEADER_ROUTING
            )
        except grpc.aio.AioRpcError:
            self._refresh_soon()
            raise
        if response.puts[0].status != oxia_pb.OK:
            raise RuntimeError(f"put {k!r}: status {response.puts[0].status}")

    def _refresh_soon(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self.refresh())

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
        for channel in self._channels.values():
            await channel.close()


# ---------------------------------------------------------------------- measuring


@dataclass
class Row:
    """One system's (or one client's) numbers."""

    p50_ms: float = 0.0
    p99_ms: float = 0.0
    puts_s: float = 0.0
    load_p99_ms: float = 0.0
    failover_s: float | None = None
    rss_mb: dict[int, float] = field(default_factory=dict)
    failover_note: str = ""
    #: CPU microseconds per put in the timed window: the cluster's node (or member)
    #: processes together, and this process (client and load loop). A quorumstore
    #: cluster's coordinator is off the write path and not counted.
    nodes_cpu_us: float = 0.0
    driver_cpu_us: float = 0.0

    @property
    def cpu_us(self) -> float:
        """CPU microseconds per put, nodes and driver together."""
        return self.nodes_cpu_us + self.driver_cpu_us

    def cpu_ceiling_puts_s(self) -> float:
        """Puts/s at this CPU per put with every CPU of the machine busy."""
        return (os.cpu_count() or 1) * 1e6 / self.cpu_us


class MeasuredCluster(Protocol):
    """What the throughput window reads of a cluster: its processes, and their memory."""

    def pids(self) -> dict[int, int]: ...
    def start_rss_sampling(self) -> None: ...
    def stop_rss_sampling(self) -> dict[int, float]: ...


def _cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU seconds the processes `pids` have used so far."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


async def _throughput(
    put: Put,
    inflight: int,
    seconds: float,
    cluster: MeasuredCluster,
    row: Row,
) -> None:
    """puts/s, p99 latency of the puts in the timed window, peak RSS meanwhile, CPU
    per put in the window."""
    loop = asyncio.get_running_loop()
    samples: list[tuple[float, float]] = []  # (completed at, latency ms)
    cpu: list[tuple[float, float]] = []  # (nodes, driver) CPU seconds at the window's ends

    def read_cpu() -> None:
        cpu.append((_cpu_seconds(cluster.pids().values()), time.process_time()))

    async def timed(key: bytes, value: bytes) -> None:
        start = loop.time()
        await put(key, value)
        end = loop.time()
        samples.append((end, (end - start) * 1000.0))

    warmup_s = 1.0
    window_start = loop.time() + warmup_s
    # The same window measure_throughput counts puts in.
    loop.call_at(window_start, read_cpu)
    loop.call_at(window_start + seconds, read_cpu)
    cluster.start_rss_sampling()
    try:
        row.puts_s = await measure_throughput(
            timed, inflight=inflight, seconds=seconds, warmup_s=warmup_s
        )
    finally:
        row.rss_mb = cluster.stop_rss_sampling()
    in_window = [ms for at, ms in samples if window_start <= at <= window_start + seconds]
    row.load_p99_ms = statistics.quantiles(in_window, n=100, method="inclusive")[98]
    # Every worker's last put ends after the window does, so both readings were taken.
    (nodes_start, driver_start), (nodes_end, driver_end) = cpu
    puts = row.puts_s * seconds
    row.nodes_cpu_us = (nodes_end - nodes_start) * 1e6 / puts
    row.driver_cpu_us = (driver_end - driver_start) * 1e6 / puts


async def _latency(put: Put, n: int, row: Row) -> None:
    row.p50_ms, row.p99_ms = await measure_latency(put, n=n)


async def run_etcd(cluster: EtcdCluster, args: argparse.Namespace) -> Row:
    row = Row()
    leader = cluster.leader_index()
    endpoints = cluster.client_endpoints()
    async with EtcdClient(endpoints[leader:] + endpoints[:leader]) as client:
        await _latency(client.put, args.latency_n, row)
        await _throughput(
            client.put,
            args.inflight,
            args.seconds,
            cluster,
            row,
        )
        killed: list[int] = []
        row.failover_s = await measure_failover(
            client.put, lambda: killed.append(cluster.kill_leader())
        )
        row.failover_note = f"killed m{killed[0]}"
    return row


async def run_quorumstore(cluster: QuorumstoreCluster, args: argparse.Namespace) -> tuple[Row, Row]:
    plain_row, client_row = Row(), Row()
    plain = PlainOxiaClient(cluster.nodes)
    try:
        await _latency(plain.put, args.latency_n, plain_row)
        await _throughput(
            plain.put,
            args.inflight,
            args.seconds,
            cluster,
            plain_row,
        )
    finally:
        await plain.close()

    async with AsyncClient(cluster.nodes[0]) as client:

        async def put(key: bytes, value: bytes) -> None:
            await client.put(key.decode(), value)

        async def failover_put(key: bytes, value: bytes) -> None:
            await client.put(key.decode(), value, partition_key=FAILOVER_PARTITION)

        await _latency(put, args.latency_n, client_row)
        await _throughput(
            put,
            args.inflight,
            args.seconds,
            cluster,
            client_row,
        )
        shard = client.shard_for(FAILOVER_PARTITION)
        client_row.failover_s, killed = await _quorumstore_failover(cluster, shard, failover_put)
        client_row.failover_note = f"killed {killed}"
    cluster.restart(killed)

    plain = PlainOxiaClient(cluster.nodes)
    try:

        async def plain_failover_put(key: bytes, value: bytes) -> None:
            await plain.put(key, value, partition_key=FAILOVER_PARTITION)

        plain_row.failover_s, killed = await _quorumstore_failover(
            cluster, shard, plain_failover_put
        )
        plain_row.failover_note = f"killed {killed}"
    finally:
        await plain.close()
    return plain_row, client_row


async def _quorumstore_failover(
    cluster: QuorumstoreCluster, shard: int, put: Callable[[bytes, bytes], Awaitable[None]]
) -> tuple[float, str]:
    """Failover of `shard` (where FAILOVER_PARTITION routes); (seconds, killed node)."""
    killed: list[str] = []

    def kill_leader() -> None:
        leader = cluster.leader_of(shard)
        cluster.kill(leader)
        killed.append(leader)

    seconds = await measure_failover(put, kill_leader)
    return seconds, killed[0]


# ---------------------------------------------------------------------- report


def _ms(value: float) -> str:
    return f"{value:.2f} ms"


def _rss(rss: dict[int, float]) -> str:
    return " / ".join(f"{mb:.0f}" for mb in rss.values()) + " MiB"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "-"
    return f"{ours / theirs:.2f}x"


def print_report(
    etcd: Row, plain: Row, client: Row, args: argparse.Namespace, etcd_version: str
) -> None:
    def peak(row: Row) -> float:
        return max(row.rss_mb.values()) if row.rss_mb else 0.0

    def line(
        label: str, value: Callable[[Row], float | None], text: Callable[[Row], str]
    ) -> tuple[str, str, str, str, str, str]:
        """One row: each system's `text`, then plain's and client's `value` over etcd's."""
        return (
            label,
            text(etcd),
            text(plain),
            text(client),
            _ratio(value(plain), value(etcd)),
            _ratio(value(client), value(etcd)),
        )

    rows = [
        line(
            f"put latency p50 (1 client, n={args.latency_n})",
            lambda r: r.p50_ms,
            lambda r: _ms(r.p50_ms),
        ),
        line(
            f"put latency p99 (1 client, n={args.latency_n})",
            lambda r: r.p99_ms,
            lambda r: _ms(r.p99_ms),
        ),
        line(
            f"puts/s ({args.inflight} in flight, {args.seconds:g} s)",
            lambda r: r.puts_s,
            lambda r: f"{r.puts_s:.0f}",
        ),
        line(
            f"put latency p99 ({args.inflight} in flight)",
            lambda r: r.load_p99_ms,
            lambda r: _ms(r.load_p99_ms),
        ),
        line(
            "failover (kill -9 leader -> first write)",
            lambda r: r.failover_s,
            lambda r: f"{r.failover_s:.3f} s",
        ),
        line("peak RSS per node, throughput run", peak, lambda r: _rss(r.rss_mb)),
        line(
            "CPU per put, nodes + driver (throughput run)",
            lambda r: r.cpu_us,
            lambda r: f"{r.nodes_cpu_us:.0f} + {r.driver_cpu_us:.0f} us",
        ),
        line(
            f"puts/s at that CPU per put, all {os.cpu_count()} CPUs busy",
            Row.cpu_ceiling_puts_s,
            lambda r: f"{r.cpu_ceiling_puts_s():.0f}",
        ),
    ]
    header = (
        "",
        f"etcd {etcd_version}",
        "quorumstore plain",
        "quorumstore client",
        "plain/etcd",
        "client/etcd",
    )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(
        f"replication benchmark: {NODES} nodes each, replication factor {NODES}, WAL fsync on, "
        f"100-byte values, loopback, {os.cpu_count()} CPUs; quorumstore with {args.shards} shard(s)"
    )
    print("  plain = one Oxia Write per put (raw grpc.aio stubs); client = quorumstore.AsyncClient")
    for r in [header, *rows]:
        print(
            "  "
            + "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(r, widths))
            )
        )
    print(
        f"  failover nodes: etcd {etcd.failover_note}; plain {plain.failover_note}; "
        f"client {client.failover_note}"
    )
    ratio = client.puts_s / etcd.puts_s if etcd.puts_s else float("inf")
    verdict = "meets" if ratio >= 5 else "MISSES"
    print(
        f"quorumstore client puts/s = {ratio:.1f}x etcd ({verdict} the >= 5x bar; goal >= 10x), "
        f"p99 under load {client.load_p99_ms:.2f} ms"
    )


# ---------------------------------------------------------------------- main


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def _cancellable(coroutine: Awaitable[T]) -> T:
    """SIGTERM cancels the measurement like Ctrl-C does (see etcd_peer._measure_cancellable)."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await coroutine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput run length")
    parser.add_argument("--latency-n", type=int, default=1000, help="sequential puts timed")
    parser.add_argument("--inflight", type=int, default=64, help="puts in flight for throughput")
    parser.add_argument("--shards", type=int, default=1, help="quorumstore shards")
    parser.add_argument(
        "--dir", type=Path, default=None, help="parent of the temporary data directories"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    version = (
        subprocess.run([etcd_binary(), "--version"], capture_output=True, text=True, check=True)
        .stdout.splitlines()[0]
        .split(":")[-1]
        .strip()
    )
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="replication-bench-", dir=args.dir) as base:
            with EtcdCluster(Path(base) / "etcd", members=NODES) as etcd_cluster:
                etcd_cluster.wait_ready()
                etcd = asyncio.run(_cancellable(run_etcd(etcd_cluster, args)))
            with QuorumstoreCluster(Path(base) / "quorumstore", args.shards) as qs_cluster:
                plain, client = asyncio.run(_cancellable(run_quorumstore(qs_cluster, args)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every etcd and quorumstore process was stopped", file=sys.stderr)
        return 130
    print_report(etcd, plain, client, args, version)
    print(f"(ran {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
