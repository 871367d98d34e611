"""Linearizable reads: the Oxia reads of three real ShardHosts, wired in memory.

A replica that believes it leads answers a read only after its read barrier (a no-op
entry proposed after the read) has committed in its term, so a leader deposed without
knowing it never serves its stale value.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from quorumstore.node.failures import ReplicaFailure
from quorumstore.node.oxia.errors import RequestError
from quorumstore.node.oxia.reads import Reads
from quorumstore.node.shard_host import ShardHost
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.protocol.messages import (
    COORDINATOR,
    BecomeLeader,
    NewTerm,
    Outbound,
    SendSnapshot,
    ShardKey,
)
from quorumstore.protocol.types import EMPTY_POSITION
from quorumstore.storage.write_batch import WriteBatchBuilder
from quorumstore.wire.status import OxiaCode

pytestmark = pytest.mark.integration

SHARD: ShardKey = ("default", 0)
READS = Reads(1000, 1024 * 1024)


class MemoryNetwork:
    """Delivers each message on a later turn of the loop, except over cut links."""

    def __init__(self) -> None:
        self.hosts: dict[str, ShardHost] = {}
        #: (sender, receiver) links whose messages are dropped.
        self.cut: set[tuple[str, str]] = set()

    def send(self, sender: ShardHost, out: Outbound) -> None:
        if out.to == COORDINATOR or (sender.node, out.to) in self.cut:
            return
        asyncio.get_running_loop().call_soon(self.hosts[out.to].step, out.message)

    def send_snapshot(self, sender: ShardHost, request: SendSnapshot) -> None:
        raise AssertionError(f"no snapshot expected, got {request}")

    def acks_in_transit(self, shard: ShardKey) -> bool:
        return False

    def client_address(self, peer: str | None) -> str | None:
        return peer


def _no_failure(failure: ReplicaFailure) -> None:
    pytest.fail(f"a replica failed: {failure}")


def _put(key: str, value: bytes) -> bytes:
    batch = WriteBatchBuilder()
    batch.add_put(key, value)
    return batch.build(1_700_000_000_000)


async def _get(host: ShardHost, key: str) -> pb.GetResponse:
    responses = [r async for r in READS.read(host, 0, [pb.GetRequest(key=key, include_value=True)])]
    return responses[0].gets[0]


async def _until(condition: object) -> None:
    async with asyncio.timeout(10):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)


@asynccontextmanager
async def _three_replicas(tmp_path: Path) -> AsyncIterator[MemoryNetwork]:
    """Replicas a, b, c of one shard; a leads term 1 and has committed its no-op."""
    network = MemoryNetwork()
    with ThreadPoolExecutor(2) as io:
        for name in "abc":
            network.hosts[name] = ShardHost(
                name, SHARD, tmp_path / name, network, io, on_failure=_no_failure
            )
        a = network.hosts["a"]
        try:
            for host in network.hosts.values():
                host.step(NewTerm(SHARD, 1))
            a.step(BecomeLeader(SHARD, 1, 3, {"b": EMPTY_POSITION, "c": EMPTY_POSITION}))
            await _until(lambda: a.machine.applied_position.offset >= 0)
            yield network
        finally:
            for host in network.hosts.values():
                host.close()


async def _elect_b_behind_a(network: MemoryNetwork) -> None:
    """b leads term 2 with c; a, which hears nothing from b, still believes it leads term 1."""
    a, b, c = (network.hosts[n] for n in "abc")
    network.cut.add(("b", "a"))
    for host in (b, c):
        host.step(NewTerm(SHARD, 2))
    b.step(BecomeLeader(SHARD, 2, 3, {"a": a.wal.head, "c": c.wal.head}))
    await b.write(_put("/k", b"new"))
    assert a.is_leader() and a.replica.term == 1


def test_a_deposed_leader_refuses_a_read_instead_of_serving_its_stale_value(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with _three_replicas(tmp_path) as network:
            a = network.hosts["a"]
            await a.write(_put("/k", b"old"))
            await _elect_b_behind_a(network)
            assert a.reader().get("/k") is not None  # the stale value a would serve
            with pytest.raises(RequestError) as refused:
                await _get(a, "/k")
            assert refused.value.code is OxiaCode.NODE_IS_NOT_LEADER
            assert not a.is_leader()  # the followers' refusals told it of term 2

    asyncio.run(scenario())


def test_a_partitioned_leader_never_answers_a_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _three_replicas(tmp_path) as network:
            a = network.hosts["a"]
            await a.write(_put("/k", b"old"))
            network.cut |= {("a", "b"), ("a", "c"), ("c", "a")}
            await _elect_b_behind_a(network)
            read = asyncio.ensure_future(_get(a, "/k"))
            await asyncio.sleep(0.5)
            assert not read.done(), read.result()
            a.close()  # shut down while partitioned: the read fails as not-leader
            with pytest.raises(RequestError) as refused:
                await read
            assert refused.value.code is OxiaCode.NODE_IS_NOT_LEADER

    asyncio.run(scenario())


def test_concurrent_reads_share_one_barrier_entry_and_see_earlier_writes(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with _three_replicas(tmp_path) as network:
            a = network.hosts["a"]
            await a.write(_put("/k", b"v1"))
            head = a.wal.head.offset
            answers = await asyncio.gather(*(_get(a, "/k") for _ in range(10)))
            assert {answer.value for answer in answers} == {b"v1"}
            assert a.wal.head.offset == head + 1  # one no-op for all ten
            await a.write(_put("/k", b"v2"))
            assert (await _get(a, "/k")).value == b"v2"
            assert a.wal.head.offset == head + 3  # the write, then one more no-op

    asyncio.run(scenario())
