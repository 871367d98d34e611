"""Replication floor: the write path's messages and fsyncs alone, beside etcd and quorumstore.

    python bench/replication_floor_bench.py [--seconds 5] [--inflight 64] [--latency-n 300]

What quorumstore's design can reach at best on this machine, measured rather than
guessed. Three "floor" processes do only what every replicated write must do in it:

* the driver batches concurrent puts as quorumstore's `AsyncClient` does (one batch in
  flight; the puts that arrive meanwhile go together as the next one) and sends each
  batch as one Oxia `WriteRequest` to the leader: as a unary grpc.aio `Write` call, as
  `AsyncClient` does, and in a second run as a message on one long-lived `WriteStream`;
* the leader reads the puts as columns (quorumstore's `plain_puts`), encodes them as one
  Arrow IPC batch, appends it to its log file and sends it on a bidirectional grpc.aio
  stream to each of two followers;
* each process fdatasyncs its log on a worker thread, as quorumstore's WAL does; a
  follower then sends an Ack on its stream;
* the leader answers once two of the three copies are durable (its own and a
  follower's, or both followers'), with a `PutResponse` and a version per put.

There is no KV store, no state machine, no change log, no serials, no checks and no
recovery: the floor is the cost of the messages, the Arrow encoding and the fsyncs, on
uvloop like quorumstore's nodes. The same run measures a 3-member etcd and a 3-node
quorumstore cluster with `AsyncClient` through the same code (bench/measure.py and
`replication_bench`'s throughput window), so all compare on one machine state. The last
line sets the better floor's puts/s against replication_bench's bar (5x etcd's).

More batches in flight do not raise the floor: with 64 callers cut into two batches of
32 (or three of 22, four of 16) in flight at once, each run of a probe made fewer puts/s
than one batch at a time, as every batch pays the messages' fixed cost.

`--serve-node` is how the benchmark starts its own floor processes; it is not for users.
"""

from __future__ import annotations

# First: importing quorumstore turns gRPC's fork handlers off, which works only before
# grpc is imported (quorumstore/__init__.py).
import quorumstore  # noqa: F401

# isort: split
import argparse
import asyncio
import itertools
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

import grpc
import pyarrow as pa

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from etcd_peer import (
    CHANNEL_OPTIONS,
    LOCALHOST,
    EtcdClient,
    EtcdCluster,
    _free_ports,
    etcd_binary,
)
from replication_bench import (
    ProcessCluster,
    QuorumstoreCluster,
    Row,
    _cancellable,
    _interrupt,
    _latency,
    _throughput,
)

from quorumstore import AsyncClient, event_loops
from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.node.oxia.plain_puts import plain_puts
from quorumstore.proto import oxia_client_pb2 as oxia_pb

FLOOR_NODES = 3
WRITE_METHOD = "/floor.Leader/Write"
WRITE_STREAM_METHOD = "/floor.Leader/WriteStream"
WRITE_TIMEOUT_S = 10.0
REPLICATE_METHOD = "/floor.Follower/Replicate"
#: An Append on a follower's stream: the entry's offset, then its Arrow IPC bytes.
_OFFSET = struct.Struct("<q")
READY_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------- floor nodes


class _Log:
    """An append-only file, fdatasynced on one worker thread (group commit: an fsync
    covers every append made before it started)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="fsync")

    async def append(self, data: bytes | memoryview) -> None:
        os.write(self._fd, data)
        await asyncio.get_running_loop().run_in_executor(self._syncer, os.fdatasync, self._fd)


class _FollowerStream:
    """The leader's stream to one follower: Appends out in order, Acks back, and a future
    per entry sent that the follower's Ack resolves.

    One writer task sends the Appends: gRPC takes one write at a time per stream, and
    several entries may be replicating at once. A follower lost is not reconnected; the
    floor goes on with the majority left."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address, CHANNEL_OPTIONS)
        self._call = self._channel.stream_stream(REPLICATE_METHOD)(wait_for_ready=True)
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        #: Offset -> the future the follower's Ack of that offset resolves.
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._alive = True
        self._tasks = [
            asyncio.create_task(self._write_appends()),
            asyncio.create_task(self._read_acks()),
        ]

    def send(self, offset: int, append: bytes) -> asyncio.Future[None] | None:
        """Queues the Append of entry `offset`; the future its Ack resolves (None: lost)."""
        if not self._alive:
            return None
        acked = self._waiting[offset] = asyncio.get_running_loop().create_future()
        self._outbox.put_nowait(append)
        return acked

    async def _write_appends(self) -> None:
        try:
            while True:
                await self._call.write(await self._outbox.get())
        except (grpc.RpcError, grpc.aio.UsageError):
            self._lost()

    async def _read_acks(self) -> None:
        try:
            while (message := await self._call.read()) is not grpc.aio.EOF:
                (offset,) = _OFFSET.unpack(message)
                for acked in [o for o in self._waiting if o <= offset]:
                    self._waiting.pop(acked).set_result(None)
        except grpc.RpcError:
            pass
        self._lost()

    def _lost(self) -> None:
        """Its pending entries wait on the other copies instead (see _durable_on_majority)."""
        self._alive = False
        self._waiting.clear()


async def _durable_on_majority(
    local: Awaitable[None], acks: list[asyncio.Future[None] | None]
) -> None:
    """Returns once two of the three copies are durable: the leader's and one follower's,
    or both followers' (the leader's fsync goes on meanwhile). A lost follower's copy
    (None, or a future that stays pending) is never counted."""
    pending: set[asyncio.Future[None]] = {asyncio.ensure_future(local)}
    pending.update(ack for ack in acks if ack is not None)
    durable = 0
    while durable < 2:
        if not pending:  # both followers are lost: no majority will ever be durable
            await asyncio.Future()
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        durable += len(done)


async def _serve(port: int, log_path: Path, followers: list[str]) -> None:
    log = _Log(log_path)
    server = grpc.aio.server()
    if followers:
        streams = [_FollowerStream(address) for address in followers]
        offsets = itertools.count()

        async def write(
            request: oxia_pb.WriteRequest, context: grpc.aio.ServicerContext
        ) -> oxia_pb.WriteResponse:
            puts = plain_puts(request)
            assert puts is not None, "the floor takes plain puts only"
            payload = ipc_bytes(pa.record_batch([puts.keys, puts.values], names=["key", "value"]))
            offset = next(offsets)
            append = _OFFSET.pack(offset) + payload
            acks = [stream.send(offset, append) for stream in streams]
            await _durable_on_majority(log.append(payload), acks)
            first = offset * 1_000_000
            return oxia_pb.WriteResponse(
                puts=[
                    oxia_pb.PutResponse(version=oxia_pb.Version(version_id=first + i))
                    for i in range(len(puts.keys))
                ]
            )

        async def write_stream(
            requests: AsyncIterator[oxia_pb.WriteRequest], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[oxia_pb.WriteResponse]:
            async for request in requests:
                yield await write(request, context)

        handlers = {
            "Write": grpc.unary_unary_rpc_method_handler(
                write,
                request_deserializer=oxia_pb.WriteRequest.FromString,
                response_serializer=oxia_pb.WriteResponse.SerializeToString,
            ),
            "WriteStream": grpc.stream_stream_rpc_method_handler(
                write_stream,
                request_deserializer=oxia_pb.WriteRequest.FromString,
                response_serializer=oxia_pb.WriteResponse.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("floor.Leader", handlers),)
        )
    else:

        async def replicate(
            appends: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            async for append in appends:
                await log.append(memoryview(append)[_OFFSET.size :])
                yield append[: _OFFSET.size]

        handlers = {"Replicate": grpc.stream_stream_rpc_method_handler(replicate)}
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("floor.Follower", handlers),)
        )
    server.add_insecure_port(f"{LOCALHOST}:{port}")
    await server.start()
    await server.wait_for_termination()


class FloorCluster(ProcessCluster):
    """Two floor followers and a floor leader on loopback; logs live in `base_dir`."""

    def __init__(self, base_dir: Path) -> None:
        super().__init__()
        self._base = base_dir
        ports = _free_ports(FLOOR_NODES)
        self.leader = f"{LOCALHOST}:{ports[0]}"
        self._followers = [f"{LOCALHOST}:{p}" for p in ports[1:]]

    def __enter__(self) -> Self:
        self._base.mkdir(parents=True, exist_ok=True)
        try:
            for address in [*self._followers, self.leader]:
                port = address.rpartition(":")[2]
                argv = [sys.executable, __file__, "--serve-node", port, str(self._base)]
                if address == self.leader:
                    argv += self._followers
                with open(self._base / f"node-{port}.log", "ab") as out:
                    self._procs[address] = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def check_alive(self) -> None:
        for address, proc in self._procs.items():
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"floor node {address} exited with code {proc.returncode}; "
                    f"see its log in {self._base}"
                )

    def pids(self) -> dict[int, int]:
        """The followers', then the leader's."""
        return {i: p.pid for i, p in enumerate(self._procs.values()) if p is not None}


class FloorClient:
    """Batches concurrent puts as `AsyncClient` does with its defaults: one batch in
    flight, and the puts that arrive meanwhile go together as the next one.

    Each batch is a unary `Write` call (as `AsyncClient` sends it), or with `streamed`
    a message on one long-lived `WriteStream`, answered in order."""

    def __init__(self, leader: str, *, streamed: bool = False) -> None:
        self._channel = grpc.aio.insecure_channel(leader, CHANNEL_OPTIONS)
        self._unary = self._channel.unary_unary(
            WRITE_METHOD,
            request_serializer=oxia_pb.WriteRequest.SerializeToString,
            response_deserializer=oxia_pb.WriteResponse.FromString,
        )
        self._streamed = streamed
        self._stream: grpc.aio.StreamStreamCall | None = None
        self._queued: list[tuple[str, bytes, asyncio.Future[int]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def put(self, key: bytes, value: bytes) -> int:
        """Version id of the put, once a majority has it durably."""
        done = asyncio.get_running_loop().create_future()
        self._queued.append((key.decode(), value, done))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send())
        return await done

    async def _send(self) -> None:
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                request = oxia_pb.WriteRequest(
                    shard=0, puts=[oxia_pb.PutRequest(key=k, value=v) for k, v, _ in batch]
                )
                try:
                    response = await self._write(request)
                except (grpc.RpcError, ConnectionError) as e:
                    for *_, done in batch:
                        done.set_exception(e)
                    continue
                for (*_, done), put in zip(batch, response.puts):
                    done.set_result(put.version.version_id)
        finally:
            self._sender = None

    async def _write(self, request: oxia_pb.WriteRequest) -> oxia_pb.WriteResponse:
        if not self._streamed:
            return await self._unary(request, timeout=WRITE_TIMEOUT_S, wait_for_ready=True)
        if self._stream is None:
            self._stream = self._channel.stream_stream(
                WRITE_STREAM_METHOD,
                request_serializer=oxia_pb.WriteRequest.SerializeToString,
                response_deserializer=oxia_pb.WriteResponse.FromString,
            )(wait_for_ready=True)
        try:
            await self._stream.write(request)
            response = await asyncio.wait_for(self._stream.read(), WRITE_TIMEOUT_S)
        except BaseException:
            self._stream.cancel()  # its answers may be out of step now: the next opens anew
            self._stream = None
            raise
        if response is grpc.aio.EOF:
            self._stream = None
            raise ConnectionError("the floor leader ended the WriteStream")
        return response

    async def close(self) -> None:
        await self._channel.close()


# ---------------------------------------------------------------------- measuring


async def run_floor(cluster: FloorCluster, args: argparse.Namespace, *, streamed: bool) -> Row:
    row = Row()
    client = FloorClient(cluster.leader, streamed=streamed)
    try:
        await asyncio.wait_for(client.put(b"bench/ready", b""), READY_TIMEOUT_S)
        cluster.check_alive()
        await _latency(client.put, args.latency_n, row)
        await _throughput(client.put, args.inflight, args.seconds, cluster, row)
    finally:
        await client.close()
    return row


async def run_etcd(cluster: EtcdCluster, args: argparse.Namespace) -> Row:
    row = Row()
    leader = cluster.leader_index()
    endpoints = cluster.client_endpoints()
    async with EtcdClient(endpoints[leader:] + endpoints[:leader]) as client:
        await _latency(client.put, args.latency_n, row)
        await _throughput(client.put, args.inflight, args.seconds, cluster, row)
    return row


async def run_quorumstore(cluster: QuorumstoreCluster, args: argparse.Namespace) -> Row:
    row = Row()
    async with AsyncClient(cluster.nodes[0]) as client:

        async def put(key: bytes, value: bytes) -> None:
            await client.put(key.decode(), value)

        await _latency(put, args.latency_n, row)
        await _throughput(put, args.inflight, args.seconds, cluster, row)
    return row


def print_report(
    etcd: Row, unary: Row, streamed: Row, client: Row, args: argparse.Namespace
) -> None:
    """The systems side by side, each one's ratio to etcd, and the verdict."""
    others = {"floor, Write": unary, "floor, WriteStream": streamed, "quorumstore client": client}
    rows = [
        (f"put latency p50 (1 client, n={args.latency_n})", "p50_ms", " ms", 2),
        (f"put latency p99 (1 client, n={args.latency_n})", "p99_ms", " ms", 2),
        (f"puts/s ({args.inflight} in flight, {args.seconds:g} s)", "puts_s", "", 0),
        (f"put latency p99 ({args.inflight} in flight)", "load_p99_ms", " ms", 2),
        ("CPU per put, nodes + driver (us)", "cpu_us", "", 0),
    ]
    table: list[tuple[str, ...]] = [
        ("", "etcd", *others, *(f"{name.split(', ')[-1]}/etcd" for name in others))
    ]
    for label, name, unit, digits in rows:
        theirs = getattr(etcd, name)
        ours = [getattr(row, name) for row in others.values()]
        table.append(
            (
                label,
                *(f"{v:.{digits}f}{unit}" for v in (theirs, *ours)),
                *(f"{v / theirs:.2f}x" if theirs else "-" for v in ours),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    print(
        f"replication floor: {FLOOR_NODES} processes each, majority commit, fsync on, 100-byte "
        f"values, loopback, {os.cpu_count()} CPUs"
    )
    print(
        "  floor = batched puts -> leader -> Arrow IPC -> 2 gRPC streams + fdatasync, no store, "
        "the batch sent as a unary Write or on a WriteStream; quorumstore client = AsyncClient"
    )
    for r in table:
        print(
            "  "
            + "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(r, widths))
            )
        )
    best = max(unary.puts_s, streamed.puts_s)
    best_x = best / etcd.puts_s if etcd.puts_s else float("inf")
    print(
        f"best floor puts/s = {best_x:.1f}x etcd ({'above' if best_x >= 5 else 'BELOW'} the 5x "
        f"bar); quorumstore client reaches {client.puts_s / unary.puts_s:.0%} of the Write "
        f"floor, {client.puts_s / best:.0%} of the best"
    )


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-node"]:
        port, base, *followers = argv[1:]
        event_loops.run(_serve(int(port), Path(base) / f"log-{port}", followers))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput run length")
    parser.add_argument("--latency-n", type=int, default=300, help="sequential puts timed")
    parser.add_argument("--inflight", type=int, default=64, help="puts in flight for throughput")
    parser.add_argument(
        "--dir", type=Path, default=None, help="parent of the temporary data directories"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.inflight < 1 or args.latency_n < 100:
        parser.error("--seconds and --inflight must be positive and --latency-n at least 100")
    etcd_binary()  # fails early, with what to install, when etcd is missing
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="replication-floor-", dir=args.dir) as base:
            with EtcdCluster(Path(base) / "etcd", members=FLOOR_NODES) as etcd_cluster:
                etcd_cluster.wait_ready()
                etcd = asyncio.run(_cancellable(run_etcd(etcd_cluster, args)))
            with FloorCluster(Path(base) / "floor-write") as floor_cluster:
                unary = asyncio.run(_cancellable(run_floor(floor_cluster, args, streamed=False)))
            with FloorCluster(Path(base) / "floor-write-stream") as floor_cluster:
                streamed = asyncio.run(_cancellable(run_floor(floor_cluster, args, streamed=True)))
            with QuorumstoreCluster(Path(base) / "quorumstore", 1) as qs_cluster:
                client = asyncio.run(_cancellable(run_quorumstore(qs_cluster, args)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every etcd, floor and quorumstore process was stopped", file=sys.stderr)
        return 130
    print_report(etcd, unary, streamed, client, args)
    print(f"(ran {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
