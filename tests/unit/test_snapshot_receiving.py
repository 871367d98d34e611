"""A real node receiving a snapshot stream stops staging it once a newer term makes its
install impossible, instead of writing the rest of a snapshot it would refuse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from quorumstore.node.data_format import REPLICATION_METADATA
from quorumstore.node.node import Node, NodeConfig
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.types import LogPosition
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.snapshot import iter_snapshot_chunks

SHARD = 0
LEADER = "127.0.0.1:1"  # the stream's sender; nothing listens there


def _chunks() -> list[bytes]:
    kv = MemoryKv()
    kv.write(((b"\x01k%06d" % i, b"v" * 100) for i in range(2000)), [], [])
    return list(iter_snapshot_chunks(kv.snapshot(), LogPosition(1, 99, 7), chunk_bytes=16_384))


async def _stream_across_a_new_term(data_dir: Path) -> tuple[list[int], grpc.StatusCode, str]:
    """Sends the first half of a term-1 snapshot, moves the replica to term 2, then the
    rest; returns the staging directories seen meanwhile and the stream's outcome."""
    node = Node(NodeConfig(data_dir, port=0, wal_sync=False))
    await node.start()
    chunks = _chunks()
    assert len(chunks) > 10
    staged: list[int] = []
    try:
        async with grpc.aio.insecure_channel(node.internal_address) as channel:
            control = pb_grpc.NodeControlStub(channel)
            await control.NewTerm(pb.NewTermRequest(namespace="default", shard=SHARD, term=1))
            moved = asyncio.Event()

            async def requests() -> AsyncIterator[pb.SnapshotChunk]:
                for i, data in enumerate(chunks):
                    if i == len(chunks) // 2:
                        await asyncio.sleep(0.2)  # the node stages what it has
                        staged.append(len(list(data_dir.rglob("snapshot-staging-*"))))
                        await control.NewTerm(
                            pb.NewTermRequest(namespace="default", shard=SHARD, term=2)
                        )
                        moved.set()
                    yield pb.SnapshotChunk(
                        namespace="default",
                        shard=SHARD,
                        term=1,
                        data=data,
                        last=i == len(chunks) - 1,
                        leader_name=LEADER,
                        position=pb.LogPosition(term=1, offset=99, checksum=7) if i == 0 else None,
                    )

            replication = pb_grpc.ReplicationStub(channel)
            try:
                await replication.SendSnapshot(
                    requests(), metadata=REPLICATION_METADATA, timeout=30
                )
                code, details = grpc.StatusCode.OK, ""
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details() or ""
            assert moved.is_set()
            await asyncio.sleep(0.2)  # the stager's cleanup runs once it has stopped
            staged.append(len(list(data_dir.rglob("snapshot-staging-*"))))
    finally:
        await node.stop()
    return staged, code, details


def test_a_snapshot_superseded_by_a_new_term_stops_and_leaves_nothing_staged(
    tmp_path: Path,
) -> None:
    staged, code, details = asyncio.run(_stream_across_a_new_term(tmp_path))
    assert code is grpc.StatusCode.FAILED_PRECONDITION, (code, details)
    assert "superseded: the replica is now in term 2" in details
    assert staged == [1, 0]
