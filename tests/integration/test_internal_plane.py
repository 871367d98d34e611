"""The internal plane of an in-process standalone (a node and its coordinator, one shard):
node control and replication live on their own port, admit only the cluster secret, and
refuse malformed messages from members too; the shard keeps its keys and keeps serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

from in_process import until_online
from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.client import AsyncClient
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
from quorumstore.node.data_format import REPLICATION_METADATA
from quorumstore.node.node import Node, NodeConfig
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.coordinator import ShardState
from quorumstore.storage.snapshot import CHUNK_SCHEMA
from quorumstore.wire.auth import COORDINATOR_METADATA_KEY, ClusterSecret, SecretError

KEYS = 50
ESCAPED = "../../../escaped"


@dataclass
class Standalone:
    node: Node
    coordinator: CoordinatorServer
    secret: ClusterSecret
    data_dir: Path


@asynccontextmanager
async def standalone(data_dir: Path) -> AsyncIterator[Standalone]:
    """What `quorumstore standalone` runs, in this process; holds KEYS keys."""
    secret = ClusterSecret.generate()
    node = Node(NodeConfig(data_dir / "node", wal_sync=False, cluster_secret=secret))
    address = await node.start()
    coordinator = CoordinatorServer(
        CoordinatorServerConfig(
            nodes=[address],
            metadata_url=str(data_dir / "coordinator" / "metadata.pb"),
            internal_addresses={address: node.internal_address},
            cluster_secret=secret,
            replication_factor=1,
        )
    )
    await coordinator.start()
    try:
        await until_online(coordinator)
        async with AsyncClient(address) as client:
            for i in range(KEYS):
                await client.put(f"/k{i:02d}", b"v")
        yield Standalone(node, coordinator, secret, data_dir)
    finally:
        await coordinator.stop()
        await node.stop()


async def _assert_unharmed(server: Standalone) -> None:
    """The shard still leads in the coordinator's term, holds every key and takes writes."""
    assert server.coordinator.engine is not None
    (meta,) = server.coordinator.engine.metadata.shards.values()
    host = server.node.hosts[("default", 0)]
    assert host.is_leader() and host.replica.term == meta.term
    async with AsyncClient(server.node.name, request_timeout_s=10) as client:
        assert len(await client.list("/", "")) == KEYS
        await client.put("/after", b"still serving")
        await client.delete("/after")


def _attacks(metadata: tuple[tuple[str, str], ...]) -> dict[str, Callable[[Any], Awaitable[Any]]]:
    """The calls that wiped, fenced, redirected, escaped and stopped an unprotected node."""

    def snapshot_chunks() -> AsyncIterator[pb.SnapshotChunk]:
        async def chunks() -> AsyncIterator[pb.SnapshotChunk]:
            yield pb.SnapshotChunk(
                namespace="default",
                shard=0,
                term=2,
                position=pb.LogPosition(term=2, offset=0),
                data=b"",
                last=True,
                leader_name="127.0.0.1:1",
            )

        return chunks()

    def control(channel: Any) -> pb_grpc.NodeControlStub:
        return pb_grpc.NodeControlStub(channel)

    return {
        "NewTerm": lambda ch: control(ch).NewTerm(
            pb.NewTermRequest(namespace="default", shard=0, term=2), metadata=metadata, timeout=5
        ),
        "SendSnapshot": lambda ch: pb_grpc.ReplicationStub(ch).SendSnapshot(
            snapshot_chunks(), metadata=metadata + REPLICATION_METADATA, timeout=5
        ),
        "NewTerm 10^15": lambda ch: control(ch).NewTerm(
            pb.NewTermRequest(namespace="default", shard=0, term=10**15),
            metadata=metadata,
            timeout=5,
        ),
        "PushShardAssignments": lambda ch: control(ch).PushShardAssignments(
            _foreign_assignments(), metadata=metadata, timeout=5
        ),
        "NewTerm escaping": lambda ch: control(ch).NewTerm(
            pb.NewTermRequest(namespace=ESCAPED, shard=0, term=1), metadata=metadata, timeout=5
        ),
        "BecomeLeader factor 0": lambda ch: control(ch).BecomeLeader(
            pb.BecomeLeaderRequest(namespace="default", shard=0, term=1, replication_factor=0),
            metadata=metadata,
            timeout=5,
        ),
    }


def _foreign_assignments() -> pb.ShardAssignmentsUpdate:
    return pb.ShardAssignmentsUpdate(
        version=1 << 62,
        namespaces=[
            pb.NamespaceAssignments(
                namespace="default",
                shards=[
                    pb.ShardAssignment(
                        shard=0,
                        hash_range=pb.HashRange(min_hash_inclusive=0, max_hash_inclusive=2**32 - 1),
                        term=1,
                        leader="203.0.113.9:6648",
                    )
                ],
            )
        ],
    )


async def _code(call: Awaitable[Any]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def _escaped(server: Standalone) -> bool:
    """Whether a directory named by ESCAPED appeared anywhere around the data directory."""
    shards = server.data_dir / "node" / "shards"
    return (shards / ESCAPED).resolve().exists() or any(
        p.name == "escaped" for p in server.data_dir.parent.rglob("escaped")
    )


def test_without_the_secret_every_attack_is_unauthenticated(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with standalone(tmp_path / "qs") as server:
            wrong = ClusterSecret.generate().metadata
            async with grpc.aio.insecure_channel(server.node.internal_address) as channel:
                for presented in [(), wrong]:
                    for name, attack in _attacks(presented).items():
                        code = await _code(attack(channel))
                        assert code == grpc.StatusCode.UNAUTHENTICATED, (name, presented, code)
            await _assert_unharmed(server)
            assert server.node.assignments().version < 1 << 62
            assert not _escaped(server)

    asyncio.run(scenario())


def test_the_client_port_serves_no_internal_service(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with standalone(tmp_path / "qs") as server:
            async with grpc.aio.insecure_channel(server.node.name) as channel:
                for name, attack in _attacks(server.secret.metadata).items():
                    code = await _code(attack(channel))
                    assert code == grpc.StatusCode.UNIMPLEMENTED, (name, code)
            await _assert_unharmed(server)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "request_",
    [
        pb.NewTermRequest(namespace=ESCAPED, shard=0, term=5),
        pb.NewTermRequest(namespace="..", shard=0, term=5),
        pb.NewTermRequest(namespace="default", shard=-1, term=5),
        pb.NewTermRequest(namespace="default", shard=0, term=1 << 62),
        pb.NewTermRequest(namespace="default", shard=0, term=-3),
        pb.BecomeLeaderRequest(namespace="default", shard=0, term=5, replication_factor=0),
        pb.BecomeLeaderRequest(
            namespace="default",
            shard=0,
            term=5,
            replication_factor=2,
            follower_map={"127.0.0.1:1": pb.LogPosition(), "127.0.0.1:2": pb.LogPosition()},
        ),
        pb.AddFollowerRequest(namespace=ESCAPED, shard=0, term=5, follower_name="127.0.0.1:1"),
        pb.ShardAssignmentsUpdate(
            version=7,
            namespaces=[pb.NamespaceAssignments(namespace=ESCAPED)],
        ),
    ],
    ids=[
        "escaping namespace",
        "dot-dot namespace",
        "negative shard",
        "huge term",
        "negative term",
        "replication factor 0",
        "ensemble larger than factor",
        "add follower escaping",
        "assignments escaping",
    ],
)
def test_members_malformed_messages_are_refused(tmp_path: Path, request_: Any) -> None:
    async def scenario() -> None:
        async with standalone(tmp_path / "qs") as server:
            async with grpc.aio.insecure_channel(server.node.internal_address) as channel:
                stub = pb_grpc.NodeControlStub(channel)
                method = {
                    pb.NewTermRequest: stub.NewTerm,
                    pb.BecomeLeaderRequest: stub.BecomeLeader,
                    pb.AddFollowerRequest: stub.AddFollower,
                    pb.ShardAssignmentsUpdate: stub.PushShardAssignments,
                }[type(request_)]
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await method(request_, metadata=server.secret.metadata, timeout=5)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "refused" in (refused.value.details() or "")
            await _assert_unharmed(server)
            assert not _escaped(server)
            assert set(server.node.hosts) == {("default", 0)}

    asyncio.run(scenario())


def test_a_new_coordinator_replaces_assignments_whatever_their_version(tmp_path: Path) -> None:
    """A coordinator numbers its own versions: a member's update of a huge version stands
    only until the current coordinator pushes again."""

    async def scenario() -> None:
        async with standalone(tmp_path / "qs") as server:
            forger = ((COORDINATOR_METADATA_KEY, "another"),) + server.secret.metadata
            async with grpc.aio.insecure_channel(server.node.internal_address) as channel:
                await pb_grpc.NodeControlStub(channel).PushShardAssignments(
                    _foreign_assignments(), metadata=forger, timeout=5
                )
            assert server.node.assignments().version == 1 << 62
            assert server.coordinator.engine is not None
            update = server.coordinator.engine.metadata
            server.coordinator.node_connected(server.node.name)  # pushes the table again
            await asyncio.wait_for(_until_version_below(server.node, 1 << 62), 10)
            assert server.node.assignments().version == update.version
            await _assert_unharmed(server)

    asyncio.run(scenario())


def test_a_term_no_coordinator_issued_does_not_fence_the_shard_for_good(
    tmp_path: Path,
) -> None:
    """A member fences the shard's only replica in term 10^15: the coordinator, seeing the
    replica in a term above its own, elects in a term above that, and the shard serves
    again with every key."""

    async def scenario() -> None:
        async with standalone(tmp_path / "qs") as server:
            async with grpc.aio.insecure_channel(server.node.internal_address) as channel:
                await pb_grpc.NodeControlStub(channel).NewTerm(
                    pb.NewTermRequest(namespace="default", shard=0, term=10**15),
                    metadata=server.secret.metadata,
                    timeout=5,
                )
            assert server.coordinator.engine is not None

            async def past_the_forged_term() -> None:
                while True:
                    (meta,) = server.coordinator.engine.metadata.shards.values()  # type: ignore[union-attr]
                    if meta.term > 10**15 and meta.state is ShardState.ONLINE:
                        return
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(past_the_forged_term(), 20)
            await _assert_unharmed(server)

    asyncio.run(scenario())


async def _until_version_below(node: Node, version: int) -> None:
    while node.assignments().version >= version:
        await asyncio.sleep(0.02)


def test_a_snapshot_whose_chunks_name_another_position_is_refused(tmp_path: Path) -> None:
    """A fenced replica gets well-formed chunks whose position differs from the stream's,
    or a chunk that is no Arrow at all: both installs are refused, nothing is staged."""

    async def scenario() -> None:
        secret = ClusterSecret.generate()
        node = Node(NodeConfig(tmp_path / "node", wal_sync=False, cluster_secret=secret))
        await node.start()
        metadata = secret.metadata + REPLICATION_METADATA
        try:
            async with grpc.aio.insecure_channel(node.internal_address) as channel:
                await pb_grpc.NodeControlStub(channel).NewTerm(
                    pb.NewTermRequest(namespace="default", shard=0, term=1),
                    metadata=metadata,
                    timeout=5,
                )
                replication = pb_grpc.ReplicationStub(channel)
                mismatched = await _code(
                    replication.SendSnapshot(
                        _snapshot(_chunk(offset=999), offset=5), metadata=metadata, timeout=5
                    )
                )
                assert mismatched == grpc.StatusCode.INVALID_ARGUMENT
                garbage = await _code(
                    replication.SendSnapshot(_snapshot(b"", offset=5), metadata=metadata, timeout=5)
                )
                assert garbage == grpc.StatusCode.DATA_LOSS
            shard_dir = tmp_path / "node" / "shards" / "default" / "0"
            assert not list(shard_dir.glob("snapshot-staging-*"))
            assert node.hosts[("default", 0)].replica.head.offset == -1
        finally:
            await node.stop()

    asyncio.run(scenario())


def _chunk(offset: int) -> bytes:
    """A well-formed, empty, last snapshot chunk naming position (1, offset)."""
    metadata = {b"chunk_index": b"0", b"last": b"1", b"term": b"1", b"checksum": b"0"}
    metadata[b"offset"] = str(offset).encode()
    empty = pa.array([], pa.binary())
    schema = CHUNK_SCHEMA.with_metadata(metadata)
    return ipc_bytes(pa.RecordBatch.from_arrays([empty, empty], schema=schema))


def _snapshot(data: bytes, offset: int) -> AsyncIterator[pb.SnapshotChunk]:
    async def chunks() -> AsyncIterator[pb.SnapshotChunk]:
        yield pb.SnapshotChunk(
            namespace="default",
            shard=0,
            term=1,
            position=pb.LogPosition(term=1, offset=offset, checksum=0),
            data=data,
            last=True,
            leader_name="127.0.0.1:1",
        )

    return chunks()


def test_secret_files_must_be_private_and_well_formed(tmp_path: Path) -> None:
    secret = ClusterSecret.generate()
    path = tmp_path / "secret"
    secret.write_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert ClusterSecret.from_file(path).admits(secret.metadata[0][1])
    path.chmod(0o644)
    with pytest.raises(SecretError, match="chmod 600"):
        ClusterSecret.from_file(path)
    path.write_text("short\n")
    path.chmod(0o600)
    with pytest.raises(SecretError, match="64 hex digits"):
        ClusterSecret.from_file(path)


def test_a_node_refuses_to_listen_beyond_loopback_without_a_secret(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(NodeConfig(tmp_path / "node", host="0.0.0.0", advertise_host="10.1.2.3"))
        with pytest.raises(SecretError, match="nothing to tell members of the cluster"):
            await node.start()

    asyncio.run(scenario())
