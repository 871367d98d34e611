"""The resource limits of a node's client port (node/limits.py, docs/limits.md), through
an in-process standalone (a node and its coordinator, one shard) with small limits.

Each limit refuses the call past it with RESOURCE_EXHAUSTED, naming the limit and its
settings; what was held is given back when a call, stream or session ends, or staged
rows are published or discarded; and the shard serves normal writes and reads after.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pyarrow as pa
import pytest

from in_process import until_online
from leader_and_follower import leader_and_follower
from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
from quorumstore.node.limits import RequestLimits
from quorumstore.node.node import Node, NodeConfig
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import quorumstore_data_pb2 as data_pb
from quorumstore.proto import quorumstore_data_pb2_grpc as data_grpc
from quorumstore.proto.oxia_client_pb2_grpc import OxiaClientStub
from quorumstore.storage.write_batch import WriteBatchBuilder
from quorumstore.wire.schemas import ROWS_SCHEMA

pytestmark = pytest.mark.integration

T = TypeVar("T")
TIMEOUT = 10
NAMESPACE, SHARD = "default", 0
LIMITS = RequestLimits(
    max_ops_per_request=10,
    max_request_bytes=64 << 10,
    max_calls_per_connection=6,
    max_sessions_per_client=2,
    max_streams_per_client=3,
    max_staged_bytes_per_client=1 << 30,
    max_staged_bytes_total=1 << 30,
)
#: Each test channel is a connection of its own (gRPC otherwise shares one per address).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@asynccontextmanager
async def standalone(data_dir: Path, limits: RequestLimits = LIMITS) -> AsyncIterator[str]:
    """What `quorumstore standalone` runs, in this process, with `limits`; yields its
    client address once the shard has a leader."""
    node = Node(NodeConfig(data_dir / "node", wal_sync=False, limits=limits))
    address = await node.start()
    coordinator = CoordinatorServer(
        CoordinatorServerConfig(
            nodes=[address],
            metadata_url=str(data_dir / "coordinator" / "metadata.pb"),
            internal_addresses={address: node.internal_address},
            replication_factor=1,
        )
    )
    await coordinator.start()
    try:
        await until_online(coordinator)
        yield address
    finally:
        await coordinator.stop()
        await node.stop()


def channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=OWN_CONNECTION)


def writes(count: int, prefix: str = "/k") -> pb.WriteRequest:
    return pb.WriteRequest(
        shard=SHARD, puts=[pb.PutRequest(key=f"{prefix}{i}", value=b"v") for i in range(count)]
    )


def gets(count: int) -> pb.ReadRequest:
    return pb.ReadRequest(shard=SHARD, gets=[pb.GetRequest(key=f"/k{i}") for i in range(count)])


async def responses(call: Any) -> list[Any]:
    return [response async for response in call]


async def refused(call: Awaitable[Any]) -> str:
    """The details of `call`, which must fail with RESOURCE_EXHAUSTED."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value
    return str(caught.value.details())


async def eventually(attempt: Callable[[], Awaitable[T]]) -> T:
    """`attempt()`, repeated while it is refused for a limit: what a call held is given
    back once the server has seen it end, which a cancelling client does not wait for."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while True:
        try:
            return await attempt()
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            if asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.05)


async def still_serves(address: str) -> None:
    """A put and a get of the shard, on a connection of their own."""
    async with channel(address) as fresh:
        stub = OxiaClientStub(fresh)
        put = await stub.Write(writes(1, "/after"), timeout=TIMEOUT)
        assert put.puts[0].status == pb.OK
        [read] = await responses(
            stub.Read(
                pb.ReadRequest(shard=SHARD, gets=[pb.GetRequest(key="/after0", include_value=True)])
            )
        )
        assert read.gets[0].status == pb.OK and read.gets[0].value == b"v"


def test_requests_of_too_many_ops_are_refused(tmp_path: Path) -> None:
    expected = (
        "the request has 11 ops, more than the limit of 10 "
        "(--max-ops-per-request, spark.quorumstore.maxOpsPerRequest; docs/limits.md)"
    )

    async def scenario() -> None:
        async with standalone(tmp_path) as address, channel(address) as ch:
            stub = OxiaClientStub(ch)
            assert len((await stub.Write(writes(10), timeout=TIMEOUT)).puts) == 10
            assert await refused(stub.Write(writes(11), timeout=TIMEOUT)) == expected
            mixed = pb.WriteRequest(
                shard=SHARD,
                puts=writes(5).puts,
                deletes=[pb.DeleteRequest(key=f"/d{i}") for i in range(5)],
                delete_ranges=[pb.DeleteRangeRequest(start_inclusive="/x", end_exclusive="/y")],
            )
            assert await refused(stub.Write(mixed, timeout=TIMEOUT)) == expected
            assert len((await responses(stub.Read(gets(10))))[0].gets) == 10
            assert await refused(responses(stub.Read(gets(11)))) == expected
            # On a write stream, the writes before the refused one are answered.
            stream = stub.WriteStream()
            await stream.write(writes(1))
            assert (await stream.read()).puts[0].status == pb.OK
            await stream.write(writes(11))
            assert await refused(stream.read()) == expected
            await still_serves(address)

    asyncio.run(scenario())


def test_a_request_above_the_byte_limit_is_refused_by_grpc(tmp_path: Path) -> None:
    """gRPC refuses it before any servicer runs, in its own words: they name the
    limit's value, not its setting (docs/limits.md says which setting that is)."""
    limit = LIMITS.max_request_bytes

    async def scenario() -> None:
        async with standalone(tmp_path) as address, channel(address) as ch:
            stub = OxiaClientStub(ch)
            big = pb.WriteRequest(shard=SHARD, puts=[pb.PutRequest(key="/big", value=b"x" * limit)])
            details = await refused(stub.Write(big, timeout=TIMEOUT))
            assert details.endswith(
                f"Received message larger than max ({big.ByteSize()} vs. {limit})"
            )
            rows = pa.table({"key": ["/big"], "value": [b"x" * limit]}, ROWS_SCHEMA)
            arrow = data_pb.WriteArrowRequest(namespace=NAMESPACE, shard=SHARD, ipc=ipc_bytes(rows))
            write_arrow = data_grpc.QuorumstoreDataStub(ch).WriteArrow(arrow, timeout=TIMEOUT)
            assert f"vs. {limit})" in await refused(write_arrow)
            fits = pb.WriteRequest(
                shard=SHARD, puts=[pb.PutRequest(key="/fits", value=b"x" * 1000)]
            )
            assert (await stub.Write(fits, timeout=TIMEOUT)).puts[0].status == pb.OK
            await still_serves(address)

    asyncio.run(scenario())


def test_replication_carries_entries_above_the_client_ports_byte_limit(tmp_path: Path) -> None:
    """The limit is the client port's: the internal port still takes replication's
    large entries."""
    limits = dataclasses.replace(LIMITS, max_request_bytes=1024)

    async def scenario() -> None:
        async with leader_and_follower(tmp_path, (NAMESPACE, SHARD), limits=limits) as (leader, _):
            batch = WriteBatchBuilder()
            batch.add_put("/large", b"x" * (64 << 10))
            payload = batch.build(1_700_000_000_000)
            result = await asyncio.wait_for(leader.hosts[(NAMESPACE, SHARD)].write(payload), 10)
            assert result.results[0].version is not None  # committed on the follower's Ack

    asyncio.run(scenario())


def test_calls_past_the_limit_of_a_connection_are_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with standalone(tmp_path) as address, channel(address) as ch:
            stub = OxiaClientStub(ch)
            streams = [stub.WriteStream() for _ in range(LIMITS.max_calls_per_connection)]
            for stream in streams:  # each holds a call in progress until it ends
                await stream.write(writes(1))
                await stream.read()
            details = await refused(stub.Write(writes(1), timeout=TIMEOUT))
            assert details.startswith("connection ipv4:127.0.0.1:")
            assert details.endswith(
                "would have 7 calls in progress with this one, more than the limit of 6 "
                "(--max-calls-per-connection, spark.quorumstore.maxCallsPerConnection; "
                "docs/limits.md)"
            )
            async with channel(address) as other:  # another connection has its own
                await OxiaClientStub(other).Write(writes(1), timeout=TIMEOUT)
            await streams[0].done_writing()
            assert await streams[0].read() is grpc.aio.EOF  # the call ended ...
            await stub.Write(writes(1), timeout=TIMEOUT)  # ... and gave its place back
            streams[1].cancel()  # a cancelled call gives it back too
            await eventually(lambda: stub.Write(writes(1), timeout=TIMEOUT))
            for stream in streams[2:]:
                stream.cancel()
            await still_serves(address)

    asyncio.run(scenario())


def test_streams_past_the_limit_of_a_client_are_refused(tmp_path: Path) -> None:
    """The limit is the client host's, over all its connections."""

    async def scenario() -> None:
        async with standalone(tmp_path) as address, channel(address) as a, channel(address) as b:
            notifications = [
                OxiaClientStub(a).GetNotifications(pb.NotificationsRequest(shard=SHARD))
                for _ in range(2)
            ]
            assignments = OxiaClientStub(b).GetShardAssignments(
                pb.ShardAssignmentsRequest(namespace=NAMESPACE)
            )
            for stream in [*notifications, assignments]:
                await stream.read()
            sequences = OxiaClientStub(b).GetSequenceUpdates(
                pb.GetSequenceUpdatesRequest(shard=SHARD, key="/seq")
            )
            assert await refused(sequences.read()) == (
                "client 127.0.0.1 would have 4 notification, shard assignment and sequence "
                "update streams open on this node with this one, more than the limit of 3 "
                "(--max-streams-per-client, spark.quorumstore.maxStreamsPerClient; "
                "docs/limits.md)"
            )
            await OxiaClientStub(b).Write(writes(1), timeout=TIMEOUT)  # other calls go on
            notifications[0].cancel()

            async def subscribe() -> Any:
                stream = OxiaClientStub(b).GetNotifications(pb.NotificationsRequest(shard=SHARD))
                await stream.read()
                return stream

            again = await eventually(subscribe)
            for stream in [again, notifications[1], assignments]:
                stream.cancel()
            await still_serves(address)

    asyncio.run(scenario())


def test_sessions_past_the_limit_of_a_client_are_refused(tmp_path: Path) -> None:
    """A session counts until it is closed or expires."""

    def create(timeout_ms: int = 30_000) -> pb.CreateSessionRequest:
        return pb.CreateSessionRequest(
            shard=SHARD, session_timeout_ms=timeout_ms, client_identity="limits"
        )

    async def scenario() -> None:
        async with standalone(tmp_path) as address, channel(address) as ch:
            stub = OxiaClientStub(ch)
            kept = await stub.CreateSession(create(), timeout=TIMEOUT)
            await stub.CreateSession(create(timeout_ms=2000), timeout=TIMEOUT)  # left to expire
            assert await refused(stub.CreateSession(create(), timeout=TIMEOUT)) == (
                "client 127.0.0.1 would have 3 sessions open on the shards this node leads "
                "with this one, more than the limit of 2 (--max-sessions-per-client, "
                "spark.quorumstore.maxSessionsPerClient; docs/limits.md)"
            )
            await stub.CloseSession(
                pb.CloseSessionRequest(shard=SHARD, session_id=kept.session_id), timeout=TIMEOUT
            )
            await stub.CreateSession(create(), timeout=TIMEOUT)  # the closed one's place
            await eventually(lambda: stub.CreateSession(create(), timeout=TIMEOUT))  # expired
            await refused(stub.CreateSession(create(), timeout=TIMEOUT))
            await still_serves(address)

    asyncio.run(scenario())


@pytest.mark.parametrize("limit", ["max_staged_bytes_per_client", "max_staged_bytes_total"])
def test_staging_past_a_byte_limit_is_refused(tmp_path: Path, limit: str) -> None:
    """Staged rows count until they are published or discarded."""
    rows = pa.table({"key": ["/staged"], "value": [b"x" * 10_000]}, ROWS_SCHEMA)
    chunk = ipc_bytes(rows)
    limits = dataclasses.replace(LIMITS, **{limit: 2 * len(chunk)})
    setting = {
        "max_staged_bytes_per_client": (
            "client 127.0.0.1 would have",
            "--max-staged-bytes-per-client, spark.quorumstore.maxStagedBytesPerClient",
        ),
        "max_staged_bytes_total": (
            "this node would hold",
            "--max-staged-bytes-total, spark.quorumstore.maxStagedBytesTotal",
        ),
    }[limit]

    async def scenario() -> None:
        async with standalone(tmp_path, limits) as address, channel(address) as ch:
            stub = data_grpc.QuorumstoreDataStub(ch)

            async def stage(write_id: str, number: int) -> data_pb.StageArrowResponse:
                request = data_pb.StageArrowRequest(
                    namespace=NAMESPACE,
                    shard=SHARD,
                    write_id=write_id,
                    part="p0-a0",
                    chunk=number,
                    ipc=chunk,
                )
                response: data_pb.StageArrowResponse = await stub.StageArrow(
                    request, timeout=TIMEOUT
                )
                return response

            published, discarded, last = (uuid.uuid4().hex for _ in range(3))
            await stage(published, 0)
            await stage(published, 0)  # the same chunk again counts once
            await stage(published, 1)
            details = await refused(stage(published, 2))
            assert details.startswith(f"{setting[0]} {3 * len(chunk)} bytes")
            assert f"({2 * len(chunk)} bytes; {setting[1]}; docs/limits.md)" in details
            staged = data_pb.StagedRows(
                write_id=published, parts=[data_pb.StagedPart(part="p0-a0", chunks=2, rows=2)]
            )
            await stub.WriteArrow(
                data_pb.WriteArrowRequest(namespace=NAMESPACE, shard=SHARD, staged=staged),
                timeout=TIMEOUT,
            )
            await stage(discarded, 0)  # the published rows' place
            await stage(discarded, 1)
            await refused(stage(discarded, 2))
            await stub.DiscardStaged(data_pb.DiscardStagedRequest(write_id=discarded))
            await stage(last, 0)  # the discarded rows' place
            await stage(last, 1)
            await still_serves(address)

    asyncio.run(scenario())
