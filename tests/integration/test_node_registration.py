"""Nodes known by name, whose addresses are decided where they run: they register with
the coordinator's registry, the cluster and its clients follow a node that moves, and a
node the coordinator cannot reach is named within seconds, with what to check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from in_process import until_online
from quorumstore.client import AsyncClient
from quorumstore.coordinator import server as coordinator_server
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
from quorumstore.node.node import Node, NodeConfig
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.testing import official_oxia_client
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.certificates import CertificateAuthority
from quorumstore.wire.membership import Membership

NAMES = ["node0", "node1", "node2"]


@dataclass
class Registered:
    coordinator: CoordinatorServer
    nodes: dict[str, Node]
    secret: ClusterSecret
    data_dir: Path

    async def start_node(self, name: str) -> Node:
        node = Node(
            NodeConfig(
                self.data_dir / name,
                wal_sync=False,
                name=name,
                coordinator=self.coordinator.registry_address,
                cluster_secret=self.secret,
            )
        )
        await node.start()
        self.nodes[name] = node
        return node

    def addresses(self) -> list[str]:
        return [self.coordinator.addresses.client[n] for n in NAMES]


@asynccontextmanager
async def registered_cluster(data_dir: Path) -> AsyncIterator[Registered]:
    """A coordinator that knows its three nodes by name only, and the nodes, which
    register on free ports."""
    secret = ClusterSecret.generate()
    coordinator = CoordinatorServer(
        CoordinatorServerConfig(
            nodes=NAMES,
            metadata_url=str(data_dir / "coordinator" / "metadata.pb"),
            internal_addresses={},
            cluster_secret=secret,
            namespaces={"default": 2},
            registry_port=0,
            first_reports_wait_s=30,
        )
    )
    await coordinator.open_registry()
    cluster = Registered(coordinator, {}, secret, data_dir)
    try:
        for name in NAMES:
            await cluster.start_node(name)
        await coordinator.start()
        await until_online(coordinator)
        yield cluster
    finally:
        await coordinator.stop()
        for node in cluster.nodes.values():
            await node.stop()


def test_a_node_that_moves_is_followed_by_the_cluster_and_its_clients(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with registered_cluster(tmp_path) as cluster:
            before = cluster.addresses()
            assert before == [cluster.nodes[n].address for n in NAMES]
            # The official Oxia client, in leader mode, talks to each shard's leader.
            official = await asyncio.to_thread(official_oxia_client, before[0])
            async with AsyncClient(",".join(before), request_timeout_s=30) as client:
                for i in range(20):
                    await client.put(f"/moving/{i}", b"before")
                    await asyncio.to_thread(official.put, f"/official/{i}", b"before")

                # node1 restarts from its data on another port: the same member elsewhere.
                await cluster.nodes["node1"].stop()
                moved = await cluster.start_node("node1")
                assert moved.address != before[1]

                async def registered() -> None:
                    while cluster.coordinator.addresses.client["node1"] != moved.address:
                        await asyncio.sleep(0.05)

                await asyncio.wait_for(registered(), 15)
                for i in range(20, 40):
                    await client.put(f"/moving/{i}", b"after")
                    await asyncio.to_thread(_put_retrying, official, f"/official/{i}")
                for i in range(40):
                    assert (await client.get(f"/moving/{i}")).value in (b"before", b"after")
                    # (Its own keys only: oxia 0.2.1 routes by XXH64, not Oxia's XXH3.)
                    _, value, _ = await asyncio.to_thread(official.get, f"/official/{i}")
                    assert value == (b"before" if i < 20 else b"after")

                # Its peers and every node's routing table know the new address.
                async def everyone_knows() -> None:
                    while True:
                        tables = [node.assignments() for node in cluster.nodes.values()]
                        named = {
                            a
                            for t in tables
                            for ns in t.namespaces
                            for s in ns.shards
                            for a in [s.leader, *s.followers]
                        }
                        if before[1] not in named and moved.address in named:
                            return
                        await asyncio.sleep(0.05)

                await asyncio.wait_for(everyone_knows(), 15)
            await asyncio.to_thread(official.close)
            status = cluster.coordinator.cluster_status()
            assert dict(status.node_addresses)["node1"] == moved.address
            assert all(status.nodes_alive.values())

    asyncio.run(scenario())


def _put_retrying(client: Any, key: str, timeout_s: float = 30) -> None:
    """A put by the official client, which has no retries of its own: its calls to a
    moved leader fail until its shard map names the new address."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.put(key, b"after")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_the_registry_admits_only_members_known_by_name(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with registered_cluster(tmp_path) as cluster:
            registry = cluster.coordinator.registry_address
            assert registry is not None
            async with grpc.aio.insecure_channel(registry) as channel:
                stub = pb_grpc.CoordinatorRegistryStub(channel)
                request = pb.RegisterRequest(
                    node_name="node0", client_address="127.0.0.1:1", internal_address="127.0.0.1:2"
                )
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Register(request, timeout=5)  # no cluster secret
                assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED

                secret = cluster.secret.metadata
                stranger = pb.RegisterRequest(
                    node_name="node9", client_address="127.0.0.1:1", internal_address="127.0.0.1:2"
                )
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Register(stranger, timeout=5, metadata=secret)
                assert refused.value.code() is grpc.StatusCode.NOT_FOUND
                assert "node0, node1, node2" in (refused.value.details() or "")

                garbled = pb.RegisterRequest(
                    node_name="node0", client_address="nowhere", internal_address="127.0.0.1:2"
                )
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Register(garbled, timeout=5, metadata=secret)
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            # Nothing of the refused calls reached the address book.
            assert cluster.addresses() == [cluster.nodes[n].address for n in NAMES]

    asyncio.run(scenario())


def test_a_node_the_coordinator_cannot_reach_is_named_within_seconds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node that registers an address the coordinator cannot reach (here a port
    nobody listens on; on a cluster, a loopback bind or a firewall) is named with both
    its addresses and what to check, seconds after it registered."""

    async def scenario() -> float:
        async with registered_cluster(tmp_path) as cluster:
            await cluster.nodes["node2"].stop()
            registry = cluster.coordinator.registry_address
            assert registry is not None
            async with grpc.aio.insecure_channel(registry) as channel:
                await pb_grpc.CoordinatorRegistryStub(channel).Register(
                    pb.RegisterRequest(
                        node_name="node2",
                        client_address="127.0.0.1:9",
                        internal_address="127.0.0.1:10",
                    ),
                    timeout=5,
                    metadata=cluster.secret.metadata,
                )
            started = asyncio.get_running_loop().time()
            while "node2" not in cluster.coordinator.unreachable or not any(
                "cannot reach node node2" in r.getMessage() for r in caplog.records
            ):
                await asyncio.sleep(0.1)
                assert asyncio.get_running_loop().time() - started < 15
            return asyncio.get_running_loop().time() - started

    with caplog.at_level(logging.ERROR, logger=coordinator_server.__name__):
        took = asyncio.run(scenario())
    assert took < coordinator_server.UNREACHABLE_WARNING_S + 5
    message = next(
        r.getMessage() for r in caplog.records if "cannot reach node node2" in r.getMessage()
    )
    for part in ("client address 127.0.0.1:9", "internal address 127.0.0.1:10", "firewall"):
        assert part in message, message


def test_a_members_certificate_registers_its_own_node_only(tmp_path: Path) -> None:
    """With mutual TLS, the certificate the driver made for node0 cannot move node1."""

    async def scenario() -> None:
        ca = CertificateAuthority.create()
        coordinator = CoordinatorServer(
            CoordinatorServerConfig(
                nodes=NAMES,
                metadata_url=str(tmp_path / "metadata.pb"),
                internal_addresses={},
                internal_tls=ca.internal_tls("coordinator"),
                registry_port=0,
            )
        )
        registry = await coordinator.open_registry()
        assert registry is not None
        try:
            async with Membership(None, ca.internal_tls("node0")).channel(registry) as channel:
                stub = pb_grpc.CoordinatorRegistryStub(channel)

                def request(name: str) -> pb.RegisterRequest:
                    return pb.RegisterRequest(
                        node_name=name,
                        client_address="127.0.0.1:9",
                        internal_address="127.0.0.1:10",
                    )

                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Register(request("node1"), timeout=5)
                assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
                assert "node1" not in coordinator.addresses.client
                await stub.Register(request("node0"), timeout=5)
                assert coordinator.addresses.client["node0"] == "127.0.0.1:9"
        finally:
            await coordinator.stop()

    asyncio.run(scenario())


def test_a_coordinator_gone_briefly_is_not_warned_about_one_gone_for_long_is(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark application's coordinator stops just before its node tasks do, and a
    restarted coordinator is back within seconds: neither is worth a warning. A
    coordinator unreachable for `WARN_AFTER_S` is, once."""
    from quorumstore.node import registration

    @dataclass
    class Unregistered:
        name: str = "node0"
        address: str = "127.0.0.1:1"
        internal_address: str = "127.0.0.1:2"
        last_ping_at: float = 0.0

    async def try_for(seconds: float) -> None:
        membership = Membership(ClusterSecret.generate(), None)
        with pytest.raises(TimeoutError):
            # Port 1 on loopback refuses at once: every attempt fails UNAVAILABLE.
            await asyncio.wait_for(
                registration.keep_registered(Unregistered(), "127.0.0.1:1", membership), seconds
            )

    monkeypatch.setattr(registration, "WARN_AFTER_S", 1.0)
    with caplog.at_level(logging.DEBUG, logger=registration.__name__):
        asyncio.run(try_for(0.6))
    assert caplog.records, "no attempt was made"
    assert all(r.levelno == logging.DEBUG for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=registration.__name__):
        asyncio.run(try_for(3.0))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        len(warnings) == 1 and "could not register with the coordinator" in warnings[0].getMessage()
    )
