"""A storage node: a gRPC server hosting shard replicas.

It serves three services on one port: `NodeControl` (from the coordinator),
`Replication` (between replicas) and Oxia's `OxiaClient` (for clients). It owns the
clock (a tick task), the disk (one directory per shard) and the network; the protocol
itself lives in the engine each `ShardHost` drives.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pyarrow as pa

from quorumstore import wire
from quorumstore.addresses import host_port
from quorumstore.node import data_format
from quorumstore.node.aborts import abort
from quorumstore.node.client_api import OxiaClientServicer
from quorumstore.node.data_api import QuorumstoreDataServicer
from quorumstore.node.failures import ReplicaFailure
from quorumstore.node.outbox import Outbox
from quorumstore.node.shard_host import ShardHost, WalRetention
from quorumstore.node.snapshot_streams import finished_snapshot_level
from quorumstore.node.syncs import SyncRunner
from quorumstore.node.transport import SERVER_OPTIONS, NodeTransport, listen
from quorumstore.proto import oxia_client_pb2_grpc, quorumstore_data_pb2_grpc
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import (
    BecomeLeaderResponse,
    Message,
    NewTermResponse,
    ShardKey,
    TruncateResponse,
)
from quorumstore.protocol.replica import ReplicaConfig
from quorumstore.storage.kv import DEFAULT_KV_MEMORY_BYTES, KvMemory, RocksKv
from quorumstore.storage.snapshot import install_snapshot

log = logging.getLogger(__name__)

#: How long a NodeControl call waits for the engine's durable answer.
_REPLY_TIMEOUT_S = 5.0
#: Snapshot chunks received but not yet written to the staging KV (backpressure bound).
_SNAPSHOT_CHUNKS_BUFFERED = 4
#: A tick this much later than due is logged: the loop ran something too long.
_STALL_WARNING_S = 0.25


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    #: Address other nodes and clients use; defaults to host:bound port.
    advertise_host: str | None = None
    wal_sync: bool = True
    tick_ms: int = 50
    #: How much WAL each shard replica keeps once applied (see `WalRetention`).
    wal_retention: WalRetention = field(default_factory=WalRetention)
    #: Memory that all the node's RocksDB stores share: block cache and memtables (see
    #: `KvMemory`).
    kv_memory_bytes: int = DEFAULT_KV_MEMORY_BYTES


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.name = ""
        self.hosts: dict[ShardKey, ShardHost] = {}
        self.transport = NodeTransport(self)
        self._io = ThreadPoolExecutor(max_workers=4, thread_name_prefix="qs-io")
        #: Bulk applies (see `ShardHost`), apart from the fsyncs so as not to delay them.
        self._apply = ThreadPoolExecutor(max_workers=2, thread_name_prefix="qs-apply")
        self._syncs = SyncRunner(self._io)
        self.kv_memory = KvMemory(config.kv_memory_bytes)
        self._server: grpc.aio.Server | None = None
        self._client_api: OxiaClientServicer | None = None
        self._data_api: QuorumstoreDataServicer | None = None
        self._tick_task: asyncio.Task[None] | None = None
        #: Set to the first ReplicaFailure of a shard hosted here (see `wait`).
        self._failure: asyncio.Future[None] | None = None
        self._assignments = pb.ShardAssignmentsUpdate(version=-1)
        self._assignments_event = asyncio.Event()
        self._report_sequence = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Binds the port, opens the shards found on disk and starts serving; returns the address."""
        try:
            self.config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(
                f"cannot use {self.config.data_dir} as the node's data directory: {e.strerror}"
            ) from None
        data_format.claim(self.config.data_dir)
        self._server = grpc.aio.server(options=SERVER_OPTIONS)
        pb_grpc.add_NodeControlServicer_to_server(_NodeControl(self), self._server)
        pb_grpc.add_ReplicationServicer_to_server(_Replication(self), self._server)
        self._client_api = OxiaClientServicer(self)
        oxia_client_pb2_grpc.add_OxiaClientServicer_to_server(self._client_api, self._server)
        self._data_api = QuorumstoreDataServicer(self, self.config.data_dir / "data-staging")
        quorumstore_data_pb2_grpc.add_QuorumstoreDataServicer_to_server(
            self._data_api, self._server
        )
        port = listen(self._server, self.config.host, self.config.port)
        self.name = host_port(self.config.advertise_host or self.config.host, port)
        _import_pyarrow_pandas_shim()
        self._failure = asyncio.get_running_loop().create_future()
        self._open_existing_shards()
        await self._server.start()
        self._tick_task = asyncio.get_running_loop().create_task(self._tick_loop())
        log.info("node %s serving (data in %s)", self.name, self.config.data_dir)
        return self.name

    async def stop(self) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
        if self._server is not None:
            await self._server.stop(grace=0.5)
        for service in (self._client_api, self._data_api):
            if service is not None:
                await service.close()
        await self.transport.close()
        for host in self.hosts.values():
            try:
                host.close()
            except Exception:  # the other shards still get closed
                log.exception("node %s: closing shard %s failed", self.name, host.shard)
        self._io.shutdown(wait=True)
        self._apply.shutdown(wait=True)

    async def wait(self) -> None:
        """Returns when the server stops; raises ReplicaFailure once a shard replica here
        failed, after which the node must be stopped (and may be started again)."""
        assert self._server is not None and self._failure is not None
        # Shielded: cancelling gRPC's own wait would cancel the future its shutdown awaits.
        server = asyncio.shield(self._server.wait_for_termination())
        try:
            await asyncio.wait([server, self._failure], return_when=asyncio.FIRST_COMPLETED)
        finally:
            server.cancel()
        if self._failure.done():
            self._failure.result()

    def _replica_failed(self, failure: ReplicaFailure) -> None:
        assert self._failure is not None
        if not self._failure.done():
            self._failure.set_exception(failure)

    async def _tick_loop(self) -> None:
        interval = self.config.tick_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(interval)
            late = loop.time() - started - interval
            if late > _STALL_WARNING_S:
                log.warning(
                    "node %s: event loop stalled %.0f ms; health reports to the coordinator wait "
                    "meanwhile, and a long enough stall gets the shards this node leads re-elected",
                    self.name,
                    late * 1000,
                )
            for host in list(self.hosts.values()):
                host.tick()

    # ------------------------------------------------------------------ shards

    def _shard_dir(self, shard: ShardKey) -> Path:
        return self.config.data_dir / "shards" / shard[0] / str(shard[1])

    def _open_existing_shards(self) -> None:
        root = self.config.data_dir / "shards"
        if not root.exists():
            return
        for ns_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            for shard_dir in sorted(p for p in ns_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                self._open_host((ns_dir.name, int(shard_dir.name)))

    def _open_host(self, shard: ShardKey) -> ShardHost:
        host = ShardHost(
            self.name,
            shard,
            self._shard_dir(shard),
            self.transport,
            self._io,
            apply_executor=self._apply,
            syncs=self._syncs,
            on_failure=self._replica_failed,
            wal_sync=self.config.wal_sync,
            replica_config=ReplicaConfig(),
            retention=self.config.wal_retention,
            kv_memory=self.kv_memory,
        )
        self.hosts[shard] = host
        return host

    def deliver(self, shard: ShardKey, msg: Message) -> None:
        host = self.hosts.get(shard)
        if host is not None:
            host.step(msg)

    # ------------------------------------------------------------------ ShardDirectory (client API)

    def shard_host(self, namespace: str, shard: int) -> ShardHost | None:
        return self.hosts.get((namespace, shard))

    def led_hosts(self) -> list[ShardHost]:
        """The shard replicas that lead their shard now."""
        return [host for host in self.hosts.values() if host.is_leader()]

    def assignments(self) -> pb.ShardAssignmentsUpdate:
        return self._assignments

    async def assignments_changed(self, version: int) -> None:
        while self._assignments.version <= version:
            self._assignments_event.clear()
            await self._assignments_event.wait()

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def set_assignments(self, update: pb.ShardAssignmentsUpdate) -> None:
        if update.version > self._assignments.version:
            self._assignments = update
            self._assignments_event.set()

    def health_report(self, ping_sequence: int) -> pb.HealthReport:
        self._report_sequence += 1
        return pb.HealthReport(
            node_name=self.name,
            sequence=self._report_sequence,
            ping_sequence=ping_sequence,
            shards=[
                wire.shard_status_to_pb(h.replica.status()) for _, h in sorted(self.hosts.items())
            ],
        )


def _import_pyarrow_pandas_shim() -> None:
    """pyarrow imports pandas, when installed, on its first `pa.array` call: 0.3 s of CPU
    (0.5-0.65 s measured with three nodes on two cores) that stalled the event loop at a
    node's first write, long enough for the coordinator to replace a healthy leader.
    Paid here, before serving, instead."""
    pa.array([], pa.int8())


async def _await_reply(future: asyncio.Future, context: grpc.aio.ServicerContext, what: str):
    try:
        return await asyncio.wait_for(future, _REPLY_TIMEOUT_S)
    except TimeoutError:
        await abort(
            context,
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{what} was not accepted (stale term or wrong state); the coordinator retries with a fresh term",
        )


class _NodeControl(pb_grpc.NodeControlServicer):
    def __init__(self, node: Node):
        self.node = node

    async def NewTerm(
        self, request: pb.NewTermRequest, context: grpc.aio.ServicerContext
    ) -> pb.NewTermResponse:
        shard = (request.namespace, request.shard)
        host = self.node.hosts.get(shard) or self.node._open_host(shard)
        reply = self.node.transport.expect(NewTermResponse, shard)
        host.step(wire.new_term_from_pb(request))
        response = await _await_reply(reply, context, f"NewTerm {request.term} for {shard}")
        return wire.new_term_response_to_pb(response)

    async def BecomeLeader(
        self, request: pb.BecomeLeaderRequest, context: grpc.aio.ServicerContext
    ) -> pb.BecomeLeaderResponse:
        shard = (request.namespace, request.shard)
        host = self.node.hosts.get(shard)
        if host is None:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"shard {shard} is not hosted on {self.node.name}",
            )
        reply = self.node.transport.expect(BecomeLeaderResponse, shard)
        host.step(wire.become_leader_from_pb(request))
        response = await _await_reply(reply, context, f"BecomeLeader {request.term} for {shard}")
        return wire.become_leader_response_to_pb(response)

    async def AddFollower(
        self, request: pb.AddFollowerRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddFollowerResponse:
        self.node.deliver((request.namespace, request.shard), wire.add_follower_from_pb(request))
        return pb.AddFollowerResponse()

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatusResponse:
        host = self.node.hosts.get((request.namespace, request.shard))
        if host is None:
            return pb.GetStatusResponse(
                namespace=request.namespace, shard=request.shard, role=pb.NOT_MEMBER, term=-1
            )
        s = wire.shard_status_to_pb(host.replica.status())
        return pb.GetStatusResponse(
            namespace=s.namespace,
            shard=s.shard,
            term=s.term,
            role=s.role,
            head=s.head,
            commit_offset=s.commit_offset,
            followers=s.followers,
        )

    async def Health(
        self, request_iterator: AsyncIterator[pb.HealthPing], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.HealthReport]:
        async for ping in request_iterator:
            yield self.node.health_report(ping.ping_sequence)

    async def PushShardAssignments(
        self, request: pb.ShardAssignmentsUpdate, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        self.node.set_assignments(request)
        return pb.Empty()


class _SnapshotStager:
    """Writes one snapshot stream's chunks into a fresh KV on a worker thread as they
    arrive, holding at most `_SNAPSHOT_CHUNKS_BUFFERED` of them in memory."""

    def __init__(self, directory: Path, memory: KvMemory) -> None:
        self.directory = directory
        self._memory = memory
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=_SNAPSHOT_CHUNKS_BUFFERED)
        self._staged = asyncio.get_running_loop().run_in_executor(None, self._stage)

    def _stage(self) -> None:
        kv = RocksKv(self.directory, self._memory)
        try:
            install_snapshot(kv, iter(self._chunks.get, None))
        finally:
            kv.close()

    @property
    def stopped(self) -> bool:
        """The stager ended before being told the stream ended: it failed."""
        return self._staged.done()

    async def feed(self, data: bytes | None) -> None:
        """Hands one chunk (None: the end) over, waiting while the stager is behind; drops
        it if the stager already stopped (it failed, and `finish` says why)."""
        while not self._staged.done():
            try:
                self._chunks.put_nowait(data)
                return
            except queue.Full:
                await asyncio.sleep(0.005)

    async def finish(self) -> None:
        """Ends the stream; raises what made staging fail."""
        await self.feed(None)
        await self._staged

    async def abandon(self) -> None:
        """The stream broke: stops the stager and deletes what it staged once it stopped."""
        await self.feed(None)
        self._staged.add_done_callback(self._discard)

    def _discard(self, staged: asyncio.Future[None]) -> None:
        if not staged.cancelled() and staged.exception() is not None:
            log.info("staging of a broken snapshot stream stopped: %s", staged.exception())
        shutil.rmtree(self.directory, ignore_errors=True)


class _Replication(pb_grpc.ReplicationServicer):
    def __init__(self, node: Node):
        self.node = node

    async def _refuse_another_format(self, context: grpc.aio.ServicerContext) -> None:
        """Ends a call whose data is in another format than this node's (see data_format)."""
        theirs = data_format.peer_format(context.invocation_metadata())
        if theirs != data_format.DATA_FORMAT:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                data_format.refusal_message(self.node.name, theirs),
                data_format.REPLICATION_METADATA,
            )

    async def Replicate(
        self, request_iterator: AsyncIterator[pb.Append], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Ack]:
        await self._refuse_another_format(context)
        transport = self.node.transport
        acks: Outbox[pb.Ack] = Outbox(transport.acks_written)
        keys: set[tuple[ShardKey, str]] = set()

        async def read() -> None:
            try:
                async for append in request_iterator:
                    shard = (append.namespace, append.shard)
                    key = (shard, append.leader_name)
                    if transport.inbound.get(key) is not acks:
                        transport.inbound[key] = acks
                        keys.add(key)
                    self.node.deliver(shard, wire.append_from_pb(append))
            finally:
                acks.close()

        reader = asyncio.get_running_loop().create_task(read())
        try:
            async for ack in acks.messages():
                yield ack
        finally:
            reader.cancel()
            for key in keys:
                if transport.inbound.get(key) is acks:
                    del transport.inbound[key]
            acks.drop()

    async def Truncate(
        self, request: pb.TruncateRequest, context: grpc.aio.ServicerContext
    ) -> pb.TruncateResponse:
        await self._refuse_another_format(context)
        shard = (request.namespace, request.shard)
        host = self.node.hosts.get(shard)
        if host is None:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"shard {shard} is not hosted on {self.node.name}",
            )
        reply = self.node.transport.expect(TruncateResponse, shard, request.leader_name)
        host.step(wire.truncate_from_pb(request))
        response = await _await_reply(reply, context, f"Truncate for {shard}")
        return wire.truncate_response_to_pb(response)

    async def SendSnapshot(
        self, request_iterator: AsyncIterator[pb.SnapshotChunk], context: grpc.aio.ServicerContext
    ) -> pb.SnapshotResponse:
        """Stages the streamed snapshot into a fresh KV as it arrives, then installs it."""
        await self._refuse_another_format(context)
        first: pb.SnapshotChunk | None = None
        host: ShardHost | None = None
        stager: _SnapshotStager | None = None
        started = time.monotonic()
        received = 0
        try:
            async for chunk in request_iterator:
                received += len(chunk.data)
                if first is None:
                    first = chunk
                    shard = (chunk.namespace, chunk.shard)
                    host = self.node.hosts.get(shard)
                    if host is None or not host.can_install_snapshot(chunk.term, chunk.leader_name):
                        await abort(
                            context,
                            grpc.StatusCode.FAILED_PRECONDITION,
                            f"not accepting a snapshot for {shard} in term {chunk.term}",
                        )
                    stager = _SnapshotStager(host.staging_directory(), self.node.kv_memory)
                else:
                    assert host is not None
                    if not host.can_install_snapshot(first.term, first.leader_name):
                        # A newer term began meanwhile and the install would be refused:
                        # stop staging a snapshot nobody can use, rather than write the rest.
                        await abort(
                            context,
                            grpc.StatusCode.FAILED_PRECONDITION,
                            f"snapshot for {shard} from {first.leader_name} in term "
                            f"{first.term} superseded: the replica is now in term "
                            f"{host.replica.term}",
                        )
                assert stager is not None
                await stager.feed(chunk.data)
                if stager.stopped:
                    break  # staging failed: no use reading the rest
        except BaseException:
            if stager is not None:
                await stager.abandon()
            raise
        if first is None or host is None or stager is None:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "empty snapshot stream")
        try:
            await stager.finish()
        except Exception as e:  # noqa: BLE001 - any staging failure is the sender's DATA_LOSS
            shutil.rmtree(stager.directory, ignore_errors=True)
            await abort(context, grpc.StatusCode.DATA_LOSS, f"snapshot could not be staged: {e}")
        staging = stager.directory
        position = wire.position_from_pb(first.position)
        head = host.install_staged_snapshot(first.term, first.leader_name, position, staging)
        log.log(
            finished_snapshot_level(received),
            "shard %s/%s: received a snapshot at offset %d from %s (%.1f MiB, %.1f s); "
            "the replica's log now ends at offset %d",
            first.namespace,
            first.shard,
            position.offset,
            first.leader_name,
            received / (1 << 20),
            time.monotonic() - started,
            head.offset,
        )
        return pb.SnapshotResponse(
            namespace=first.namespace,
            shard=first.shard,
            term=host.replica.term,
            head=wire.position_to_pb(head),
        )
