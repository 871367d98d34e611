"""Sessions, notifications, sequences, indexes, exactly-once and gateway routing on the wire.

Through a real grpc.aio server and the generated stub, over single-replica shards (the
`Cluster` of test_client_api), with the servicer's clock under the test's control.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest
from test_client_api import (
    FOLLOWER_HINT,
    NOW_MS,
    TIMEOUT,
    Cluster,
    assert_invalid,
    kv_factory,
    rpc_error,
    wait_until,
)

from quorumstore import AsyncClient
from quorumstore.client.notifications import Notification
from quorumstore.node.limits import RequestLimits
from quorumstore.node.oxia import notifications as notifications_module
from quorumstore.node.oxia.errors import RequestError
from quorumstore.node.oxia.notifications import BATCH_NOTIFICATIONS, notification_batches
from quorumstore.node.oxia.sessions import SessionKeeper
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.protocol.types import LogPosition
from quorumstore.storage.change_log import CHANGES_SCHEMA, ChangeEvent
from quorumstore.storage.sessions import SessionInfo
from quorumstore.storage.write_batch import Op
from quorumstore.wire.metadata import CLIENT_ID_METADATA_KEY, SERIAL_METADATA_KEY

pytestmark = pytest.mark.integration

FAST = {"session_check_interval_s": 0.005, "stream_recheck_interval_s": 0.005}


class Clock:
    """The servicer's session clock, moved by the test."""

    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(tmp_path: Path, clock: Clock) -> Iterator[Cluster]:
    # The notification tests make one entry of 20,000 keys with one write.
    bulk = RequestLimits(max_ops_per_request=20_000)
    c = Cluster(kv_factory("memory", tmp_path), session_clock_ms=clock, request_limits=bulk, **FAST)
    yield c
    c.close()


def assert_oxia_code(call: Callable[[], Any], message: str) -> None:
    """Oxia's codes 106-110 reach grpcio clients as UNKNOWN; the message tells them apart."""
    error = rpc_error(call)
    assert error.code() == grpc.StatusCode.UNKNOWN, error.details()
    assert message in error.details()


# ------------------------------------------------------------------ sessions


def create_session(c: Cluster, timeout_ms: int = 5000, shard: int = 0) -> int:
    request = pb.CreateSessionRequest(
        shard=shard, session_timeout_ms=timeout_ms, client_identity="me"
    )
    return c.stub.CreateSession(request, timeout=TIMEOUT).session_id


def keep_alive(c: Cluster, session_id: int, shard: int = 0) -> None:
    c.stub.KeepAlive(pb.SessionHeartbeat(shard=shard, session_id=session_id), timeout=TIMEOUT)


def close_session(c: Cluster, session_id: int, shard: int = 0) -> None:
    c.stub.CloseSession(pb.CloseSessionRequest(shard=shard, session_id=session_id), timeout=TIMEOUT)


def test_an_ephemeral_record_lives_while_heartbeats_come_and_goes_with_expiry(
    cluster: Cluster, clock: Clock
) -> None:
    session = create_session(cluster, 5000)
    put = cluster.put("/e", session_id=session, client_identity="me")
    assert put.status == pb.OK and put.version.session_id == session
    assert put.version.client_identity == "me"

    for _ in range(3):  # 12 s of heartbeats every 4 s: the session lives
        clock.ms += 4000
        keep_alive(cluster, session)
    time.sleep(0.1)  # many sweeps
    assert cluster.get("/e").status == pb.OK

    clock.ms += 5001  # silent for longer than the timeout
    wait_until(lambda: cluster.get("/e").status == pb.KEY_NOT_FOUND)
    assert_oxia_code(lambda: keep_alive(cluster, session), f"session not found: {session}")
    assert cluster.put("/late", session_id=session).status == pb.SESSION_DOES_NOT_EXIST


def test_closing_a_session_deletes_its_ephemeral_records(cluster: Cluster) -> None:
    session = create_session(cluster)
    assert cluster.put("/e", session_id=session).status == pb.OK
    assert cluster.put("/kept").status == pb.OK
    close_session(cluster, session)
    assert cluster.list() == ["/kept"]
    assert_oxia_code(lambda: close_session(cluster, session), "session not found")


def test_session_timeouts_outside_oxias_bounds_are_refused(cluster: Cluster) -> None:
    for bad in (0, 1999, 300_001):
        assert_oxia_code(
            lambda bad=bad: create_session(cluster, bad), f"invalid session timeout: {bad} ms"
        )
    assert create_session(cluster, 2000) != create_session(cluster, 300_000)


def test_sessions_of_unknown_shards_or_not_led_here_are_refused(cluster: Cluster) -> None:
    assert_invalid(lambda: create_session(cluster, shard=99), "unknown shard 99")
    assert_oxia_code(lambda: keep_alive(cluster, 1, shard=2), "node is not leader for shard 2")


class _Reader:
    def __init__(self) -> None:
        self.term = 1
        self.sessions = [SessionInfo(1, 1000, "a"), SessionInfo(2, 3000, "b")]

    @property
    def applied_position(self) -> LogPosition:
        return LogPosition(self.term, 10, 0)

    def open_sessions(self) -> list[SessionInfo]:
        return self.sessions

    def session_info(self, session_id: int) -> SessionInfo | None:
        return next((s for s in self.sessions if s.session_id == session_id), None)


class _Host:
    def __init__(self) -> None:
        self.leader = True
        self.state = _Reader()

    def is_leader(self) -> bool:
        return self.leader

    def reader(self) -> Any:
        return self.state


def test_a_new_leadership_restarts_every_session_clock() -> None:
    now = [0]
    keeper = SessionKeeper(lambda: now[0])
    host = _Host()
    closed: list[int] = []

    async def close(_: Any, session_id: int) -> None:
        closed.append(session_id)
        host.state.sessions = [s for s in host.state.sessions if s.session_id != session_id]

    async def sweep(at: int) -> list[int]:
        now[0] = at
        keeper.expire([host], close)  # type: ignore[list-item]
        for _ in range(3):
            await asyncio.sleep(0)
        return sorted(closed)

    async def scenario() -> None:
        assert await sweep(0) == []  # clocks start: deadlines 1000 and 3000
        assert keeper.heartbeat(host, 1)  # type: ignore[arg-type]
        assert not keeper.heartbeat(host, 7)  # type: ignore[arg-type]
        assert await sweep(999) == []
        host.state.term = 2  # another term: the clocks restart when it is seen
        assert await sweep(1998) == []  # deadlines 2998 and 4998
        assert await sweep(2997) == []
        assert await sweep(2998) == [1]
        host.leader = False  # a follower keeps no clocks ...
        assert await sweep(10_000) == [1]
        host.leader = True  # ... and a leader again starts them afresh
        assert await sweep(12_999) == [1]
        assert await sweep(15_998) == [1]
        assert await sweep(15_999) == [1, 2]

    asyncio.run(scenario())


# ------------------------------------------------------------------ sequences


def test_sequence_puts_return_the_assigned_key(cluster: Cluster) -> None:
    first = cluster.put("/s", partition_key="p", sequence_key_delta=[1, 2])
    assert first.status == pb.OK and first.key == f"/s-{1:020d}-{2:020d}"
    second = cluster.put("/s", partition_key="p", sequence_key_delta=[1, 0])
    assert second.key == f"/s-{2:020d}-{2:020d}"
    assert cluster.get(second.key).value == b"v"


def test_malformed_sequence_puts_are_invalid(small_cluster: Cluster) -> None:
    c = small_cluster  # max_key_bytes=16
    assert_invalid(lambda: c.put("/s", sequence_key_delta=[1]), "need a partition_key")
    assert_invalid(
        lambda: c.put("/s", partition_key="p", sequence_key_delta=[0]), "first delta must be > 0"
    )
    assert_invalid(
        lambda: c.put("/s", partition_key="p", sequence_key_delta=[1], expected_version_id=-1),
        "cannot have an expected_version_id",
    )
    assert_invalid(
        lambda: c.put("/s", partition_key="p", sequence_key_delta=[1, 1]),
        "the sequence key would be 44 bytes",
    )
    assert c.list() == []
    assert c.put("/s", partition_key="p", sequence_key_delta=[1]).key == f"/s-{1:020d}"


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(kv_factory("memory", tmp_path), max_key_bytes=24, **FAST)
    yield c
    c.close()


def test_fewer_deltas_than_the_sequence_has_are_invalid(cluster: Cluster) -> None:
    cluster.put("/s", partition_key="p", sequence_key_delta=[1, 1])
    assert_invalid(
        lambda: cluster.put("/s", partition_key="p", sequence_key_delta=[1]),
        "carry 2 numbers, so sequence_key_delta needs at least 2 deltas",
    )


def test_sequence_updates_stream_the_latest_key(cluster: Cluster) -> None:
    cluster.put("/s", partition_key="p", sequence_key_delta=[1])
    updates = cluster.stub.GetSequenceUpdates(
        pb.GetSequenceUpdatesRequest(shard=0, key="/s"), timeout=TIMEOUT
    )
    assert next(updates).highest_sequence_key == f"/s-{1:020d}"
    cluster.put("/s", partition_key="p", sequence_key_delta=[4])
    assert next(updates).highest_sequence_key == f"/s-{5:020d}"
    updates.cancel()
    empty = pb.GetSequenceUpdatesRequest(shard=0, key="")
    assert_invalid(
        lambda: next(cluster.stub.GetSequenceUpdates(empty, timeout=TIMEOUT)), "key is empty"
    )


# ------------------------------------------------------------------ secondary indexes


def test_reads_through_a_secondary_index(cluster: Cluster) -> None:
    def index(name: str) -> list[pb.SecondaryIndex]:
        return [pb.SecondaryIndex(index_name="name", secondary_key=name)]

    cluster.put("/u/1", b"alice", secondary_indexes=index("alice"))
    cluster.put("/u/2", b"bob", secondary_indexes=index("bob"))
    listing = pb.ListRequest(
        shard=0, start_inclusive="b", end_exclusive="", secondary_index_name="name"
    )
    assert [k for r in cluster.stub.List(listing, timeout=TIMEOUT) for k in r.keys] == ["/u/2"]
    scan = pb.RangeScanRequest(
        shard=0, start_inclusive="a", end_exclusive="c", secondary_index_name="name"
    )
    records = [r for part in cluster.stub.RangeScan(scan, timeout=TIMEOUT) for r in part.records]
    assert [(r.key, r.value) for r in records] == [("/u/1", b"alice"), ("/u/2", b"bob")]

    got = cluster.get("b", secondary_index_name="name", comparison_type=pb.CEILING)
    assert (got.status, got.key, got.secondary_index_key, got.value) == (
        pb.OK,
        "/u/2",
        "bob",
        b"bob",
    )
    assert cluster.get("carol", secondary_index_name="name").status == pb.KEY_NOT_FOUND
    assert_invalid(
        lambda: cluster.put(
            "/u/3", secondary_indexes=[pb.SecondaryIndex(index_name="", secondary_key="x")]
        ),
        "secondary_indexes[0].index_name is empty",
    )
    assert_invalid(
        lambda: cluster.get("x", secondary_index_name=""), "secondary_index_name is empty"
    )


# ------------------------------------------------------------------ notifications


def notifications(c: Cluster, start: int | None = None) -> Iterator[pb.NotificationBatch]:
    request = pb.NotificationsRequest(shard=0)
    if start is not None:
        request.start_offset_exclusive = start
    return c.stub.GetNotifications(request, timeout=TIMEOUT)


def test_notifications_start_at_the_present_and_resume_from_an_offset(cluster: Cluster) -> None:
    cluster.put("/before")
    stream = notifications(cluster)
    first = next(stream)
    assert (first.shard, first.offset, dict(first.notifications)) == (0, 0, {})

    cluster.put("/a", b"1")
    cluster.put("/a", b"2")
    cluster.delete("/a")
    cluster.write(delete_ranges=[pb.DeleteRangeRequest(start_inclusive="/b", end_exclusive="/c")])
    batches = [next(stream) for _ in range(4)]
    stream.cancel()
    assert [b.offset for b in batches] == [1, 2, 3, 4]
    assert all(b.timestamp == NOW_MS for b in batches)
    assert [dict(b.notifications) for b in batches] == [
        {"/a": pb.Notification(type=pb.KEY_CREATED, version_id=1)},
        {"/a": pb.Notification(type=pb.KEY_MODIFIED, version_id=2)},
        {"/a": pb.Notification(type=pb.KEY_DELETED)},
        {"/b": pb.Notification(type=pb.KEY_RANGE_DELETED, key_range_last="/c")},
    ]

    resumed = notifications(cluster, start=2)
    assert [next(resumed).offset for _ in range(2)] == [3, 4]
    resumed.cancel()
    caught_up = notifications(cluster, start=4)
    assert next(caught_up) == pb.NotificationBatch(shard=0, offset=4)  # nothing new yet
    cluster.put("/z")
    assert list(next(caught_up).notifications) == ["/z"]
    caught_up.cancel()
    assert_invalid(lambda: next(notifications(cluster, start=-2)), "offsets start at -1")


def test_a_large_entry_is_notified_in_batches_a_default_grpc_client_can_receive(
    cluster: Cluster,
) -> None:
    """20,000 keys of 240 bytes in one entry are 4.8 MB of notifications, over the 4 MiB a
    gRPC client (this stub, the official Oxia clients) accepts in one message. They come
    in batches; all but the last carry the offset before the entry, so a client that
    resumes after any of them gets the entry again, whole, instead of losing its rest."""
    cluster.put("/before")
    keys = [f"/bulk/{i:05d}/" + "k" * 228 for i in range(20_000)]
    cluster.write(puts=[pb.PutRequest(key=k, value=b"") for k in keys])

    def batches_of_the_entry(start: int) -> list[pb.NotificationBatch]:
        stream = notifications(cluster, start=start)
        batches = [next(stream)]
        while batches[-1].offset != 1:
            batches.append(next(stream))
        stream.cancel()
        return batches

    batches = batches_of_the_entry(0)
    assert [b.offset for b in batches] == [0] * (len(batches) - 1) + [1]
    assert len(batches) >= 5
    assert all(b.ByteSize() < 2 * 1024 * 1024 for b in batches)
    notified = [k for b in batches for k in b.notifications]
    assert sorted(notified) == keys  # each once
    assert all(n.type == pb.KEY_CREATED for b in batches for n in b.notifications.values())
    again = batches_of_the_entry(batches[1].offset)  # resumed after a part
    assert sorted(k for b in again for k in b.notifications) == keys


def test_quorumstores_client_skips_the_parts_it_had_when_a_stream_breaks_inside_an_entry(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream breaks (UNAVAILABLE) after the first batch of a large entry; re-opened
    from the offset that batch carried, it sends the entry again from its start, and the
    client delivers every key once."""
    cut = iter([True])

    def batches_broken_once(*args: Any) -> Iterator[pb.NotificationBatch]:
        for i, batch in enumerate(notification_batches(*args)):
            if i == 1 and next(cut, False):
                raise RequestError(grpc.StatusCode.UNAVAILABLE, "the test cut the stream")
            yield batch

    monkeypatch.setattr(notifications_module, "notification_batches", batches_broken_once)
    keys = [f"/bulk/{i:05d}/" + "k" * 228 for i in range(20_000)]
    cluster.put("/before")  # offset 0: the subscription starts there, the entry is 1

    async def subscribe() -> list[Notification]:
        async with (
            AsyncClient(cluster.server.address) as client,
            client.notifications(0) as changes,
        ):
            await asyncio.to_thread(
                cluster.write, puts=[pb.PutRequest(key=k, value=b"") for k in keys]
            )
            seen = []
            async for n in changes:
                seen.append(n)
                if len(seen) == len(keys):
                    break
            with pytest.raises(TimeoutError):  # and nothing more comes
                await asyncio.wait_for(changes.__anext__(), 0.5)
            assert changes.offsets[0] == 1
            return seen

    seen = asyncio.run(subscribe())
    assert next(cut, None) is None, "the stream was not cut"
    assert sorted(n.key for n in seen) == keys
    assert {n.offset for n in seen} == {0, 1}  # the parts carry the offset before


def test_an_entry_of_many_small_changes_is_cut_by_count_too() -> None:
    n = 2 * BATCH_NOTIFICATIONS + 7
    changes = pa.RecordBatch.from_pydict(
        {
            "key": [f"{i}" for i in range(n)],
            "operation": [Op.DELETE.value] * n,
            "value": [None] * n,
            "version_id": [None] * n,
            "modifications_count": [None] * n,
            "created_ms": [None] * n,
            "modified_ms": [None] * n,
            "range_end": [None] * n,
            "event": [ChangeEvent.KEY_DELETED.value] * n,
        },
        schema=CHANGES_SCHEMA,
    )
    batches = list(notification_batches(3, 10, NOW_MS, changes))
    assert [(b.shard, b.offset, len(b.notifications)) for b in batches] == [
        (3, 9, BATCH_NOTIFICATIONS),
        (3, 9, BATCH_NOTIFICATIONS),
        (3, 10, 7),
    ]
    assert sorted(k for b in batches for k in b.notifications) == sorted(map(str, range(n)))


def test_notifications_past_their_retention_are_out_of_range(cluster: Cluster) -> None:
    cluster.put("/old")
    cluster.directory.clock += 2 * 3600 * 1000
    for i in range(64):  # the change log expires old records every 64 offsets
        cluster.put(f"/new{i}")
    error = rpc_error(lambda: next(notifications(cluster, start=-1)))
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "past their retention" in error.details()


# ------------------------------------------------------------------ exactly-once


def eo_write(c: Cluster, client_id: str | None, serial: str | None, key: str) -> pb.WriteResponse:
    metadata = []
    if client_id is not None:
        metadata.append((CLIENT_ID_METADATA_KEY, client_id))
    if serial is not None:
        metadata.append((SERIAL_METADATA_KEY, serial))
    request = pb.WriteRequest(shard=0, puts=[pb.PutRequest(key=key, value=b"v")])
    return c.stub.Write(request, metadata=metadata, timeout=TIMEOUT)


def test_a_repeated_serial_is_applied_once_and_answered_with_the_original_result(
    cluster: Cluster,
) -> None:
    first = eo_write(cluster, "c1", "7", "/k")
    cluster.directory.clock += 10
    again = eo_write(cluster, "c1", "7", "/k")
    assert again == first
    assert cluster.get("/k").version.modifications_count == 0
    # Another client, or a later serial, is a new write.
    assert eo_write(cluster, "c2", "7", "/k").puts[0].version.modifications_count == 1
    assert eo_write(cluster, "c1", "8", "/k").puts[0].version.modifications_count == 2


def test_stale_or_reused_serials_and_bad_metadata_are_refused(cluster: Cluster) -> None:
    eo_write(cluster, "c", "1", "/a")
    eo_write(cluster, "c", "2", "/b")
    error = rpc_error(lambda: eo_write(cluster, "c", "1", "/a"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no longer kept" in error.details()
    two_puts = pb.WriteRequest(shard=0, puts=[pb.PutRequest(key="/x"), pb.PutRequest(key="/y")])
    metadata = [(CLIENT_ID_METADATA_KEY, "c"), (SERIAL_METADATA_KEY, "2")]
    error = rpc_error(lambda: cluster.stub.Write(two_puts, metadata=metadata, timeout=TIMEOUT))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "with 1 operations, not 2" in error.details()
    assert cluster.list() == ["/a", "/b"]

    assert_invalid(
        lambda: eo_write(cluster, "c", None, "/k"), "qs-client-id is given without qs-serial"
    )
    assert_invalid(
        lambda: eo_write(cluster, None, "3", "/k"), "qs-serial is given without qs-client-id"
    )
    assert_invalid(lambda: eo_write(cluster, "", "3", "/k"), "must be 1 to 256 bytes")
    assert_invalid(lambda: eo_write(cluster, "c", "x", "/k"), "decimal integer")
    assert_invalid(lambda: eo_write(cluster, "c", str(1 << 63), "/k"), "decimal integer")


def eo_stream(
    c: Cluster, client_id: str, first_serial: str, keys: list[str]
) -> list[pb.WriteResponse]:
    """One WriteStream with exactly-once metadata, a one-put request per key."""
    metadata = [(CLIENT_ID_METADATA_KEY, client_id), (SERIAL_METADATA_KEY, first_serial)]
    requests = [pb.WriteRequest(shard=0, puts=[pb.PutRequest(key=k, value=b"v")]) for k in keys]
    return list(c.stub.WriteStream(iter(requests), metadata=metadata, timeout=TIMEOUT))


def test_a_write_streams_requests_carry_serials_counting_up_from_its_metadata(
    cluster: Cluster,
) -> None:
    answers = eo_stream(cluster, "s", "5", ["/a", "/b", "/c"])
    assert cluster.list() == ["/a", "/b", "/c"]
    # The third request carried serial 7: its retry is answered, not applied again...
    assert eo_write(cluster, "s", "7", "/c") == answers[2]
    assert cluster.get("/c").version.modifications_count == 0
    # ...and 6 is older than the client's latest.
    error = rpc_error(lambda: eo_write(cluster, "s", "6", "/b"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    # A retry on a new stream from the last serial answers it and goes on from there.
    again = eo_stream(cluster, "s", "7", ["/c", "/d"])
    assert again[0] == answers[2]
    assert [cluster.get(k).version.modifications_count for k in ("/c", "/d")] == [0, 0]


def test_a_write_stream_with_bad_serial_metadata_is_refused(cluster: Cluster) -> None:
    assert_invalid(lambda: eo_stream(cluster, "s", "x", ["/a"]), "decimal integer")
    assert_invalid(lambda: eo_stream(cluster, "", "1", ["/a"]), "must be 1 to 256 bytes")
    assert_invalid(
        lambda: eo_stream(cluster, "s", str((1 << 63) - 1), ["/a", "/b"]), "would pass 2^63 - 1"
    )
    assert cluster.list() == ["/a"]  # the first request, with the last serial there is


# ------------------------------------------------------------------ gateway routing


def test_gateway_assignments_name_the_node_asked_for_every_shard(tmp_path: Path) -> None:
    c = Cluster(kv_factory("memory", tmp_path), routing="gateway", **FAST)
    try:
        stream = c.stub.GetShardAssignments(pb.ShardAssignmentsRequest())
        [assignment] = next(stream).namespaces.values()
        assert {a.leader for a in assignment.assignments} == {c.server.address}
        stream.cancel()
        with grpc.insecure_channel(c.server.address) as plain:
            stub = oxia_client_pb2_grpc.OxiaClientStub(plain)
            sideways = stub.GetShardAssignments(
                pb.ShardAssignmentsRequest(), metadata=[("qs-routing", "sideways")]
            )
            error = rpc_error(lambda: next(sideways))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "sideways" in error.details()
    finally:
        c.close()


def test_a_gateway_relays_calls_for_shards_led_elsewhere(tmp_path: Path) -> None:
    gateway = Cluster(kv_factory("memory", tmp_path / "a"), routing="gateway", **FAST)
    leader = Cluster(kv_factory("memory", tmp_path / "b"), **FAST)
    try:
        leader.hosts[2].leader = True  # shard 2 is led by the other server
        gateway.hosts[2].hint = leader.server.address
        put = gateway.put("/k", b"relayed", shard=2)
        assert put.status == pb.OK
        assert leader.get("/k", shard=2).value == b"relayed"
        assert gateway.get("/k", shard=2).value == b"relayed"
        assert gateway.list(shard=2) == ["/k"]
        session = create_session(gateway, shard=2)
        keep_alive(gateway, session, shard=2)
        stream = gateway.stub.GetNotifications(pb.NotificationsRequest(shard=2), timeout=TIMEOUT)
        assert next(stream).offset == 1
        stream.cancel()
        writes: queue.Queue[pb.WriteRequest | None] = queue.Queue()
        for i in range(20):
            writes.put(
                pb.WriteRequest(shard=2, puts=[pb.PutRequest(key="/w", value=str(i).encode())])
            )
        writes.put(None)
        answers = list(gateway.stub.WriteStream(iter(writes.get, None), timeout=TIMEOUT))
        assert [a.puts[0].version.modifications_count for a in answers] == list(range(20))
        # A relayed exactly-once stream's writes each carry their own serial to the leader.
        metadata = [(CLIENT_ID_METADATA_KEY, "relayed"), (SERIAL_METADATA_KEY, "40")]
        requests = [pb.WriteRequest(shard=2, puts=[pb.PutRequest(key=k)]) for k in ("/x", "/y")]
        answers = list(gateway.stub.WriteStream(iter(requests), metadata=metadata, timeout=TIMEOUT))
        retry = leader.stub.Write(
            requests[1],
            metadata=[(CLIENT_ID_METADATA_KEY, "relayed"), (SERIAL_METADATA_KEY, "41")],
            timeout=TIMEOUT,
        )
        assert retry == answers[1]
        assert leader.get("/y", shard=2).version.modifications_count == 0

        # Relayed once only: a leader that is not one any more answers "not leader".
        leader.hosts[2].leader = False
        leader.hosts[2].hint = FOLLOWER_HINT
        error = rpc_error(lambda: gateway.put("/k", shard=2))
        assert error.details() == f"node is not leader for shard 2; leader hint: {FOLLOWER_HINT}"
        # An unreachable leader is UNAVAILABLE, which clients retry.
        gateway.hosts[2].hint = "127.0.0.1:1"
        error = rpc_error(lambda: gateway.put("/k", shard=2))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "leader 127.0.0.1:1 of shard 2 is unreachable" in error.details()
    finally:
        gateway.close()
        leader.close()
