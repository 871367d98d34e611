"""Nodes count the messages they queued on real Replicate streams until gRPC wrote them.

A follower's apply waits for its Acks to be written (see `ShardHost._follower_apply`),
so a count that never went down would leave it applying only once a tick. A leader
prepares the apply of its waiting entry once its Appends are written (see
`ShardHost.appends_written`), so a count that never went down would prepare nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from leader_and_follower import leader_and_follower
from quorumstore.node.data_format import REPLICATION_METADATA
from quorumstore.node.node import Node, NodeConfig
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import Append
from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, make_entry
from quorumstore.storage.results import EntryResult
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import WriteBatchBuilder
from quorumstore.wire import replication as wire

pytestmark = pytest.mark.integration

SHARD = ("default", 0)


def _put(key: str) -> bytes:
    batch = WriteBatchBuilder()
    batch.add_put(key, b"v")
    return batch.build(1_700_000_000_000)


async def _scenario(data_dir: Path) -> None:
    node = Node(NodeConfig(data_dir, port=0, wal_sync=False))
    await node.start()
    try:
        async with grpc.aio.insecure_channel(node.internal_address) as channel:
            await pb_grpc.NodeControlStub(channel).NewTerm(
                pb.NewTermRequest(namespace=SHARD[0], shard=SHARD[1], term=1),
                metadata=REPLICATION_METADATA,
                timeout=10,
            )
            outbox: asyncio.Queue[pb.Append] = asyncio.Queue()

            async def appends() -> AsyncIterator[pb.Append]:
                while True:
                    yield await outbox.get()

            call = pb_grpc.ReplicationStub(channel).Replicate(
                appends(), metadata=REPLICATION_METADATA, timeout=30
            )
            head = EMPTY_POSITION
            for offset in range(3):  # each Append commits the entry before it
                entry = make_entry(head, 1, _put(f"/k{offset}"))
                outbox.put_nowait(
                    wire.append_to_pb(Append(SHARD, 1, "leader", head, (entry,), offset - 1))
                )
                ack = await call.read()
                assert (ack.status, ack.head_offset) == (pb.OK, offset), ack
                head = LogPosition(entry.term, entry.offset, entry.checksum)

            # The leader read every Ack, so gRPC wrote them all; the follower learns of
            # the last write on a later turn of its loop, then applies what was committed.
            host = node.hosts[SHARD]
            for _ in range(100):
                if not node.transport.acks_in_transit(SHARD):
                    break
                await asyncio.sleep(0.01)
            assert not node.transport.acks_in_transit(SHARD), "written Acks are still counted"
            await asyncio.sleep(0.01)
            assert host.machine.applied_position.offset == 1
            call.cancel()
    finally:
        await node.stop()


def test_acks_read_by_the_leader_are_no_longer_in_transit(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))


async def _leader_scenario(data_dir: Path, writes: int) -> None:
    async with leader_and_follower(data_dir, SHARD) as (leader, _):
        host = leader.hosts[SHARD]
        for i in range(writes):
            result = await asyncio.wait_for(host.write(_put(f"/k{i}")), 10)
            assert result.results and result.results[0].version is not None


def test_a_leader_prepares_while_its_appends_wait_for_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write of one at a time: its Appends are written long before the follower's
    fsync ends and its Ack arrives, so most writes are answered from a prepared apply."""
    from_prepared: list[bool] = []
    apply_prepared = ShardStateMachine._apply_prepared

    def noted(self: ShardStateMachine, entry: LogEntry) -> EntryResult | None:
        result = apply_prepared(self, entry)
        from_prepared.append(result is not None)
        return result

    monkeypatch.setattr(ShardStateMachine, "_apply_prepared", noted)
    writes = 20
    asyncio.run(_leader_scenario(tmp_path, writes))
    assert from_prepared.count(True) >= writes // 2, from_prepared
