"""The coordinator process: the `Coordinator` engine bound to gRPC, a clock and durable metadata.

It keeps one Health stream per node (a broken stream marks the node failed at once,
so a dead leader is replaced within a few ticks), sends NodeControl calls and feeds
their answers back to the engine, persists metadata before any message that depends
on it leaves, and pushes the shard assignment table to every node when it changes.

Nodes are named by their member names (the metadata places replicas on names); a name
is the node's client address unless the node has a name of its own. The coordinator
keeps each name's current addresses (`_AddressBook`): configured, or told by the node
itself through the `CoordinatorRegistry` service when its address is decided where it
runs (a Spark executor's host and a free port). It reaches each node at its internal
address, with the cluster secret or mutual TLS on every call, hands every name's
addresses to every node on its health stream (leaders reach their followers and
redirect clients by them), and routes clients by client address. A node that moves
gets a new link and the routing table follows.

It holds its metadata location while it runs (one coordinator per location), and
rebuilds missing metadata from its configuration once the nodes' first health reports
show that the replicas fit it: the shards then elect above the terms the replicas are
in, the replica with the longest log leading.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc

from quorumstore.archive.store import ArchiveStore
from quorumstore.backoff import DoublingBackoff
from quorumstore.coordinator.archive_recovery import ArchiveRecovery
from quorumstore.coordinator.failure_timeout import (
    DEFAULT_FAILURE_TIMEOUT_MS,
    DEFAULT_TICK_MS,
    check_failure_timeout,
    failure_ticks,
)
from quorumstore.coordinator.metadata_store import (
    MetadataError,
    MetadataStore,
    MetadataTaken,
)
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.coordinator import (
    ClusterMetadata,
    Coordinator,
    CoordinatorConfig,
    initial_metadata,
    placed_nodes,
)
from quorumstore.protocol.messages import (
    AddFollower,
    BecomeLeader,
    NewTerm,
    NodeStatus,
    NodeUnreachable,
    ShardKey,
    StatusRequest,
)
from quorumstore.wire import replication as wire
from quorumstore.wire.addresses import host_of, host_port, is_host_port
from quorumstore.wire.auth import COORDINATOR_METADATA_KEY, ClusterSecret, is_loopback
from quorumstore.wire.channels import SERVER_OPTIONS, listen
from quorumstore.wire.membership import Membership
from quorumstore.wire.metadata import DEFAULT_NAMESPACE
from quorumstore.wire.tls import TlsConfig, check_plaintext_exposure, server_credentials

log = logging.getLogger(__name__)

#: Retry delays of a failed metadata save: the first, doubled up to the last.
SAVE_RETRY_FIRST_S = 0.1
SAVE_RETRY_MAX_S = 5.0
#: Without saved metadata, how long to wait for a node that neither reports nor refuses
#: the connection (unreachable nodes answer at once) before deciding without it whether
#: replicas exist: a node started later is then checked by its terms alone.
FIRST_REPORTS_WAIT_S = 3.0
#: Seconds between two copies of the metadata to the archive.
ARCHIVE_COPY_INTERVAL_S = 1.0
#: How long a node's health stream may fail to open before the coordinator says why.
UNREACHABLE_WARNING_S = 3.0


@dataclass(frozen=True)
class CoordinatorServerConfig:
    #: Member names of the nodes, in placement order.
    nodes: list[str]
    metadata_url: str
    #: Node name -> its internal address, where the coordinator and peers reach its
    #: NodeControl and Replication services; one for every node, unless nodes register.
    internal_addresses: dict[str, str]
    #: Carried by every call to a node; with neither it nor `internal_tls`, every
    #: address must be loopback.
    cluster_secret: ClusterSecret | None = None
    #: Mutual TLS of the calls to the nodes' internal ports.
    internal_tls: TlsConfig | None = None
    #: TLS of the status port.
    tls: TlsConfig | None = None
    namespaces: dict[str, int] = field(default_factory=lambda: {DEFAULT_NAMESPACE: 1})
    replication_factor: int = 3
    tick_ms: int = DEFAULT_TICK_MS
    #: How long a node may send no health report before it is taken for failed (a leader
    #: is then replaced). Longer rides out stalls such as a paused VM; shorter fails over
    #: sooner. Rounded up to whole ticks.
    failure_timeout_ms: int = DEFAULT_FAILURE_TIMEOUT_MS
    #: Port of the CoordinatorAdmin service (status); None: not served.
    admin_host: str = "127.0.0.1"
    admin_port: int | None = None
    max_lag: int = 10_000
    #: Node name -> client address, for names that are not their client address.
    client_addresses: dict[str, str] = field(default_factory=dict)
    #: Where the `CoordinatorRegistry` serves (an internal port: members only); None:
    #: every node's addresses are configured.
    registry_host: str = "127.0.0.1"
    registry_port: int | None = None
    #: Without saved metadata, how long to wait for every node's first report before
    #: deciding without the silent ones whether replicas exist.
    first_reports_wait_s: float = FIRST_REPORTS_WAIT_S
    #: The cluster's archive (docs/archive.md): the metadata is copied there, and taken
    #: from there when `metadata_url` holds none.
    archive_url: str | None = None

    def __post_init__(self) -> None:
        check_failure_timeout(self.failure_timeout_ms, self.tick_ms)
        repeated = sorted({node for node in self.nodes if self.nodes.count(node) > 1})
        if repeated:
            raise ValueError(
                f"the nodes (--nodes) list {', '.join(repeated)} more than once; each replica "
                "of a shard must be on a node of its own, so give each node's address once"
            )
        missing = [n for n in self.nodes if n not in self.internal_addresses]
        if missing and self.registry_port is None:
            raise ValueError(f"no internal address given for {', '.join(missing)}")
        internal = [self.internal_addresses[n] for n in self.nodes if n in self.internal_addresses]
        clash = sorted(
            {a for a in internal if internal.count(a) > 1} | set(internal) & set(self.nodes)
        )
        if clash:
            raise ValueError(
                "internal addresses must differ from each other and from the client addresses; "
                f"{', '.join(clash)} appears more than once"
            )

    @property
    def node_failure_ticks(self) -> int:
        return failure_ticks(self.failure_timeout_ms, self.tick_ms)


class _AddressBook:
    """Each node name's current client and internal addresses; `version` counts changes."""

    def __init__(self, config: CoordinatorServerConfig):
        self.internal = {
            n: config.internal_addresses[n] for n in config.nodes if n in config.internal_addresses
        }
        self.client = {n: config.client_addresses.get(n, n) for n in self.internal}
        self.version = 0

    def update(self, name: str, client: str, internal: str) -> bool:
        """Records where `name` is now; returns whether that changed anything."""
        if self.client.get(name) == client and self.internal.get(name) == internal:
            return False
        self.client[name] = client
        self.internal[name] = internal
        self.version += 1
        return True

    def describe(self, name: str) -> str:
        """`name` with its addresses, for messages."""
        client = self.client.get(name)
        if client is None:
            return f"{name} (not registered yet)"
        return name if client == name else f"{name} at {client}"


class _NodeLink:
    """The coordinator's connection to one node: a channel and its Health stream."""

    def __init__(self, server: CoordinatorServer, name: str, internal_address: str):
        self.server = server
        self.name = name
        self.internal_address = internal_address
        self.channel = server.membership.channel(internal_address)
        self.stub = pb_grpc.NodeControlStub(self.channel)
        self.metadata = server.call_metadata
        self.pings: asyncio.Queue[int] = asyncio.Queue()
        self.up = False
        self._sequence = itertools.count(1)
        self.task = asyncio.get_running_loop().create_task(self._health_loop())

    def ping(self) -> None:
        if self.up and self.pings.qsize() < 4:
            self.pings.put_nowait(next(self._sequence))

    async def _pings(self) -> AsyncIterator[pb.HealthPing]:
        """Pings; the first of a stream, and the first after any node moved, carry every
        node's addresses."""
        book = self.server.addresses
        sequence, sent_version = 0, -1
        while True:
            ping = pb.HealthPing(ping_sequence=sequence)
            if sent_version != book.version:
                sent_version = book.version
                ping.internal_addresses.update(book.internal)
                ping.client_addresses.update(book.client)
            yield ping
            sequence = await self.pings.get()

    async def _health_loop(self) -> None:
        while True:
            try:
                call = self.stub.Health(self._pings(), metadata=self.metadata)
                async for report in call:
                    if not self._is_mine(report):
                        call.cancel()
                        break
                    if not self.up:
                        self.up = True
                        self.server.unreachable.pop(self.name, None)
                        self.server.node_connected(self.name)
                    self.server.step(
                        NodeStatus(
                            self.name, tuple(wire.shard_status_from_pb(s) for s in report.shards)
                        )
                    )
                    self.server.remember_report(self.name, report)
            except grpc.aio.AioRpcError as e:
                log.debug("health stream to %s ended: %s", self.name, e.code())
                if e.code() == grpc.StatusCode.UNAUTHENTICATED and not self.up:
                    self.server.warn_once(
                        f"node {self.name} (internal address {self.internal_address}) refuses "
                        "this coordinator's cluster secret; give both the same --cluster-secret-file",
                    )
                elif not self.up and self.server.is_current(self):
                    self.server.note_unreachable(self, e)
            if not self.server.is_current(self):
                return  # a new registration replaced this link; it is being closed
            if self.up:
                log.warning("lost node %s", self.server.addresses.describe(self.name))
            self.up = False
            while not self.pings.empty():
                self.pings.get_nowait()
            self.server.step(NodeUnreachable(self.name))
            await asyncio.sleep(0.2)

    def _is_mine(self, report: pb.HealthReport) -> bool:
        """Whether the node at the internal address is the node configured there."""
        if report.node_name == self.name and report.internal_address == self.internal_address:
            return True
        self.server.warn_once(
            f"the node at {self.internal_address} says it is {report.node_name or '(unnamed)'} with "
            f"internal address {report.internal_address or '(none)'}, not {self.name} at "
            f"{self.internal_address} as configured; it is not used until the configuration matches",
        )
        return False

    async def close(self) -> None:
        self.task.cancel()
        await self.channel.close()


class CoordinatorServer:
    def __init__(self, config: CoordinatorServerConfig):
        self.config = config
        self.store = MetadataStore(config.metadata_url)
        self.archive = None if config.archive_url is None else ArchiveStore(config.archive_url)
        #: The metadata saved last and not yet copied to the archive.
        self._archive_pending: ClusterMetadata | None = None
        self._archive_wakeup = asyncio.Event()
        self.engine: Coordinator | None = None
        self._links: dict[str, _NodeLink] = {}
        self._reports: dict[str, pb.HealthReport] = {}
        #: Before the engine exists: each node's latest report, None if it was unreachable.
        self._early_reports: dict[str, NodeStatus | None] = {}
        self._all_answered = asyncio.Event()
        self._lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Set when the coordinator stops deciding on its own: another one took its
        #: metadata location (`deposed` says so).
        self.ended = asyncio.Event()
        self.deposed: MetadataTaken | None = None
        self._admin: grpc.aio.Server | None = None
        self.admin_address: str | None = None
        self._registry: grpc.aio.Server | None = None
        self.registry_address: str | None = None
        self.addresses = _AddressBook(config)
        #: Node name -> why the coordinator cannot reach it, while it cannot (and since when).
        self.unreachable: dict[str, tuple[float, str]] = {}
        #: Every call to a node names this coordinator, whose assignment versions a node
        #: compares only with its own, and carries the cluster secret.
        self.membership = Membership(config.cluster_secret, config.internal_tls)
        self.call_metadata = (
            (COORDINATOR_METADATA_KEY, uuid.uuid4().hex),
        ) + self.membership.metadata
        self._warned: set[str] = set()

    async def start(self) -> None:
        self.membership.require_off_loopback(
            [a.rpartition(":")[0] for a in self.config.internal_addresses.values()]
            + ([self.config.registry_host] if self.config.registry_port is not None else []),
            "the coordinator",
        )
        if self.config.admin_port is not None:
            check_plaintext_exposure(
                [self.config.admin_host], self.config.tls, "the coordinator's status port"
            )
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.store.hold)
        if self.store.lease is not None:
            self._spawn(self._lease_loop(self.store.lease.renew_every_s))
        try:
            await self.open_registry()
            await self._start_engine(loop)
            if self.config.admin_port is not None:
                self._admin = grpc.aio.server(options=SERVER_OPTIONS)
                pb_grpc.add_CoordinatorAdminServicer_to_server(_Admin(self), self._admin)
                port = listen(
                    self._admin,
                    self.config.admin_host,
                    self.config.admin_port,
                    server_credentials(self.config.tls),
                )
                self.admin_address = host_port(self.config.admin_host, port)
                await self._admin.start()
        except BaseException:
            await self.stop()
            raise

    async def open_registry(self) -> str | None:
        """Serves the `CoordinatorRegistry` (when configured) and returns its address;
        `start` does too, but nodes that must know the address before the coordinator
        starts (it waits for their first reports) get it from here first."""
        if self.config.registry_port is not None and self._registry is None:
            self._registry = self.membership.server(SERVER_OPTIONS, lambda: "coordinator")
            pb_grpc.add_CoordinatorRegistryServicer_to_server(_Registry(self), self._registry)
            port = self.membership.listen(
                self._registry, self.config.registry_host, self.config.registry_port
            )
            self.registry_address = host_port(self.config.registry_host, port)
            await self._registry.start()
        return self.registry_address

    async def _start_engine(self, loop: asyncio.AbstractEventLoop) -> None:
        """Loads or makes the metadata and starts the engine on it; the links report
        from the start, into `_early_reports` until the engine exists."""
        for name, internal in self.addresses.internal.items():
            self._links[name] = _NodeLink(self, name, internal)
        metadata = await loop.run_in_executor(None, self.store.load)
        if metadata is None and self.archive is not None:
            metadata = await ArchiveRecovery(
                self.archive,
                self.store,
                self._check_placed,
                lambda: self._early_reports,
                self._rebuild_from_archive,
            ).recover()
        if metadata is None:
            metadata = await self._new_metadata()
            await loop.run_in_executor(None, self.store.save, metadata)
        else:
            self._check_placed(metadata, f"coordinator metadata at {self.config.metadata_url}")
            _warn_on_other_namespaces(metadata, self.config)
            log.info(
                "resuming cluster metadata version %d from %s",
                metadata.version,
                self.config.metadata_url,
            )
        config = CoordinatorConfig(
            replication_factor=self.config.replication_factor,
            max_lag=self.config.max_lag,
            node_failure_ticks=self.config.node_failure_ticks,
        )
        self.engine = Coordinator(self.config.nodes, metadata, config)
        if self.archive is not None:
            self._archived(metadata)
            self._spawn(self._archive_loop(self.archive))
        for status in self._early_reports.values():
            if status is not None:
                self.engine.step(status)
        for link in self._links.values():
            if link.up:
                self.node_connected(link.name)
        self._spawn(self._tick_loop())
        self._spawn(self._process_loop())

    def _check_placed(self, metadata: ClusterMetadata, where: str) -> None:
        """Refuses `metadata` (from `where`) that places shards on unconfigured nodes."""
        missing = sorted(placed_nodes(metadata) - set(self.config.nodes))
        if missing:
            raise MetadataError(
                f"{where} places shards on {', '.join(missing)}, "
                f"which {'is' if len(missing) == 1 else 'are'} not among the configured nodes "
                f"({', '.join(self.config.nodes)}); quorumstore does not move shards between nodes, so start "
                "the nodes at the addresses they had, or use a new metadata location for a new cluster"
            )

    async def _rebuild_from_archive(
        self, node: str, request: pb.RebuildFromArchiveRequest
    ) -> pb.Empty:
        """Has `node` rebuild its replicas by a restore (`archive_recovery`): no deadline,
        as a large shard takes long to rebuild; keepalive notices a node that died."""
        return await self._links[node].stub.RebuildFromArchive(request, metadata=self.call_metadata)

    async def _new_metadata(self) -> ClusterMetadata:
        """Metadata for the configured cluster, checked against the replicas the nodes
        already hold: none for a new cluster; after a lost metadata file, the ones this
        configuration places on them, or the rebuilt metadata would route keys to the
        wrong shards."""
        metadata = initial_metadata(
            self.config.nodes, self.config.namespaces, self.config.replication_factor
        )
        try:
            await asyncio.wait_for(self._all_answered.wait(), self.config.first_reports_wait_s)
        except TimeoutError:
            pass
        reports = [status for status in self._early_reports.values() if status is not None]
        if check_replicas_fit(metadata, reports, self.config):
            log.warning(
                "no coordinator metadata at %s, but the nodes hold replicas: rebuilt it from "
                "the configuration; each shard elects above the terms its replicas are in",
                self.config.metadata_url,
            )
        else:
            log.info(
                "new cluster: %d shards over %s", len(metadata.shards), ", ".join(self.config.nodes)
            )
        return metadata

    async def stop(self) -> None:
        """Stops serving and lets another coordinator take the metadata location; also
        after a failed `start`."""
        for link in self._stop_deciding():
            await link.close()
        for server in (self._admin, self._registry):
            if server is not None:
                await server.stop(grace=0.2)
        self.store.release()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ engine inputs

    def step(self, msg: Any) -> None:
        if self.engine is None:  # still loading or making the metadata
            if isinstance(msg, (NodeStatus, NodeUnreachable)):
                self._early_reports[msg.node] = msg if isinstance(msg, NodeStatus) else None
                if len(self._early_reports) == len(self.config.nodes):
                    self._all_answered.set()
            return
        self.engine.step(msg)
        self._wakeup.set()

    def warn_once(self, message: str) -> None:
        """Logs a node's misconfiguration once, not on every reconnect attempt."""
        if message not in self._warned:
            self._warned.add(message)
            log.error("%s", message)

    def remember_report(self, node: str, report: pb.HealthReport) -> None:
        self._reports[node] = report

    def node_connected(self, node: str) -> None:
        """A (re)connected node may have lost its assignment table: send it again (once
        the engine exists, which sends it to nodes connected before)."""
        if self.engine is None:
            return
        self._spawn(self._push_assignments(self._assignments(), [node]))

    def _assignments(self) -> pb.ShardAssignmentsUpdate:
        assert self.engine is not None
        metadata = self.engine.metadata
        version = metadata.version + self.addresses.version
        return wire.assignments_from_metadata(metadata, self.addresses.client, version)

    def register(self, name: str, client: str, internal: str) -> None:
        """Node `name` says where it is now: a new or moved node gets a new link, and
        every node the new addresses and routing table."""
        if not self.addresses.update(name, client, internal):
            link = self._links.get(name)
            if link is not None and link.up:
                return
        log.info("node %s registered: client address %s, internal %s", name, client, internal)
        old = self._links.pop(name, None)
        if old is not None:
            self._spawn(old.close())
        self.unreachable.pop(name, None)
        self._links[name] = _NodeLink(self, name, internal)
        if self.engine is not None:
            self._spawn(self._push_assignments(self._assignments(), list(self._links)))
            self._warn_on_shared_hosts()

    def _warn_on_shared_hosts(self) -> None:
        """Says which shards have several replicas on one host: losing that host loses
        those replicas together, and with them the shard's majority."""
        assert self.engine is not None
        hosts_of = {n: host_of(a) for n, a in self.addresses.client.items()}
        shared = []
        for (namespace, index), shard in sorted(self.engine.metadata.shards.items()):
            hosts = Counter(hosts_of[n] for n in shard.ensemble if n in hosts_of)
            together = [h for h, count in hosts.items() if count > 1 and not is_loopback(h)]
            if together:
                shared.append(f"{namespace}/{index} on {', '.join(together)}")
        if shared:
            self.warn_once(
                f"shards have several replicas on one host ({'; '.join(shared)}): losing that "
                "host loses them together; give the cluster at least as many hosts as the "
                "replication factor"
            )

    def is_current(self, link: _NodeLink) -> bool:
        """Whether `link` is still its node's link (a new registration replaces it)."""
        return self._links.get(link.name) is link

    def note_unreachable(self, link: _NodeLink, error: grpc.aio.AioRpcError) -> None:
        """A node's health stream cannot be opened: after `UNREACHABLE_WARNING_S`, says
        which node, where, and what to check (once per node and address)."""
        now = asyncio.get_running_loop().time()
        since = self.unreachable.get(link.name, (now, ""))[0]
        client = self.addresses.client.get(link.name, "?")
        reason = (
            f"the coordinator cannot reach node {link.name} (client address {client}, internal "
            f"address {link.internal_address}): {error.code().name} {error.details()}; check "
            "that the node listens on an address this machine can reach (a node on another "
            "host must not bind 127.0.0.1), that no firewall blocks the port, and that both "
            "sides use the same cluster secret or internal CA"
        )
        self.unreachable[link.name] = (since, reason)
        if now - since >= UNREACHABLE_WARNING_S:
            self.warn_once(reason)

    async def _tick_loop(self) -> None:
        assert self.engine is not None
        while True:
            await asyncio.sleep(self.config.tick_ms / 1000)
            self.engine.tick()
            self._wakeup.set()

    async def _process_loop(self) -> None:
        """Persist, then send: the engine's `Ready` contract, one Ready at a time."""
        assert self.engine is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            ready = self.engine.ready()
            if ready.metadata is not None:
                await self._save(ready.metadata)
            for out in ready.messages:
                self._send(out.to, out.message)
            if ready.assignments_changed:
                self._spawn(self._push_assignments(self._assignments(), list(self._links)))

    async def _save(self, metadata: ClusterMetadata) -> None:
        """Persists `metadata`, retrying until it succeeds.

        What the engine sends next depends on it being saved (a term a node is fenced
        with must survive a coordinator restart), so nothing is sent meanwhile. Giving
        up would end this loop, and with it every election, for good: a full disk or an
        object store's outage then stalls leader changes only while it lasts.
        """
        loop = asyncio.get_running_loop()
        backoff = DoublingBackoff(first_s=SAVE_RETRY_FIRST_S, max_s=SAVE_RETRY_MAX_S)
        while True:
            try:
                await loop.run_in_executor(None, self.store.save, metadata)
                self._archived(metadata)
                return
            except MetadataTaken as e:
                self._deposed(e)
            except Exception as e:  # noqa: BLE001 - any failure to persist is retried
                delay = backoff.delay_after()
                log.error(
                    "saving the coordinator metadata to %s failed (%s: %s); elections and "
                    "leader changes wait until it succeeds (retrying in %.1f s)",
                    self.config.metadata_url,
                    type(e).__name__,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _lease_loop(self, every_s: float) -> None:
        """Renews the lease on the metadata location; an object store's outage is waited
        out (a successor cannot save over this coordinator's record meanwhile)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every_s)
            try:
                await loop.run_in_executor(None, self.store.renew)
            except MetadataTaken as e:
                self._deposed(e)
            except Exception as e:  # noqa: BLE001 - retried at the next renewal
                log.warning("renewing the lease on %s failed: %s", self.config.metadata_url, e)

    def _deposed(self, error: MetadataTaken) -> NoReturn:
        """Another coordinator took the metadata location: this one decides nothing more
        (its saves would fail anyway); `ended` is set and `deposed` says why. Ends the
        calling task too."""
        log.error("%s", error)
        self.deposed = error
        self.ended.set()
        for link in self._stop_deciding():
            self._spawn(link.close())
        raise asyncio.CancelledError from error

    def _stop_deciding(self) -> list[_NodeLink]:
        """Cancels every task but the caller's and drops the node links; returns the
        links, for the caller to close."""
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        links, self._links = list(self._links.values()), {}
        return links

    # ------------------------------------------------------------------ outputs

    def _send(self, node: str, msg: Any) -> None:
        link = self._links.get(node)
        if link is None:
            return
        if isinstance(msg, StatusRequest):
            link.ping()
        elif isinstance(msg, NewTerm):
            self._spawn(
                self._call(
                    link,
                    link.stub.NewTerm,
                    wire.new_term_to_pb(msg),
                    wire.new_term_response_from_pb,
                )
            )
        elif isinstance(msg, BecomeLeader):
            self._spawn(
                self._call(
                    link,
                    link.stub.BecomeLeader,
                    wire.become_leader_to_pb(msg),
                    wire.become_leader_response_from_pb,
                )
            )
        elif isinstance(msg, AddFollower):
            self._spawn(self._call(link, link.stub.AddFollower, wire.add_follower_to_pb(msg), None))

    async def _call(self, link: _NodeLink, method: Any, request: Any, convert: Any) -> None:
        try:
            response = await method(request, timeout=10, metadata=self.call_metadata)
        except grpc.aio.AioRpcError as e:
            log.debug(
                "%s to %s failed: %s %s",
                type(request).__name__,
                link.name,
                e.code(),
                e.details(),
            )
            return
        if convert is not None:
            self.step(convert(response, link.name))

    async def _push_assignments(self, update: pb.ShardAssignmentsUpdate, nodes: list[str]) -> None:
        """Pushes `update` to every node at once: a node that does not answer (paused, cut
        off) must not hold back the others' news of the leaders that replace it. Nodes
        keep the highest version, so pushes may overtake each other."""

        async def push(node: str) -> None:
            try:
                await self._links[node].stub.PushShardAssignments(
                    update, timeout=5, metadata=self.call_metadata
                )
            except grpc.aio.AioRpcError as e:
                log.debug("pushing assignments to %s failed: %s", node, e.code())

        await asyncio.gather(*(push(node) for node in nodes))

    def _archived(self, metadata: ClusterMetadata) -> None:
        """Has `metadata`, now saved, copied to the archive (`_archive_loop`)."""
        if self.archive is not None:
            self._archive_pending = metadata
            self._archive_wakeup.set()

    async def _archive_loop(self, archive: ArchiveStore) -> None:
        """Copies the latest saved metadata to the archive, at most once a second and off
        the save path: a restore needs the ensembles, and the archive may be unreachable."""
        loop = asyncio.get_running_loop()
        while True:
            await self._archive_wakeup.wait()
            self._archive_wakeup.clear()
            metadata, self._archive_pending = self._archive_pending, None
            if metadata is not None:
                data = wire.metadata_to_pb(metadata).SerializeToString()
                try:
                    await loop.run_in_executor(None, archive.save_metadata, data)
                except Exception as e:  # noqa: BLE001 - retried with the next save or in a second
                    log.warning("copying the metadata to the archive %s failed: %s", archive.url, e)
                    if self._archive_pending is None:
                        self._archive_pending = metadata
                    self._archive_wakeup.set()
            await asyncio.sleep(ARCHIVE_COPY_INTERVAL_S)

    # ------------------------------------------------------------------ status

    def cluster_status(self) -> pb.ClusterStatus:
        assert self.engine is not None
        replicas = [
            s for node, r in sorted(self._reports.items()) for s in _with_node(r.shards, node)
        ]
        return pb.ClusterStatus(
            metadata=wire.metadata_to_pb(self.engine.metadata),
            replicas=replicas,
            nodes_alive={
                node: node in self._links and self._links[node].up for node in self.config.nodes
            },
            node_addresses=self.addresses.client,
        )


def check_replicas_fit(
    metadata: ClusterMetadata, reports: list[NodeStatus], config: CoordinatorServerConfig
) -> bool:
    """Whether the nodes hold replicas (else the cluster is new), when each node that holds
    any holds exactly the shards `metadata`, made from `config`, places on it; raises
    MetadataError saying what to do otherwise.

    Health reports name shards, not hash ranges, so this is what shows a rebuild from
    another shard count, replication factor or node order. A node that holds none is new
    or was wiped, and is filled by its leaders as usual.
    """
    misfits = []
    for report in sorted(reports, key=lambda r: r.node):
        held = {status.shard for status in report.shards}
        placed = {key for key, shard in metadata.shards.items() if report.node in shard.ensemble}
        if held and held != placed:
            misfits.append(
                f"{report.node} holds {_shard_names(held)} where it would hold {_shard_names(placed)}"
            )
    if misfits:
        raise MetadataError(
            f"there is no coordinator metadata at {config.metadata_url}, and the replicas on the "
            f"nodes do not fit metadata rebuilt for {_describe(Counter(config.namespaces))}, "
            f"replication factor {config.replication_factor} over {', '.join(config.nodes)} "
            f"({'; '.join(misfits)}); start the coordinator with the shard count, replication "
            "factor and nodes (in their order) the cluster was created with"
        )
    return any(report.shards for report in reports)


def _shard_names(keys: set[ShardKey]) -> str:
    return ", ".join(f"{namespace}/{index}" for namespace, index in sorted(keys)) or "no shards"


def _describe(counts: Counter[str]) -> str:
    return ", ".join(f"{ns!r} with {n} shards" for ns, n in sorted(counts.items()))


def _warn_on_other_namespaces(metadata: ClusterMetadata, config: CoordinatorServerConfig) -> None:
    """Shard counts are initial, as in Oxia: saved metadata keeps its namespaces and shard
    counts whatever a restart asks for (quorumstore does not reshard); say so when they differ."""
    saved = Counter(namespace for namespace, _ in metadata.shards)
    if saved != config.namespaces:
        log.warning(
            "coordinator metadata at %s holds %s; keeping it, not %s as asked "
            "(shard counts are fixed when a cluster is created)",
            config.metadata_url,
            _describe(saved),
            _describe(Counter(config.namespaces)),
        )


def _with_node(shards: Any, node: str) -> list[pb.ShardStatus]:
    out = []
    for s in shards:
        copy = pb.ShardStatus()
        copy.CopyFrom(s)
        copy.node = node
        out.append(copy)
    return out


class _Registry(pb_grpc.CoordinatorRegistryServicer):
    """Where nodes whose addresses are decided where they run say where they are; served
    on an internal port, so only members reach it."""

    def __init__(self, server: CoordinatorServer):
        self.server = server

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        nodes = self.server.config.nodes
        certified = _certified_name(context)
        if request.node_name not in nodes:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"{request.node_name[:100]!r} is not a node of this cluster ({', '.join(nodes)})",
            )
        elif certified in nodes and certified != request.node_name:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of {certified} cannot register {request.node_name[:100]!r}",
            )
        elif not (is_host_port(request.client_address) and is_host_port(request.internal_address)):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the addresses {request.client_address[:100]!r} and "
                f"{request.internal_address[:100]!r} are not both host:port",
            )
        else:
            self.server.register(
                request.node_name, request.client_address, request.internal_address
            )
        return pb.RegisterResponse()


def _certified_name(context: grpc.aio.ServicerContext) -> str | None:
    """The common name of the caller's certificate (mutual TLS), if it presented one. A
    member whose certificate names a node may register that node only, so one member's
    certificate cannot redirect another's traffic; certificates shared by every member
    (a common name that is no node's) register any."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode() if names else None


class _Admin(pb_grpc.CoordinatorAdminServicer):
    def __init__(self, server: CoordinatorServer):
        self.server = server

    async def GetClusterStatus(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.ClusterStatus:
        return self.server.cluster_status()
