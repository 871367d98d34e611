"""The Oxia client API servicer, through a real grpc.aio server and the generated stub.

The shards behind it are real: a ShardStateMachine over MemoryKv or RocksKv, hosted
as a single-replica shard whose write() makes the next log entry and applies it
(one replica is its own majority). The server runs on its own event loop thread;
the tests are plain synchronous gRPC clients, as the official clients are.
"""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from quorumstore.node.oxia.routing import ShardHostApi
from quorumstore.node.oxia.servicer import OxiaClientServicer
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.proto import replication_pb2 as rpb
from quorumstore.protocol.replica import NotLeaderError
from quorumstore.protocol.types import LogPosition, Role, make_entry
from quorumstore.storage.kv import KvStore
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.results import EntryResult
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.wire.channels import SERVER_OPTIONS
from quorumstore.wire.keys import compare_keys
from quorumstore.wire.metadata import LEADER_HINT_METADATA_KEY, ROUTING_METADATA_KEY

pytestmark = pytest.mark.integration

T = TypeVar("T")
TERM = 1
NOW_MS = 1_700_000_000_000
FOLLOWER_HINT = "127.0.0.1:7002"  # shard 2's leader, as its local follower knows it
REMOTE_LEADER = "10.0.0.9:6648"  # shard 5's leader, from the routing table
TIMEOUT = 10


# --------------------------------------------------------------- the shards


class SingleReplicaHost:
    """A one-replica shard: each write becomes the next entry and is applied at once."""

    def __init__(self, namespace: str, shard: int, kv: KvStore) -> None:
        self.namespace = namespace
        self.shard = shard
        self.kv = kv
        self.state = ShardStateMachine(kv)
        self.leader = True
        self.hint: str | None = None
        #: Leadership lost after the servicer's check, before replication.
        self.deposed = False
        #: When set, writes wait for it before they are applied.
        self.gate: asyncio.Event | None = None
        #: The last entry handed out; a write takes its log position when called, as the
        #: real host does, so several may wait at the gate and apply in call order.
        self._last = self.state.applied_position
        self._changed = asyncio.Event()

    def is_leader(self) -> bool:
        return self.leader

    def leader_hint(self) -> str | None:
        return self.hint

    async def write(self, payload: bytes) -> EntryResult:
        if not self.leader or self.deposed:
            raise NotLeaderError((self.namespace, self.shard), Role.FOLLOWER, TERM, self.hint)
        entry = make_entry(self._last, TERM, payload)
        self._last = LogPosition(entry.term, entry.offset, entry.checksum)
        if self.gate is not None:
            await self.gate.wait()
        [result] = self.state.apply([entry])
        assert result is not None
        self._changed.set()
        self._changed = asyncio.Event()
        return result

    async def read_barrier(self) -> None:
        """One replica is its own majority: it knows it leads, with all writes applied."""
        if not self.leader or self.deposed:
            raise NotLeaderError((self.namespace, self.shard), Role.FOLLOWER, TERM, self.hint)

    def reader(self) -> ShardStateMachine:
        return self.state

    def changes(self) -> asyncio.Event:
        return self._changed


class Directory:
    """The node side of the servicer: hosted shards, routing table, clock."""

    def __init__(self, table: rpb.ShardAssignmentsUpdate, hosts: list[SingleReplicaHost]) -> None:
        self.address = ""  # the server's address, once it listens
        self.table = table
        self.hosts = {(h.namespace, h.shard): h for h in hosts}
        self.clock = NOW_MS
        self._changed = asyncio.Condition()

    def shard_host(self, namespace: str, shard: int) -> ShardHostApi | None:
        return self.hosts.get((namespace, shard))

    def assignments(self) -> rpb.ShardAssignmentsUpdate:
        return self.table

    async def assignments_changed(self, version: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.table.version > version)

    def now_ms(self) -> int:
        return self.clock

    async def push(self, table: rpb.ShardAssignmentsUpdate) -> None:
        async with self._changed:
            self.table = table
            self._changed.notify_all()


def shard_entry(shard: int, lo: int, hi: int, leader: str) -> rpb.ShardAssignment:
    return rpb.ShardAssignment(
        shard=shard,
        hash_range=rpb.HashRange(min_hash_inclusive=lo, max_hash_inclusive=hi),
        term=TERM,
        leader=leader,
    )


def routing_table(
    version: int, self_address: str, shard1_leader: str | None = None
) -> rpb.ShardAssignmentsUpdate:
    """default: shards 0, 1 led here, 2 followed here; other: 5 (remote), 6 (no leader)."""
    third = 0x55555555
    return rpb.ShardAssignmentsUpdate(
        version=version,
        namespaces=[
            rpb.NamespaceAssignments(
                namespace="default",
                shards=[
                    shard_entry(0, 0, third - 1, self_address),
                    shard_entry(1, third, 2 * third - 1, shard1_leader or self_address),
                    shard_entry(2, 2 * third, 0xFFFFFFFF, FOLLOWER_HINT),
                ],
            ),
            rpb.NamespaceAssignments(
                namespace="other",
                shards=[
                    shard_entry(5, 0, 0x7FFFFFFF, REMOTE_LEADER),
                    shard_entry(6, 0x80000000, 0xFFFFFFFF, ""),
                ],
            ),
        ],
    )


# --------------------------------------------------------------- the server


class ServerThread:
    """A grpc.aio server with the servicer, on an event loop of its own thread."""

    def __init__(self, directory: Directory, **limits: Any) -> None:
        self.directory = directory
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self.port = self.run(self._start(limits))
        self.address = f"127.0.0.1:{self.port}"

    async def _start(self, limits: dict[str, Any]) -> int:
        self._server = grpc.aio.server(options=SERVER_OPTIONS)  # as a node's
        self.servicer = OxiaClientServicer(self.directory, **limits)
        oxia_client_pb2_grpc.add_OxiaClientServicer_to_server(self.servicer, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.directory.address = f"127.0.0.1:{port}"
        return port

    def run(self, coro: Any) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    def call(self, fn: Callable[[], T]) -> T:
        """Call `fn` on the server's loop (where the shards are used) and return its result."""

        async def wrapper() -> T:
            return fn()

        return self.run(wrapper())

    def stop(self) -> None:
        if self._server is not None:
            self.run(self._server.stop(None))
            self.run(self.servicer.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(TIMEOUT)
        self.loop.close()


class _Metadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds fixed invocation metadata to every call of a channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _with(self, details: Any) -> Any:
        return details._replace(metadata=(*(details.metadata or ()), *self._metadata))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with(details), requests)


def routed_channel(address: str, routing: str) -> grpc.Channel:
    """A channel whose calls ask for `routing` ("leader": Oxia's, or "gateway")."""
    channel = grpc.insecure_channel(address)
    return grpc.intercept_channel(channel, _Metadata(((ROUTING_METADATA_KEY, routing),)))


class Cluster:
    """One server over three hosted shards of `default`, and a stub connected to it.

    The stub asks for Oxia's leader routing; grpc-python clients get gateway routing
    by default (see `node/oxia/relay.py`).
    """

    def __init__(
        self, make_kv: Callable[[str], KvStore], routing: str = "leader", **limits: Any
    ) -> None:
        self.hosts = [
            SingleReplicaHost("default", shard, make_kv(f"s{shard}")) for shard in (0, 1, 2)
        ]
        self.hosts[2].leader = False
        self.hosts[2].hint = FOLLOWER_HINT
        self.directory = Directory(rpb.ShardAssignmentsUpdate(), self.hosts)
        self.server = ServerThread(self.directory, **limits)
        self.directory.table = routing_table(1, self.server.address)
        self.channel = routed_channel(self.server.address, routing)
        self.stub = oxia_client_pb2_grpc.OxiaClientStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.server.stop()
        for host in self.hosts:
            host.kv.close()

    # Shorthands for the common requests.

    def write(self, shard: int = 0, **ops: Any) -> pb.WriteResponse:
        return self.stub.Write(pb.WriteRequest(shard=shard, **ops), timeout=TIMEOUT)

    def put(self, key: str, value: bytes = b"v", shard: int = 0, **options: Any) -> pb.PutResponse:
        return self.write(shard, puts=[pb.PutRequest(key=key, value=value, **options)]).puts[0]

    def delete(self, key: str, shard: int = 0, **options: Any) -> pb.DeleteResponse:
        return self.write(shard, deletes=[pb.DeleteRequest(key=key, **options)]).deletes[0]

    def get(self, key: str, shard: int = 0, **options: Any) -> pb.GetResponse:
        options.setdefault("include_value", True)
        request = pb.ReadRequest(shard=shard, gets=[pb.GetRequest(key=key, **options)])
        [response] = self.stub.Read(request, timeout=TIMEOUT)
        return response.gets[0]

    def list(self, start: str = "", end: str = "", shard: int = 0) -> list[str]:
        request = pb.ListRequest(shard=shard, start_inclusive=start, end_exclusive=end)
        return [k for r in self.stub.List(request, timeout=TIMEOUT) for k in r.keys]

    def scan(self, start: str = "", end: str = "", shard: int = 0) -> list[pb.GetResponse]:
        request = pb.RangeScanRequest(shard=shard, start_inclusive=start, end_exclusive=end)
        return [rec for r in self.stub.RangeScan(request, timeout=TIMEOUT) for rec in r.records]


def kv_factory(kind: str, tmp_path: Path) -> Callable[[str], KvStore]:
    if kind == "memory":
        return lambda name: MemoryKv()
    return lambda name: RocksKv(tmp_path / name)


@pytest.fixture(params=["memory", "rocks"])
def kv_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def cluster(kv_kind: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(kv_factory(kv_kind, tmp_path))
    yield c
    c.close()


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Tiny limits, so that limits and chunking are cheap to reach."""
    c = Cluster(
        kv_factory("memory", tmp_path),
        max_key_bytes=16,
        max_value_bytes=32,
        max_response_items=2,
        max_response_bytes=64,
    )
    yield c
    c.close()


def rpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def assert_invalid(call: Callable[[], Any], *fragments: str) -> None:
    error = rpc_error(call)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    for fragment in fragments:
        assert fragment in error.details()


def hierarchical(keys: list[str]) -> list[str]:
    return sorted(keys, key=functools.cmp_to_key(compare_keys))


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)


# ------------------------------------------------------------ assignments


def expected_default_map(address: str, shard1_leader: str | None = None) -> pb.ShardAssignments:
    third = 0x55555555
    ranges = [(0, third - 1), (third, 2 * third - 1), (2 * third, 0xFFFFFFFF)]
    leaders = [address, shard1_leader or address, FOLLOWER_HINT]
    return pb.ShardAssignments(
        namespaces={
            "default": pb.NamespaceShardsAssignment(
                shard_key_router=pb.XXHASH3,
                assignments=[
                    pb.ShardAssignment(
                        shard=shard,
                        leader=leader,
                        int32_hash_range=pb.Int32HashRange(
                            min_hash_inclusive=lo, max_hash_inclusive=hi
                        ),
                    )
                    for shard, (lo, hi), leader in zip(range(3), ranges, leaders)
                ],
            )
        }
    )


def test_assignments_send_the_full_namespace_map(cluster: Cluster) -> None:
    stream = cluster.stub.GetShardAssignments(pb.ShardAssignmentsRequest())  # "" is "default"
    assert next(stream) == expected_default_map(cluster.server.address)
    stream.cancel()


def test_assignments_keep_a_shard_without_leader_with_an_empty_address(cluster: Cluster) -> None:
    stream = cluster.stub.GetShardAssignments(pb.ShardAssignmentsRequest(namespace="other"))
    [assignment] = next(stream).namespaces.values()
    assert [(a.shard, a.leader) for a in assignment.assignments] == [(5, REMOTE_LEADER), (6, "")]
    stream.cancel()


def test_assignments_resent_on_change_but_not_on_unrelated_change(cluster: Cluster) -> None:
    address = cluster.server.address
    stream = cluster.stub.GetShardAssignments(pb.ShardAssignmentsRequest(namespace="default"))
    assert next(stream) == expected_default_map(address)

    unrelated = routing_table(2, address)
    unrelated.namespaces[1].shards[1].leader = "10.0.0.7:6648"  # only `other` changes
    cluster.server.run(cluster.directory.push(unrelated))
    cluster.server.run(cluster.directory.push(routing_table(3, address, shard1_leader="h:1")))
    assert next(stream) == expected_default_map(address, shard1_leader="h:1")
    stream.cancel()


def test_assignments_wait_for_the_first_table(cluster: Cluster) -> None:
    cluster.directory.table = rpb.ShardAssignmentsUpdate()  # nothing pushed yet
    stream = cluster.stub.GetShardAssignments(pb.ShardAssignmentsRequest())
    cluster.server.run(cluster.directory.push(routing_table(1, cluster.server.address)))
    assert next(stream) == expected_default_map(cluster.server.address)
    stream.cancel()


def test_assignments_of_an_unknown_namespace_fail_with_oxia_namespace_not_found(
    cluster: Cluster,
) -> None:
    stream = cluster.stub.GetShardAssignments(pb.ShardAssignmentsRequest(namespace="nope"))
    error = rpc_error(lambda: next(stream))
    # Oxia's code 110 reaches C-core clients as UNKNOWN; the wire code is checked below.
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert "namespace not found: 'nope'" in error.details()
    assert "['default', 'other']" in error.details()


# ------------------------------------------------------------------ writes


def test_put_then_get(cluster: Cluster) -> None:
    put = cluster.put("/a", b"hello")
    assert put.status == pb.OK
    assert put.version == pb.Version(
        version_id=0, modifications_count=0, created_timestamp=NOW_MS, modified_timestamp=NOW_MS
    )
    assert not put.version.HasField("session_id")
    assert not put.HasField("key")

    got = cluster.get("/a")
    assert (got.status, got.value, got.version) == (pb.OK, b"hello", put.version)
    assert not got.HasField("key")  # an EQUAL match names no key, as in Oxia

    without_value = cluster.get("/a", include_value=False)
    assert without_value.status == pb.OK and not without_value.HasField("value")
    assert cluster.get("/missing").status == pb.KEY_NOT_FOUND


def test_overwrite_counts_modifications_and_keeps_creation_time(cluster: Cluster) -> None:
    cluster.put("/a", b"1")
    cluster.directory.clock = NOW_MS + 5
    second = cluster.put("/a", b"2", client_identity="me", partition_key="p")
    assert second.version == pb.Version(
        version_id=1,
        modifications_count=1,
        created_timestamp=NOW_MS,
        modified_timestamp=NOW_MS + 5,
        client_identity="me",
    )
    assert cluster.get("/a").value == b"2"


def test_conditional_put(cluster: Cluster) -> None:
    absent = -1
    assert cluster.put("/k", b"1", expected_version_id=absent).status == pb.OK
    assert cluster.put("/k", b"x", expected_version_id=absent).status == pb.UNEXPECTED_VERSION_ID
    version = cluster.get("/k").version.version_id
    assert (
        cluster.put("/k", b"2", expected_version_id=version + 7).status == pb.UNEXPECTED_VERSION_ID
    )
    assert cluster.put("/k", b"2", expected_version_id=version).status == pb.OK
    assert cluster.put("/new", b"x", expected_version_id=0).status == pb.UNEXPECTED_VERSION_ID
    assert cluster.get("/k").value == b"2"
    assert cluster.get("/new").status == pb.KEY_NOT_FOUND


def test_delete(cluster: Cluster) -> None:
    version = cluster.put("/k").version.version_id
    assert cluster.delete("/k", expected_version_id=version + 1).status == pb.UNEXPECTED_VERSION_ID
    assert cluster.delete("/k", expected_version_id=version).status == pb.OK
    assert cluster.get("/k").status == pb.KEY_NOT_FOUND
    assert cluster.delete("/k").status == pb.KEY_NOT_FOUND


def test_delete_range_follows_hierarchical_order(cluster: Cluster) -> None:
    keys = ["/a/b", "/a/z", "/a/b/c", "/a", "/b"]
    cluster.write(puts=[pb.PutRequest(key=k, value=b"v") for k in keys])
    # [/a/, /a/~) holds the keys one level below /a: not /a/b/c, a level deeper.
    response = cluster.write(
        delete_ranges=[pb.DeleteRangeRequest(start_inclusive="/a/", end_exclusive="/a/~")]
    )
    assert [r.status for r in response.delete_ranges] == [pb.OK]
    assert cluster.list() == hierarchical(["/a", "/b", "/a/b/c"])


def test_one_request_applies_puts_then_deletes_then_ranges_as_one_entry(cluster: Cluster) -> None:
    response = cluster.write(
        puts=[pb.PutRequest(key="/x", value=b"1"), pb.PutRequest(key="/y", value=b"2")],
        deletes=[pb.DeleteRequest(key="/x"), pb.DeleteRequest(key="/nope")],
        delete_ranges=[pb.DeleteRangeRequest(start_inclusive="/y", end_exclusive="/z")],
    )
    assert [p.status for p in response.puts] == [pb.OK, pb.OK]
    assert [p.version.version_id for p in response.puts] == [0, 1]
    assert [d.status for d in response.deletes] == [pb.OK, pb.KEY_NOT_FOUND]
    assert [d.status for d in response.delete_ranges] == [pb.OK]
    assert cluster.list() == []
    assert cluster.server.call(lambda: cluster.hosts[0].state.applied_position.offset) == 0


def test_an_empty_write_writes_nothing(cluster: Cluster) -> None:
    assert cluster.write() == pb.WriteResponse()
    assert cluster.server.call(lambda: cluster.hosts[0].state.applied_position.offset) == -1


def test_write_stream_answers_in_order_while_writing_concurrently(cluster: Cluster) -> None:
    gate = cluster.server.call(asyncio.Event)
    cluster.hosts[0].gate = gate
    requests: queue.Queue[pb.WriteRequest | None] = queue.Queue()
    responses = cluster.stub.WriteStream(iter(requests.get, None), timeout=TIMEOUT)

    requests.put(pb.WriteRequest(shard=0, puts=[pb.PutRequest(key="/slow", value=b"0")]))
    requests.put(pb.WriteRequest(shard=1, puts=[pb.PutRequest(key="/fast", value=b"1")]))
    # The second write completes while the first still waits...
    wait_until(lambda: cluster.server.call(lambda: cluster.hosts[1].state.get("/fast")) is not None)
    assert cluster.server.call(lambda: cluster.hosts[0].state.get("/slow")) is None
    # ...but is answered after it.
    cluster.server.loop.call_soon_threadsafe(gate.set)
    first, second = next(responses), next(responses)
    assert first.puts[0].status == second.puts[0].status == pb.OK
    assert cluster.server.call(lambda: cluster.hosts[0].state.get("/slow")) is not None
    requests.put(None)
    assert list(responses) == []


def test_write_stream_applies_writes_of_a_shard_in_request_order(cluster: Cluster) -> None:
    values = [str(i).encode() for i in range(50)]
    requests = [pb.WriteRequest(shard=0, puts=[pb.PutRequest(key="/k", value=v)]) for v in values]
    responses = list(cluster.stub.WriteStream(iter(requests), timeout=TIMEOUT))
    assert [r.puts[0].version.modifications_count for r in responses] == list(range(50))
    assert cluster.get("/k").value == values[-1]


def test_concurrent_writes_share_entries_and_apply_as_if_one_after_another(
    cluster: Cluster,
) -> None:
    """While two entries wait in flight, later writes queue and go out merged; each still
    sees the writes before it and gets exactly its own results. Writes naming a key the
    entry already names, and writes with delete ranges, get entries of their own."""
    host = cluster.hosts[0]
    cluster.put("/m/warm-up")  # one-time costs (first request, Arrow kernels) paid here
    gate = cluster.server.call(asyncio.Event)
    host.gate = gate
    before = cluster.server.call(lambda: host.state.applied_position.offset)
    absent = {"expected_version_id": -1}

    def put(key: str, value: bytes, **options: Any) -> pb.WriteRequest:
        return pb.WriteRequest(shard=0, puts=[pb.PutRequest(key=key, value=value, **options)])

    requests = [
        put("/m/a", b"a"),  # these two wait at the gate...
        put("/m/b", b"b"),
        put("/m/c", b"c1", **absent),  # ...these three queue and share one entry
        put("/m/d", b"d"),
        put("/m/e", b"e"),
        put("/m/c", b"c2", **absent),  # /m/c again: its own entry, sees c1
        pb.WriteRequest(
            shard=0,
            puts=[pb.PutRequest(key="/m/f", value=b"f")],
            delete_ranges=[pb.DeleteRangeRequest(start_inclusive="/m/", end_exclusive="/m/b")],
        ),
        put("/m/a", b"a2"),  # after the range deleted /m/a
    ]
    responses = cluster.stub.WriteStream(iter(requests), timeout=TIMEOUT)
    time.sleep(0.5)  # the first two wait at the gate; the rest queue behind them
    cluster.server.loop.call_soon_threadsafe(gate.set)
    got = list(responses)
    assert [[p.status for p in r.puts] for r in got] == [[pb.OK]] * 5 + [
        [pb.UNEXPECTED_VERSION_ID],
        [pb.OK],
        [pb.OK],
    ]
    assert [r.status for r in got[6].delete_ranges] == [pb.OK]
    assert got[7].puts[0].version.modifications_count == 0
    values = {k: cluster.get(k).value for k in ["/m/a", "/m/b", "/m/c", "/m/d", "/m/e", "/m/f"]}
    assert values == {
        "/m/a": b"a2",
        "/m/b": b"b",
        "/m/c": b"c1",
        "/m/d": b"d",
        "/m/e": b"e",
        "/m/f": b"f",
    }
    entries = cluster.server.call(lambda: host.state.applied_position.offset) - before
    assert entries < len(requests)  # e.g. a, b, [c1 d e], c2, the range, a2


def test_write_stream_ends_with_the_status_of_a_refused_request(cluster: Cluster) -> None:
    requests = [
        pb.WriteRequest(shard=0, puts=[pb.PutRequest(key="/ok", value=b"1")]),
        pb.WriteRequest(shard=0, puts=[pb.PutRequest(key="", value=b"2")]),
        pb.WriteRequest(shard=0, puts=[pb.PutRequest(key="/later", value=b"3")]),
    ]
    received: list[pb.WriteResponse] = []
    responses = cluster.stub.WriteStream(iter(requests), timeout=TIMEOUT)
    assert_invalid(lambda: received.extend(responses), "puts[0].key is empty")
    assert [r.puts[0].status for r in received] == [pb.OK]


# ------------------------------------------------------------------- reads


def test_list_and_range_scan_are_in_hierarchical_order(cluster: Cluster) -> None:
    keys = ["/a", "/b", "/a/b", "/a/b/c", "/a/c", "a", "a/z", "a/b/c", "/a/b/c/d", "b"]
    cluster.write(puts=[pb.PutRequest(key=k, value=k.encode()) for k in keys])
    ordered = hierarchical(keys)
    # Fewer segments first at each level: "/a" < "/b" < "/a/b" < "/a/c" < "/a/b/c".
    assert (
        ordered.index("/b")
        < ordered.index("/a/b")
        < ordered.index("/a/c")
        < ordered.index("/a/b/c")
    )
    assert cluster.list() == ordered
    assert cluster.list("/a", "/a/c") == ["/a", "/b", "/a/b"]

    records = cluster.scan("/a/", "")
    assert [r.key for r in records] == [k for k in ordered if compare_keys("/a/", k) <= 0]
    assert all(r.status == pb.OK and r.value == r.key.encode() for r in records)
    assert all(r.version.created_timestamp == NOW_MS for r in records)


def test_list_and_range_scan_stream_in_chunks(small_cluster: Cluster) -> None:
    keys = [f"/k{i:02}" for i in range(7)]
    small_cluster.write(puts=[pb.PutRequest(key=k, value=b"v" * 30) for k in keys])

    chunks = list(small_cluster.stub.List(pb.ListRequest(shard=0), timeout=TIMEOUT))
    assert [len(c.keys) for c in chunks] == [2, 2, 2, 1]  # max_response_items=2
    assert [k for c in chunks for k in c.keys] == keys

    scans = list(small_cluster.stub.RangeScan(pb.RangeScanRequest(shard=0), timeout=TIMEOUT))
    assert [len(c.records) for c in scans] == [2, 2, 2, 1]  # 2 * (4 + 30) bytes >= 64
    assert [r.key for c in scans for r in c.records] == keys


def test_read_answers_every_get_in_order_and_in_chunks(small_cluster: Cluster) -> None:
    small_cluster.write(puts=[pb.PutRequest(key=f"/k{i}", value=b"v") for i in range(3)])
    gets = [pb.GetRequest(key=k, include_value=True) for k in ["/k2", "/x", "/k0", "/k1", "/k1"]]
    chunks = list(small_cluster.stub.Read(pb.ReadRequest(shard=0, gets=gets), timeout=TIMEOUT))
    assert [len(c.gets) for c in chunks] == [2, 2, 1]
    statuses = [g.status for c in chunks for g in c.gets]
    assert statuses == [pb.OK, pb.KEY_NOT_FOUND, pb.OK, pb.OK, pb.OK]
    assert [g.version.version_id for c in chunks for g in c.gets] == [2, 0, 0, 1, 1]


@pytest.mark.parametrize(
    ("comparison", "key", "found"),
    [
        (pb.FLOOR, "/a/3", "/a/3"),
        (pb.FLOOR, "/a/4", "/a/3"),
        (pb.CEILING, "/a/4", "/a/5"),
        (pb.LOWER, "/a/3", "/a/1"),
        (pb.HIGHER, "/a/3", "/a/5"),
        # Deeper keys sort after every key of the level above.
        (pb.HIGHER, "/a/5", "/a/3/x"),
        (pb.LOWER, "/a/3/x", "/a/5"),
        (pb.CEILING, "", "/a/1"),
        (pb.LOWER, "/a/1", None),
        (pb.HIGHER, "/a/3/x", None),
    ],
    ids=lambda v: pb.KeyComparisonType.Name(v) if isinstance(v, int) else repr(v),
)
def test_get_with_comparison_returns_the_key_found(
    cluster: Cluster, comparison: int, key: str, found: str | None
) -> None:
    cluster.write(
        puts=[pb.PutRequest(key=k, value=k.encode()) for k in ["/a/1", "/a/3", "/a/5", "/a/3/x"]]
    )
    response = cluster.get(key, comparison_type=comparison)
    if found is None:
        assert response.status == pb.KEY_NOT_FOUND
    else:
        assert (response.status, response.key, response.value) == (pb.OK, found, found.encode())


# -------------------------------------------------------------- not leader


def assert_not_leader(call: Callable[[], Any], shard: int, hint: str | None) -> None:
    error = rpc_error(call)
    # Oxia's code 106 reaches C-core clients as UNKNOWN; the wire code is checked below.
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert error.details().startswith(f"node is not leader for shard {shard}")
    metadata = dict(error.trailing_metadata() or ())
    if hint is None:
        assert "leader hint" not in error.details()
        assert LEADER_HINT_METADATA_KEY not in metadata
    else:
        assert error.details().endswith(f"; leader hint: {hint}")
        assert metadata[LEADER_HINT_METADATA_KEY] == hint


@pytest.mark.parametrize(
    ("shard", "hint"),
    [(2, FOLLOWER_HINT), (5, REMOTE_LEADER), (6, None)],
    ids=["follower-here", "hosted-elsewhere", "no-leader-yet"],
)
def test_a_shard_not_led_here_is_refused_with_a_leader_hint(
    cluster: Cluster, shard: int, hint: str | None
) -> None:
    assert_not_leader(lambda: cluster.put("/k", shard=shard), shard, hint)
    assert_not_leader(lambda: cluster.get("/k", shard=shard), shard, hint)
    assert_not_leader(lambda: cluster.list(shard=shard), shard, hint)
    assert_not_leader(lambda: cluster.scan(shard=shard), shard, hint)


def test_leadership_lost_during_a_write_is_refused_as_not_leader(cluster: Cluster) -> None:
    cluster.hosts[0].deposed = True
    cluster.hosts[0].hint = "10.1.1.1:1"
    assert_not_leader(lambda: cluster.put("/k"), 0, "10.1.1.1:1")


def _serve_and_trigger_oxia_codes() -> None:
    """Subprocess body for the wire test: one not-leader error, one unknown namespace."""
    cluster = Cluster(lambda name: MemoryKv())
    try:
        rpc_error(lambda: cluster.put("/k", shard=2))
        rpc_error(
            lambda: next(
                cluster.stub.GetShardAssignments(pb.ShardAssignmentsRequest(namespace="x"))
            )
        )
    finally:
        cluster.close()


def test_oxia_status_codes_go_on_the_wire_unchanged() -> None:
    """106 and 110 as numbers on the wire; grpcio's own client can only show UNKNOWN.

    gRPC core traces the trailers it sends, which is the one place a C-core process
    shows the number it puts on the wire.
    """
    here = Path(__file__).resolve().parent
    script = (
        f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parents[1] / 'python')!r}]\n"
        "from test_client_api import _serve_and_trigger_oxia_codes\n"
        "_serve_and_trigger_oxia_codes()\n"
    )
    env = dict(os.environ, GRPC_TRACE="http", GRPC_VERBOSITY="debug")
    run = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    sent = re.findall(r"grpc-status: [A-Z_]*\(?(\d+)\)?", run.stderr)
    assert "106" in sent and "110" in sent, sorted(set(sent))


# ------------------------------------------------------------- bad inputs


def test_bad_keys_and_values_are_invalid(small_cluster: Cluster) -> None:
    c = small_cluster  # max_key_bytes=16, max_value_bytes=32
    assert_invalid(lambda: c.put(""), "puts[0].key is empty")
    assert_invalid(lambda: c.put("/" + "k" * 16), "puts[0].key is 17 bytes", "limit of 16")
    assert_invalid(lambda: c.put("/é" * 6), "puts[0].key is 18 bytes")  # UTF-8 bytes count
    assert_invalid(lambda: c.put("/k", b"v" * 33), "puts[0].value is 33 bytes", "limit of 32")
    assert_invalid(lambda: c.delete(""), "deletes[0].key is empty")
    assert_invalid(lambda: c.delete("/" + "k" * 16), "deletes[0].key is 17 bytes")
    assert_invalid(lambda: c.get(""), "gets[0].key is empty")
    assert_invalid(lambda: c.get("/" + "k" * 16), "gets[0].key is 17 bytes")
    assert_invalid(lambda: c.list("/" + "k" * 16, ""), "start_inclusive is 17 bytes")
    assert c.put("/" + "k" * 15, b"v" * 32).status == pb.OK  # exactly at the limits
    assert c.put("/" + "\u00e9" * 7, b"v" * 32).status == pb.OK  # 15 UTF-8 bytes
    # Plain puts are checked all at once; the one at fault is still named.
    ok = pb.PutRequest(key="/ok", value=b"v")
    for bad, message in (
        (pb.PutRequest(key="", value=b"v"), "puts[2].key is empty"),
        (pb.PutRequest(key="/" + "k" * 16, value=b"v"), "puts[2].key is 17 bytes"),
        (pb.PutRequest(key="/\u00e9" * 6, value=b"v"), "puts[2].key is 18 bytes"),
        (pb.PutRequest(key="/k", value=b"v" * 33), "puts[2].value is 33 bytes"),
    ):
        assert_invalid(functools.partial(c.write, puts=[ok, ok, bad, ok]), message)
    assert c.get("/ok").status == pb.KEY_NOT_FOUND


def test_inverted_ranges_are_invalid(cluster: Cluster) -> None:
    inverted = pb.DeleteRangeRequest(start_inclusive="/b", end_exclusive="/a")
    assert_invalid(
        lambda: cluster.write(delete_ranges=[inverted]), "delete_ranges[0]", "sorts after"
    )
    # Hierarchically "/a/a" > "/b" although it is smaller byte-wise.
    assert_invalid(lambda: cluster.list("/a/a", "/b"), "'/a/a' sorts after end_exclusive '/b'")
    assert_invalid(lambda: cluster.scan("/z", "/a"), "sorts after")
    assert cluster.list("/b", "/b") == []  # empty, not inverted
    assert cluster.list("/b", "") == []  # an empty end is unbounded


def test_unknown_or_missing_shard_is_invalid(cluster: Cluster) -> None:
    assert_invalid(lambda: cluster.put("/k", shard=99), "unknown shard 99")
    assert_invalid(lambda: cluster.get("/k", shard=99), "unknown shard 99")
    assert_invalid(lambda: cluster.list(shard=99), "unknown shard 99")
    no_shard = pb.WriteRequest(puts=[pb.PutRequest(key="/k", value=b"v")])
    assert_invalid(lambda: cluster.stub.Write(no_shard, timeout=TIMEOUT), "names no shard")
    assert_invalid(
        lambda: list(cluster.stub.Read(pb.ReadRequest(), timeout=TIMEOUT)), "names no shard"
    )


def test_bad_versions_and_comparisons_are_invalid(cluster: Cluster) -> None:
    assert_invalid(lambda: cluster.put("/k", expected_version_id=-2), "expected_version_id is -2")
    assert_invalid(
        lambda: cluster.delete("/k", expected_version_id=-5), "deletes[0].expected_version_id"
    )
    assert_invalid(lambda: cluster.get("/k", comparison_type=7), "comparison_type 7 is unknown")


def test_a_bad_op_anywhere_in_a_request_writes_nothing(cluster: Cluster) -> None:
    request = pb.WriteRequest(
        shard=0,
        puts=[pb.PutRequest(key="/a", value=b"1"), pb.PutRequest(key="/b", value=b"2")],
        deletes=[pb.DeleteRequest(key="/a")],
        delete_ranges=[pb.DeleteRangeRequest(start_inclusive="/z", end_exclusive="/y")],
    )
    assert_invalid(lambda: cluster.stub.Write(request, timeout=TIMEOUT), "delete_ranges[0]")
    assert cluster.list() == []
    assert cluster.server.call(lambda: cluster.hosts[0].state.applied_position.offset) == -1


def test_limits_must_be_positive() -> None:
    directory = Directory(rpb.ShardAssignmentsUpdate(), [])
    with pytest.raises(ValueError, match="max_key_bytes must be positive, got 0"):
        OxiaClientServicer(directory, max_key_bytes=0)
