"""A storage node: a gRPC server hosting shard replicas.

It serves on two ports. The client port carries Oxia's `OxiaClient` (`oxia/`) and
the Arrow data service (`data/`); the internal port carries `NodeControl` (from the
coordinator, `control.py`) and `Replication` (between replicas,
`replication_service.py`), and admits only members of the cluster: mutual TLS with
the cluster's CA, or the cluster secret (`wire/membership.py`, docs/security.md). With
an auth config, every call of the client port carries a bearer token (`auth/check.py`).
It owns the clock (a tick task), the disk (one
directory per shard) and the network; the protocol itself lives in the engine each
`ShardHost` drives. The node's name is its identity in the cluster: the coordinator's
metadata places replicas on names. It is the client address by default; a node whose
address is decided where it runs (a Spark executor's host, a free port) has a name of
its own, and tells the coordinator where it is (`registration.py`). Peers and redirects
find a name's addresses through the coordinator (`NodeTransport.set_addresses`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pyarrow as pa

from quorumstore.archive.manifest import ArchiveError
from quorumstore.archive.restore import LatestRestore
from quorumstore.archive.shipper import ArchiveSettings, ArchiveShipper
from quorumstore.archive.store import ArchiveStore
from quorumstore.node import data_format
from quorumstore.node.auth.check import AuthConfig, TokenCheck
from quorumstore.node.call_limits import CallLimits
from quorumstore.node.control import NodeControl
from quorumstore.node.data.servicer import QuorumstoreDataServicer
from quorumstore.node.failures import ReplicaFailure
from quorumstore.node.limits import RequestLimits
from quorumstore.node.oxia.relay import DEFAULT_RELAY_TIMEOUT_MS
from quorumstore.node.oxia.servicer import OxiaClientServicer
from quorumstore.node.registration import keep_registered
from quorumstore.node.replication_service import Replication
from quorumstore.node.shard_host import ShardHost
from quorumstore.node.syncs import SyncRunner
from quorumstore.node.transport import NodeTransport
from quorumstore.node.wal_retention import WalRetention
from quorumstore.proto import oxia_client_pb2_grpc, quorumstore_data_pb2_grpc
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import Message, ShardKey
from quorumstore.protocol.replica import ReplicaConfig
from quorumstore.storage.replica_files import replica_dir
from quorumstore.storage.rocks_kv import DEFAULT_KV_MEMORY_BYTES, KvMemory
from quorumstore.wire import replication as wire
from quorumstore.wire.addresses import host_port
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.channels import SERVER_OPTIONS, client_port_options, listen
from quorumstore.wire.guards import RequestParsing
from quorumstore.wire.membership import Membership
from quorumstore.wire.tls import TlsConfig, check_plaintext_exposure, server_credentials

log = logging.getLogger(__name__)

#: A tick this much later than due is logged: the loop ran something too long.
_STALL_WARNING_S = 0.25


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    #: Port of node control and replication (0: any free one), on the same host.
    internal_port: int = 0
    #: Admits calls to the internal port (with or instead of `internal_tls`); with
    #: neither, the node serves on loopback only (`start` refuses any other host).
    cluster_secret: ClusterSecret | None = None
    #: Mutual TLS of the internal port and of calls to other members' internal ports.
    internal_tls: TlsConfig | None = None
    #: TLS of the client port, and what relayed calls check other nodes' client ports by.
    tls: TlsConfig | None = None
    #: Bearer tokens every call of the client port must carry, and the grants per
    #: namespace; None: the client port admits everyone who reaches it.
    auth: AuthConfig | None = None
    #: Address other nodes and clients use; defaults to host:bound port.
    advertise_host: str | None = None
    #: The node's member name; None: its client address.
    name: str | None = None
    #: The coordinator's registry (its internal address) to tell where this node is
    #: (`registration.py`); None: the coordinator is configured with the addresses.
    coordinator: str | None = None
    wal_sync: bool = True
    tick_ms: int = 50
    #: How much WAL each shard replica keeps once applied (see `WalRetention`).
    wal_retention: WalRetention = field(default_factory=WalRetention)
    #: Memory that all the node's RocksDB stores share: block cache and memtables (see
    #: `KvMemory`).
    kv_memory_bytes: int = DEFAULT_KV_MEMORY_BYTES
    #: How long a call relayed for a gateway-mode client waits for the shard's leader
    #: before it is retried at a new one or fails (see `node/oxia/relay.py`).
    relay_timeout_ms: int = DEFAULT_RELAY_TIMEOUT_MS
    #: What one request, connection and client may take of the client port (docs/limits.md).
    limits: RequestLimits = field(default_factory=RequestLimits)
    #: Where the shards this node leads are archived (an fsspec URL); None: nowhere.
    archive_url: str | None = None
    archive: ArchiveSettings = field(default_factory=ArchiveSettings)


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.name = ""
        #: Where clients reach this node.
        self.address = ""
        #: Where the coordinator and peers reach this node's internal port.
        self.internal_address = ""
        #: When the coordinator last pinged this node (monotonic seconds).
        self.last_ping_at = float("-inf")
        self.hosts: dict[ShardKey, ShardHost] = {}
        self.membership = Membership(config.cluster_secret, config.internal_tls)
        self.transport = NodeTransport(self, self.membership)
        self._io = ThreadPoolExecutor(max_workers=4, thread_name_prefix="qs-io")
        #: Bulk applies (see `ShardHost`), apart from the fsyncs so as not to delay them.
        self._apply = ThreadPoolExecutor(max_workers=2, thread_name_prefix="qs-apply")
        self._syncs = SyncRunner(self._io)
        self.kv_memory = KvMemory(config.kv_memory_bytes)
        self._server: grpc.aio.Server | None = None
        self._internal: grpc.aio.Server | None = None
        self._client_api: OxiaClientServicer | None = None
        self._data_api: QuorumstoreDataServicer | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self._registration: asyncio.Task[None] | None = None
        #: Ships the shards led here to `archive_url` (on threads of its own: an upload
        #: waiting on an unreachable archive must not hold the fsyncs).
        self.archive: ArchiveShipper | None = None
        self._archive_io: ThreadPoolExecutor | None = None
        self._archive_task: asyncio.Task[None] | None = None
        #: Set to the first ReplicaFailure of a shard hosted here (see `wait`).
        self._failure: asyncio.Future[None] | None = None
        self._assignments = pb.ShardAssignmentsUpdate(version=-1)
        #: The coordinator whose update `_assignments` is: versions are its own counter.
        self._assignments_from = ""
        self._assignments_event = asyncio.Event()
        self._report_sequence = 0
        #: One rebuild from the archive at a time (the coordinator repeats its call).
        self._rebuilding = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Binds the ports, opens the shards found on disk and starts serving; returns the
        node's client address."""
        config = self.config
        hosts = [config.host, config.advertise_host or config.host]
        self.membership.require_off_loopback(hosts, "a node")
        check_plaintext_exposure(
            hosts, config.tls, "a node's client port", tokens=config.auth is not None
        )
        try:
            self.config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(
                f"cannot use {self.config.data_dir} as the node's data directory: {e.strerror}"
            ) from None
        data_format.claim(self.config.data_dir)
        token_checks = [] if config.auth is None else [TokenCheck(config.auth, lambda: self.name)]
        self._server = grpc.aio.server(
            options=client_port_options(config.limits.max_request_bytes),
            interceptors=[
                *token_checks,
                CallLimits(config.limits, lambda: self.name),
                RequestParsing(),
            ],
        )
        self._internal = self.membership.server(SERVER_OPTIONS, lambda: self.name)
        pb_grpc.add_NodeControlServicer_to_server(NodeControl(self), self._internal)
        pb_grpc.add_ReplicationServicer_to_server(Replication(self), self._internal)
        self._client_api = OxiaClientServicer(
            self,
            relay_timeout_s=self.config.relay_timeout_ms / 1000,
            relay_tls=config.tls,
            request_limits=config.limits,
        )
        oxia_client_pb2_grpc.add_OxiaClientServicer_to_server(self._client_api, self._server)
        self._data_api = QuorumstoreDataServicer(
            self, self.config.data_dir / "data-staging", request_limits=config.limits
        )
        quorumstore_data_pb2_grpc.add_QuorumstoreDataServicer_to_server(
            self._data_api, self._server
        )
        port = listen(self._server, config.host, config.port, server_credentials(config.tls))
        internal_port = self.membership.listen(self._internal, config.host, config.internal_port)
        self.address = host_port(config.advertise_host or config.host, port)
        self.name = config.name or self.address
        self.internal_address = host_port(config.advertise_host or config.host, internal_port)
        self.transport.set_addresses({self.name: self.internal_address}, {self.name: self.address})
        _import_pyarrow_pandas_shim()
        if config.archive_url is not None:
            self._archive_io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qs-archive")
            self.archive = ArchiveShipper(
                ArchiveStore(config.archive_url),
                config.archive,
                lambda: list(self.hosts.values()),
                self._archive_io,
                self.name,
            )
        self._failure = asyncio.get_running_loop().create_future()
        self._open_existing_shards()
        await self._server.start()
        await self._internal.start()
        self._tick_task = asyncio.get_running_loop().create_task(self._tick_loop())
        if self.archive is not None:
            self._archive_task = asyncio.get_running_loop().create_task(self.archive.run())
        if config.coordinator is not None:
            self._registration = asyncio.get_running_loop().create_task(
                keep_registered(self, config.coordinator, self.membership)
            )
        log.info(
            "node %s serving on %s (internal port at %s, data in %s)",
            self.name,
            self.address,
            self.internal_address,
            self.config.data_dir,
        )
        return self.address

    async def stop(self) -> None:
        for task in (self._tick_task, self._registration, self._archive_task):
            if task is not None:
                task.cancel()
        for server in (self._server, self._internal):
            if server is not None:
                await server.stop(grace=0.5)
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
        if self._archive_io is not None:
            # An upload may hang on an unreachable archive; the archive never needs it.
            self._archive_io.shutdown(wait=False, cancel_futures=True)

    async def wait(self) -> None:
        """Returns when the server stops; raises ReplicaFailure once a shard replica here
        failed, after which the node must be stopped (and may be started again)."""
        assert self._server is not None and self._internal is not None
        assert self._failure is not None
        # Shielded: cancelling gRPC's own wait would cancel the future its shutdown awaits.
        servers = [
            asyncio.shield(server.wait_for_termination())
            for server in (self._server, self._internal)
        ]
        try:
            await asyncio.wait([*servers, self._failure], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for server in servers:
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
        return replica_dir(self.config.data_dir, shard)

    def _open_existing_shards(self) -> None:
        root = self.config.data_dir / "shards"
        if not root.exists():
            return
        for ns_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            for shard_dir in sorted(p for p in ns_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                self.open_host((ns_dir.name, int(shard_dir.name)))

    async def rebuild_from_archive(self, restore: LatestRestore) -> None:
        """Builds this node's replicas by `restore`, the coordinator's plan for a cluster
        whose every disk was lost, and opens them; ArchiveError if this node cannot (it
        holds replicas, or archives elsewhere). Done once: a repeated call returns."""
        async with self._rebuilding:
            data_dir = self.config.data_dir
            if restore.rebuilt(data_dir):
                return
            if restore.archive_url != self.config.archive_url:
                raise ArchiveError(
                    f"the coordinator restores from the archive at {restore.archive_url}, and "
                    f"node {self.name} archives to {self.config.archive_url or 'nothing'}: give "
                    "the node and the coordinator the same --archive-url"
                )
            if self.hosts:
                raise ArchiveError(
                    f"node {self.name} holds replicas already; a restore never mixes with data "
                    "it did not write"
                )
            log.warning("node %s: rebuilding its replicas from %s", self.name, restore.archive_url)
            await asyncio.get_running_loop().run_in_executor(
                self._io,
                restore.rebuild_running_member,
                self.name,
                data_dir,
                lambda line: log.warning("node %s: restore: %s", self.name, line),
            )
            self._open_existing_shards()

    def open_host(self, shard: ShardKey) -> ShardHost:
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
            archive_gate=self.archive.archived
            if self.archive is not None and self.config.archive.sync
            else None,
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
        """Returns once the table held is another than the one of `version` (a new
        coordinator's may have a lower version)."""
        while self._assignments.version == version:
            self._assignments_event.clear()
            await self._assignments_event.wait()

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def set_assignments(self, update: pb.ShardAssignmentsUpdate, coordinator: str) -> None:
        """Takes `update` if it is newer than the table held, or from another coordinator
        than it (a coordinator numbers its own versions: one started on new metadata
        counts from the start again). Every push comes through the authenticated
        internal port, so `coordinator` is a member's word."""
        if coordinator != self._assignments_from or update.version > self._assignments.version:
            self._assignments = update
            self._assignments_from = coordinator
            self._assignments_event.set()

    def health_report(self, ping_sequence: int) -> pb.HealthReport:
        self._report_sequence += 1
        self.last_ping_at = time.monotonic()
        return pb.HealthReport(
            node_name=self.name,
            client_address=self.address,
            internal_address=self.internal_address,
            sequence=self._report_sequence,
            ping_sequence=ping_sequence,
            shards=[self._shard_status(h) for _, h in sorted(self.hosts.items())],
        )

    def _shard_status(self, host: ShardHost) -> pb.ShardStatus:
        status = wire.shard_status_to_pb(host.replica.status())
        if self.archive is not None and host.is_leader():
            lag = self.archive.lag(host)
            status.archive.CopyFrom(
                pb.ArchiveStatus(
                    archived_offset=lag.archived_offset,
                    lag_entries=lag.entries,
                    lag_seconds=lag.seconds,
                    error=lag.error,
                )
            )
        return status


def _import_pyarrow_pandas_shim() -> None:
    """pyarrow imports pandas, when installed, on its first `pa.array` call: a fraction of
    a second of CPU that would stall the event loop at a node's first write, long enough
    for the coordinator to replace a healthy leader. Paid here, before serving, instead."""
    pa.array([], pa.int8())
