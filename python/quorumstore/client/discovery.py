"""Connections to the nodes, and the shard map kept current from the cluster.

`Directory` keeps a `GetShardAssignments` stream open in a background task: the
server sends the namespace's full map on open and again whenever a leader changes,
so the client follows leadership without polling. When the stream breaks (its node
died) it reconnects, with backoff, to the next node it knows: the bootstrap
addresses, every leader it has seen, and every shard's followers, which it asks
the data service for (`ListShards`) whenever a map arrives; for the first map before
`start` returns, so that a client whose one bootstrap node dies at once still finds
the others (after a map that comes later, the new map is used first).

The stream's node may itself be the faulty one (paused, or cut off from the cluster
while the client still reaches it): it then sends no new map, and its dead connection is
noticed only by keepalive, seconds later. So while a call waits on a leader for longer
than `LEADER_CHECK_S`, the directory asks the other nodes (every `LEADER_RECHECK_S`)
which leader they know for the shard (`ListShards`, which carries each shard's term) and
routes to one elected in a later term than the leader it knew.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from quorumstore.client.errors import (
    NamespaceNotFound,
    PermissionDenied,
    QuorumStoreError,
    ServiceUnavailable,
    Unauthenticated,
)
from quorumstore.client.retry import Backoff, classify
from quorumstore.client.routing import ShardMap
from quorumstore.event_loops import abandon
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc, quorumstore_data_pb2_grpc
from quorumstore.proto import quorumstore_data_pb2 as data_pb
from quorumstore.wire.channels import CLIENT_CHANNEL_OPTIONS
from quorumstore.wire.metadata import LEADER_ROUTING_METADATA
from quorumstore.wire.tls import TlsConfig, TokenSource, open_aio_channel

log = logging.getLogger(__name__)

#: How long a call waits on a shard's leader before the other nodes are asked whether a
#: newer leader was elected, and how often again after that: a healthy leader answers
#: in milliseconds, and the check finds a new leader soon after its election (the
#: coordinator's default failure timeout is 0.5 s).
LEADER_CHECK_S = 0.3
LEADER_RECHECK_S = 0.1
#: How long the check waits for each node's answer.
LEADER_CHECK_TIMEOUT_S = 0.5


class Channels:
    """One gRPC channel per node address, opened on first use, with both services' stubs;
    over TLS with `tls`, presenting `token` on every call."""

    def __init__(self, tls: TlsConfig | None = None, token: TokenSource | None = None) -> None:
        self._tls = tls
        self._token = token
        self._stubs: dict[
            str,
            tuple[
                oxia_client_pb2_grpc.OxiaClientStub, quorumstore_data_pb2_grpc.QuorumstoreDataStub
            ],
        ] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _open(
        self, address: str
    ) -> tuple[oxia_client_pb2_grpc.OxiaClientStub, quorumstore_data_pb2_grpc.QuorumstoreDataStub]:
        stubs = self._stubs.get(address)
        if stubs is None:
            channel = open_aio_channel(address, CLIENT_CHANNEL_OPTIONS, self._tls, self._token)
            self._channels.append(channel)
            stubs = self._stubs[address] = (
                oxia_client_pb2_grpc.OxiaClientStub(channel),
                quorumstore_data_pb2_grpc.QuorumstoreDataStub(channel),
            )
        return stubs

    def stub(self, address: str) -> oxia_client_pb2_grpc.OxiaClientStub:
        """Oxia's client protocol on the node at `address`."""
        return self._open(address)[0]

    def data_stub(self, address: str) -> quorumstore_data_pb2_grpc.QuorumstoreDataStub:
        """quorumstore's Arrow data service on the node at `address`."""
        return self._open(address)[1]

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], {}
        await asyncio.gather(*(c.close() for c in channels))


class Directory:
    """The current `ShardMap` of one namespace, followed from the cluster."""

    def __init__(self, channels: Channels, bootstrap: Sequence[str], namespace: str) -> None:
        self._channels = channels
        self._bootstrap = list(bootstrap)
        self._namespace = namespace
        #: Every node address known, in the order to try them: the bootstrap addresses,
        #: then each shard's leader and followers as the cluster reports them.
        self._nodes: dict[str, None] = dict.fromkeys(self._bootstrap)
        self._map: ShardMap | None = None
        self._changed = asyncio.Event()
        self._fatal: QuorumStoreError | None = None
        self._task: asyncio.Task[None] | None = None
        #: Why the last attempt to get assignments failed, for the start() timeout's message.
        self._last_failure = ""
        #: Bootstrap addresses that serve gRPC but not Oxia's client API.
        self._not_oxia: set[str] = set()
        #: Asks for the shards' followers again while the first ask failed.
        self._learning: asyncio.Task[None] | None = None
        #: The latest term known of each shard's leader (from ListShards answers).
        self._terms: dict[int, int] = {}
        #: (shard, leader) -> the calls waiting on that leader, and the task asking the
        #: other nodes whether the shard has a newer one.
        self._waiting: dict[tuple[int, str], int] = {}
        self._checks: dict[tuple[int, str], asyncio.Task[None]] = {}

    async def start(self, timeout_s: float) -> None:
        """Starts following the map; returns once the first one arrived."""
        self._task = asyncio.create_task(self._follow(), name="quorumstore-shard-assignments")
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            await self.close()
            last = f" (last attempt: {self._last_failure})" if self._last_failure else ""
            raise ServiceUnavailable(
                f"no shard assignments from {', '.join(self._bootstrap)} for namespace "
                f"{self._namespace!r} within {timeout_s:g} s{last}: is a quorumstore node "
                "listening there, and are its shards online?"
            ) from None
        if self._fatal is not None:
            await self.close()
            raise self._fatal

    @property
    def known_nodes(self) -> list[str]:
        """Every node address known, in the order they are tried when the stream breaks."""
        return list(self._nodes)

    @property
    def map(self) -> ShardMap:
        if self._map is None:
            raise RuntimeError("Directory.start() has not completed")
        return self._map

    async def wait_for_change(self, timeout_s: float) -> None:
        """Returns when a new map arrives, or after `timeout_s`, whichever is first."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass

    async def leader_moved(self, shard: int, leader: str) -> None:
        """Returns once the map names another leader than `leader` for `shard` (or none).

        While any call waits here, the other nodes are asked after LEADER_CHECK_S, then
        every LEADER_RECHECK_S, whether they know a newer leader (see the module docstring)."""
        key = (shard, leader)
        self._waiting[key] = self._waiting.get(key, 0) + 1
        if key not in self._checks:
            self._checks[key] = asyncio.create_task(
                self._check_elsewhere(shard, leader), name=f"quorumstore-leader-check-{shard}"
            )
        try:
            while self.map.leader(shard) == leader:
                await self._changed.wait()
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]
                abandon(self._checks.pop(key))

    async def _check_elsewhere(self, shard: int, leader: str) -> None:
        """Routes `shard` to a leader the other nodes know from a later term than any this
        client saw, once one is elected."""
        await asyncio.sleep(LEADER_CHECK_S - LEADER_RECHECK_S)
        while True:
            await asyncio.sleep(LEADER_RECHECK_S)
            others = [a for a in self._nodes if a != leader]
            answers = await asyncio.gather(*(self._list_shards(a) for a in others))
            known = [
                (info.term, info.leader)
                for answer in answers
                if answer is not None
                for info in answer.shards
                if info.shard == shard and info.leader
            ]
            log.debug(
                "check shard %d leader %s: known %s terms %s", shard, leader, known, self._terms
            )
            if not known:
                continue
            term, newer = max(known)
            if term > self._terms.get(shard, -1) and newer != leader:
                log.debug("shard %d: %s leads in term %d, not %s", shard, newer, term, leader)
                self._terms[shard] = term
                self.hint(shard, newer)
                return

    async def _list_shards(self, address: str) -> data_pb.ListShardsResponse | None:
        """The node's view of the namespace's shards, or None if it did not answer soon."""
        request = data_pb.ListShardsRequest(namespace=self._namespace)
        try:
            return await self._channels.data_stub(address).ListShards(
                request, timeout=LEADER_CHECK_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as e:
            log.debug("ListShards on %s failed: %s", address, e.details())
            return None

    def hint(self, shard: int, leader: str) -> None:
        """Routes `shard` to `leader` now, until the next map says otherwise."""
        if self._map is not None and self._map.leader(shard) != leader:
            self._nodes.setdefault(leader)
            self._publish(self._map.with_leader(shard, leader))

    def _publish(self, new_map: ShardMap) -> None:
        self._map = new_map
        for shard in new_map.shards:
            if leader := new_map.leader(shard):
                self._nodes.setdefault(leader)
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _learn_replicas(self, address: str) -> bool:
        """Adds every shard's followers to the known nodes (the map names leaders only).

        So that the client finds the cluster again when the only nodes it knew die,
        e.g. the single leader it was bootstrapped from. Returns whether it learned them;
        after a failure the next map, or `_learn_replicas_until_known`, asks again.
        """
        request = data_pb.ListShardsRequest(namespace=self._namespace)
        try:
            response = await self._channels.data_stub(address).ListShards(request, timeout=5)
        except grpc.aio.AioRpcError as e:
            log.debug("ListShards on %s failed: %s", address, e.details())
            return False
        for shard in response.shards:
            self._terms[shard.shard] = max(self._terms.get(shard.shard, -1), shard.term)
            for node in [shard.leader, *shard.followers]:
                if node:
                    self._nodes.setdefault(node)
        return True

    async def _learn_replicas_until_known(self) -> None:
        """Asks the known nodes in turn until one names the shards' followers: a client
        that knows only its bootstrap node would not find the cluster again once that
        node dies."""
        backoff = Backoff(max_s=1.0)
        while True:
            await asyncio.sleep(backoff.next_delay())
            for address in list(self._nodes):
                if await self._learn_replicas(address):
                    return

    async def _follow(self) -> None:
        backoff = Backoff(max_s=1.0)
        attempt = 0
        while True:
            nodes = list(self._nodes)
            address = nodes[attempt % len(nodes)]
            request = pb.ShardAssignmentsRequest(namespace=self._namespace)
            try:
                stream = self._channels.stub(address).GetShardAssignments(
                    request, metadata=LEADER_ROUTING_METADATA
                )
                async for message in stream:
                    entry = message.namespaces.get(self._namespace)
                    if entry is None:
                        continue
                    first = self._map is None
                    if first and not await self._learn_replicas(address):
                        # before start() returns: the bootstrap node may die next
                        self._learning = asyncio.create_task(
                            self._learn_replicas_until_known(), name="quorumstore-find-replicas"
                        )
                    self._publish(ShardMap.from_proto(entry))
                    backoff = Backoff(max_s=1.0)
                    if not first:
                        await self._learn_replicas(address)
            except grpc.aio.AioRpcError as e:
                failure = classify(e)
                if isinstance(failure, NamespaceNotFound | Unauthenticated | PermissionDenied):
                    self._fail(failure)
                    return
                self._last_failure = f"{address}: {e.code().name.lower()} ({e.details()})"
                log.debug("shard assignments from %s failed: %s", address, e.details())
                if e.code() == grpc.StatusCode.UNIMPLEMENTED and self._map is None:
                    self._not_oxia.add(address)
                    if self._not_oxia.issuperset(self._bootstrap):
                        self._fail(_not_nodes(self._bootstrap))
                        return
            except ValueError as e:  # a map this client cannot use
                self._fail(QuorumStoreError(f"unusable shard assignments from {address}: {e}"))
                return
            attempt += 1
            await asyncio.sleep(backoff.next_delay())

    def _fail(self, error: QuorumStoreError) -> None:
        """Ends a start() that is waiting; a running client keeps its last map."""
        self._fatal = error
        if self._map is None:
            self._changed.set()
        else:
            log.error("stopped following shard assignments: %s", error)

    async def close(self) -> None:
        for check in self._checks.values():
            abandon(check)
        self._checks.clear()
        if self._learning is not None:
            self._learning.cancel()
            await asyncio.gather(self._learning, return_exceptions=True)
            self._learning = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def _not_nodes(addresses: Sequence[str]) -> QuorumStoreError:
    verb = "answers" if len(addresses) == 1 else "answer"
    return QuorumStoreError(
        f"{', '.join(addresses)} {verb} gRPC but not Oxia's client API: give a node's client "
        "address, not the coordinator's status port or another service's"
    )
