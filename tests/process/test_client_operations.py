"""quorumstore's own client (`Client`, `AsyncClient`) against `quorumstore standalone`.

One server with three shards serves the whole module; every test works under a key
prefix of its own. What is checked end to end: Oxia's semantics through the typed
API, that concurrent operations really share batches while each keeps its own
outcome, the Arrow bulk paths, notifications with resume, exactly-once retries, and
clean closing.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

from quorumstore import AsyncClient, Client
from quorumstore.client import (
    EXPECTED_RECORD_DOES_NOT_EXIST,
    ClientClosed,
    ComparisonType,
    InvalidRequest,
    KeyNotFound,
    NamespaceNotFound,
    NotificationType,
    ServiceUnavailable,
    UnexpectedVersionId,
    writes,
)
from quorumstore.client.discovery import Channels
from quorumstore.client.loop_thread import LoopThread
from quorumstore.wire.keys import compare_keys

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


@pytest.fixture
def client(address: str) -> Iterator[Client]:
    with Client(address) as client:
        yield client


def hierarchical(keys: list[str]) -> list[str]:
    return sorted(keys, key=functools.cmp_to_key(compare_keys))


# ------------------------------------------------------------------ records


def test_put_get_delete_with_versions(client: Client, prefix: str) -> None:
    key = f"{prefix}/a"
    first = client.put(key, b"one")
    assert first.modifications_count == 0 and first.created_ms == first.modified_ms
    second = client.put(key, "two")  # str values are stored UTF-8 encoded
    assert second.modifications_count == 1
    assert second.version_id > first.version_id
    assert second.created_ms == first.created_ms and not second.is_ephemeral

    record = client.get(key)
    assert (record.key, record.value, record.version) == (key, b"two", second)
    assert client.get(key, include_value=False) == (key, None, second)
    assert client.delete(key) is True
    assert client.delete(key) is False
    with pytest.raises(KeyNotFound) as caught:
        client.get(key)
    assert caught.value.key == key and isinstance(caught.value, KeyError)


def test_conditional_puts_and_deletes(client: Client, prefix: str) -> None:
    key = f"{prefix}/c"
    created = client.put(key, b"v0", expected_version_id=EXPECTED_RECORD_DOES_NOT_EXIST)
    with pytest.raises(UnexpectedVersionId) as caught:
        client.put(key, b"again", expected_version_id=EXPECTED_RECORD_DOES_NOT_EXIST)
    assert "expected no record" in str(caught.value)
    updated = client.put(key, b"v1", expected_version_id=created.version_id)
    with pytest.raises(UnexpectedVersionId):
        client.put(key, b"stale", expected_version_id=created.version_id)
    with pytest.raises(UnexpectedVersionId):
        client.delete(key, expected_version_id=created.version_id)
    assert client.delete(key, expected_version_id=updated.version_id) is True


def test_concurrent_operations_share_batches_yet_each_gets_its_own_outcome(
    address: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    send = writes.WriteSender.send

    async def counting_send(self: writes.WriteSender, shard: int, ops: list, lane: int) -> None:
        batches.append(len(ops))
        await send(self, shard, ops, lane)

    monkeypatch.setattr(writes.WriteSender, "send", counting_send)

    async def run() -> None:
        async with AsyncClient(address) as client:
            taken = await client.put(f"{prefix}/taken", b"x")
            puts = [client.put(f"{prefix}/k{i:03d}", f"v{i}".encode()) for i in range(300)]
            conflicts = [
                client.put(
                    f"{prefix}/taken", b"y", expected_version_id=EXPECTED_RECORD_DOES_NOT_EXIST
                )
                for _ in range(5)
            ]
            deletes = [client.delete(f"{prefix}/missing{i}") for i in range(5)]
            outcomes = await asyncio.gather(*puts, *conflicts, *deletes, return_exceptions=True)
            versions = outcomes[:300]
            assert all(v.modifications_count == 0 for v in versions)  # type: ignore[union-attr]
            assert all(isinstance(o, UnexpectedVersionId) for o in outcomes[300:305])
            assert outcomes[305:] == [False] * 5
            records = await asyncio.gather(*(client.get(f"{prefix}/k{i:03d}") for i in range(300)))
            assert [r.value for r in records] == [f"v{i}".encode() for i in range(300)]
            assert [r.version for r in records] == versions
            assert (await client.get(f"{prefix}/taken")).version == taken

    asyncio.run(run())
    # 311 writes in a handful of replicated writes (one per shard, give or take).
    assert sum(batches) == 311
    assert len(batches) < 311 / 10, batches


def test_an_invalid_operation_fails_alone_and_empty_keys_fail_at_once(
    address: str, prefix: str
) -> None:
    async def run() -> None:
        async with AsyncClient(address, linger_ms=20) as client:
            too_long = f"{prefix}/" + "x" * 70_000  # above the server's 64 KiB key limit
            shard = client.shard_for(too_long)
            same_shard = [
                k for k in (f"{prefix}/ok{i}" for i in range(60)) if client.shard_for(k) == shard
            ]
            outcomes = await asyncio.gather(
                client.put(too_long, b"v"),
                *(client.put(k, b"v") for k in same_shard),
                return_exceptions=True,
            )
            assert isinstance(outcomes[0], InvalidRequest)
            assert "above the limit" in str(outcomes[0])
            assert all(not isinstance(o, BaseException) for o in outcomes[1:])
            with pytest.raises(InvalidRequest, match="key is empty"):
                await client.put("", b"v")
            with pytest.raises(TypeError, match="bytes or str"):
                await client.put(f"{prefix}/n", 5)  # type: ignore[arg-type]

    asyncio.run(run())


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda c, k: c.put(k, b"v", expected_version_id=2**63),
            InvalidRequest,
            "0 to 9223372036854775807",
        ),
        (lambda c, k: c.put(k, b"v", expected_version_id=-5), InvalidRequest, "is -5"),
        (lambda c, k: c.put(k, b"v", expected_version_id="1"), TypeError, "must be an int"),
        (lambda c, k: c.delete(k, expected_version_id=2**70), InvalidRequest, "0 to"),
        (lambda c, k: c.put(k, b"v", partition_key=b"p"), TypeError, "partition_key must be a str"),
        (lambda c, k: c.get(k, partition_key=7), TypeError, "partition_key must be a str"),
        (lambda c, k: c.delete_range(k, None), TypeError, "max_key_exclusive must be a str"),
        (lambda c, k: c.list(b"a", ""), TypeError, "min_key_inclusive must be a str"),
    ],
)
def test_arguments_the_wire_cannot_carry_fail_at_once_and_alone(
    address: str, prefix: str, call: Any, error: type[Exception], message: str
) -> None:
    """Checked when called: found while encoding, they failed the batch they shared."""

    async def run() -> None:
        async with AsyncClient(address, linger_ms=20) as client:
            good = asyncio.ensure_future(client.put(f"{prefix}/good", b"v"))
            await asyncio.sleep(0)  # queued, its batch still open
            with pytest.raises(error, match=message):
                await call(client, f"{prefix}/bad")
            assert (await good).version_id >= 0

    asyncio.run(run())


# ------------------------------------------------------------------ order and ranges


def test_list_range_scan_and_comparisons_follow_hierarchical_order_across_shards(
    client: Client, prefix: str
) -> None:
    keys = [f"{prefix}/{name}" for name in ["b", "a", "a/b", "a/b/c", "c", "a/a", "b/x", "aa"]]
    keys += [f"{prefix}/m{i:04d}" for i in range(2500)]  # several response chunks per shard
    client.put_many({k: k.encode() for k in keys})
    direct_children = hierarchical([k for k in keys if k.count("/") == 2])
    assert client.list(f"{prefix}/", f"{prefix}/~") == direct_children
    scanned = list(client.range_scan(f"{prefix}/", f"{prefix}/~"))
    assert [r.key for r in scanned] == direct_children
    assert all(r.value == r.key.encode() for r in scanned)
    assert client.list(f"{prefix}/a/", f"{prefix}/a/~") == [f"{prefix}/a/a", f"{prefix}/a/b"]

    partial = client.range_scan(f"{prefix}/", f"{prefix}/~")
    assert [next(partial).key for _ in range(3)] == direct_children[:3]
    partial.close()  # an abandoned scan is closed, not leaked

    assert client.get(f"{prefix}/ab", comparison=ComparisonType.FLOOR).key == f"{prefix}/aa"
    assert client.get(f"{prefix}/aa", comparison=ComparisonType.FLOOR).key == f"{prefix}/aa"
    assert client.get(f"{prefix}/aa", comparison=ComparisonType.LOWER).key == f"{prefix}/a"
    assert client.get(f"{prefix}/ab", comparison=ComparisonType.CEILING).key == f"{prefix}/b"
    assert client.get(f"{prefix}/b", comparison=ComparisonType.HIGHER).key == f"{prefix}/c"
    assert (
        client.get(f"{prefix}/b", comparison=ComparisonType.HIGHER, include_value=False).value
        is None
    )

    client.delete_range(f"{prefix}/m", f"{prefix}/n")
    assert client.list(f"{prefix}/", f"{prefix}/~") == hierarchical(
        [f"{prefix}/{n}" for n in ["a", "aa", "b", "c"]]
    )


def test_a_partition_key_keeps_records_on_one_shard(client: Client, prefix: str) -> None:
    partition = f"{prefix}-cart"
    keys = [f"{prefix}/cart/{i:02d}" for i in range(30)]
    for key in keys:
        client.put(key, b"1", partition_key=partition)
    shard = client.shard_for(partition)
    assert {client.shard_for(k) for k in keys} != {shard}  # their own hashes differ
    assert client.list(f"{prefix}/cart/", f"{prefix}/cart/~", partition_key=partition) == keys
    assert client.get(keys[0], partition_key=partition).value == b"1"
    table = client.scan(f"{prefix}/cart/", f"{prefix}/cart/~", partition_key=partition)
    assert table.column("key").to_pylist() == keys
    client.delete_range(f"{prefix}/cart/", f"{prefix}/cart/~", partition_key=partition)
    assert client.list(f"{prefix}/cart/", f"{prefix}/cart/~") == []


# ------------------------------------------------------------------ bulk


def test_put_many_and_scan_move_arrow_tables(client: Client, prefix: str) -> None:
    n = 20_000
    table = pa.table(
        {
            "key": [f"{prefix}/row/{i:06d}" for i in range(n)],
            "value": [i.to_bytes(4, "big") * 25 for i in range(n)],
        }
    )
    assert client.put_many(table) == n
    scanned = client.scan(f"{prefix}/row/", f"{prefix}/row/~")
    assert scanned.num_rows == n
    assert scanned.column("key").to_pylist() == table.column("key").to_pylist()
    assert scanned.column("value").to_pylist() == table.column("value").to_pylist()
    assert set(scanned.column("modifications_count").to_pylist()) == {0}
    assert client.get(f"{prefix}/row/012345").value == (12345).to_bytes(4, "big") * 25

    assert client.put_many((table.column("key")[:10], [b"new"] * 10)) == 10
    again = client.scan(f"{prefix}/row/", f"{prefix}/row/000010")
    assert again.column("value").to_pylist() == [b"new"] * 10
    assert set(again.column("modifications_count").to_pylist()) == {1}
    assert client.scan(f"{prefix}/none/", f"{prefix}/none/~").num_rows == 0


# ------------------------------------------------------------------ notifications


def test_notifications_deliver_every_change_and_resume_from_offsets(
    client: Client, prefix: str
) -> None:
    key = f"{prefix}/watched"
    with client.notifications() as changes:
        client.put(key, b"1")
        client.put(key, b"2")
        client.delete(key)
        seen = []
        while len(seen) < 3:
            n = next(changes)
            if n.key == key:
                seen.append(n)
        offsets = changes.offsets
    assert [n.type for n in seen] == [
        NotificationType.KEY_CREATED,
        NotificationType.KEY_MODIFIED,
        NotificationType.KEY_DELETED,
    ]
    assert seen[0].version_id is not None and seen[2].version_id is None
    assert [n.offset for n in seen] == sorted(n.offset for n in seen)
    assert seen[0].shard == client.shard_for(key)

    client.put(f"{prefix}/later", b"x")  # committed while nobody listens
    with client.notifications(start_offset_exclusive=offsets) as resumed:
        n = next(resumed)
        while n.key != f"{prefix}/later":
            n = next(resumed)
    assert n.type is NotificationType.KEY_CREATED
    assert list(resumed) == []  # closed: iteration ends


def test_async_notifications_of_one_shard(address: str, prefix: str) -> None:
    async def run() -> None:
        async with AsyncClient(address) as client:
            key = f"{prefix}/one"
            shard = client.shard_for(key)
            async with client.notifications(shard) as changes:
                await client.put(key, b"x")
                await client.delete_range(f"{prefix}/", f"{prefix}/~")
                found = []
                async for n in changes:
                    assert n.shard == shard
                    if n.key in (key, f"{prefix}/"):
                        found.append(n)
                    if n.type is NotificationType.KEY_RANGE_DELETED:
                        break

            async def drain() -> None:
                async for _ in changes:
                    pass

            await asyncio.wait_for(drain(), 10)  # a closed subscription's iteration ends
            assert (found[0].key, found[0].type) == (key, NotificationType.KEY_CREATED)
            assert (found[-1].key, found[-1].key_range_end) == (f"{prefix}/", f"{prefix}/~")
            with pytest.raises(ValueError, match="needs a shard"):
                client.notifications(start_offset_exclusive=3)

    asyncio.run(run())


# ------------------------------------------------------------------ exactly once


class _LoseFirstWriteResponse:
    """An Oxia stub whose first write (a message on a WriteStream, as the client sends
    its batches) reaches the server but whose answer is 'lost'."""

    def __init__(self, stub: object) -> None:
        self._stub = stub
        self.lost = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._stub, name)

    def WriteStream(self, **kwargs: object) -> object:
        return _LosingStream(self, self._stub.WriteStream(**kwargs))  # type: ignore[attr-defined]


class _LosingStream:
    """A WriteStream call whose first answer is read, then 'lost' with the connection."""

    def __init__(self, stub: _LoseFirstWriteResponse, call: grpc.aio.StreamStreamCall) -> None:
        self._stub = stub
        self._call = call

    def __getattr__(self, name: str) -> object:
        return getattr(self._call, name)

    async def read(self) -> object:
        response = await self._call.read()
        if not self._stub.lost:
            self._stub.lost += 1
            self._call.cancel()
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                "connection reset",
            )
        return response


@pytest.mark.parametrize("exactly_once", [True, False])
def test_a_write_retried_after_a_lost_answer_is_applied_once(
    address: str, prefix: str, monkeypatch: pytest.MonkeyPatch, exactly_once: bool
) -> None:
    lossy: dict[str, _LoseFirstWriteResponse] = {}
    stub = Channels.stub

    def lossy_stub(self: Channels, node: str) -> _LoseFirstWriteResponse:
        if node not in lossy:
            lossy[node] = _LoseFirstWriteResponse(stub(self, node))
        return lossy[node]

    async def run() -> None:
        async with AsyncClient(address, exactly_once=exactly_once) as client:
            monkeypatch.setattr(Channels, "stub", lossy_stub)
            version = await client.put(f"{prefix}/once", b"v")  # applied, answer lost, retried
            monkeypatch.undo()
            record = await client.get(f"{prefix}/once")
            assert sum(s.lost for s in lossy.values()) == 1
            if exactly_once:
                # The retry was answered with the first write's result: one put in all.
                assert version == record.version and record.version.modifications_count == 0
            else:
                assert record.version.modifications_count == 1  # the retry was a second put

    asyncio.run(run())


# ------------------------------------------------------------------ lifecycle


def test_closing_sends_what_is_queued_and_later_calls_raise_client_closed(
    address: str, prefix: str
) -> None:
    async def run() -> None:
        client = await AsyncClient(address, linger_ms=50).connect()
        pending = [asyncio.ensure_future(client.put(f"{prefix}/q{i}", b"v")) for i in range(50)]
        await asyncio.sleep(0)
        await client.close()
        assert all(p.done() and p.exception() is None for p in pending)
        with pytest.raises(ClientClosed):
            await client.get(f"{prefix}/q0")

    asyncio.run(run())
    with Client(address) as client:
        assert client.get(f"{prefix}/q49").value == b"v"
    with pytest.raises(ClientClosed):
        client.put(f"{prefix}/late", b"v")
    with pytest.raises(ClientClosed):
        client.delete(f"{prefix}/late")


def test_closing_a_client_leaves_the_process_s_other_event_loops_quiet(
    address: str, prefix: str
) -> None:
    """Each blocking Client runs a loop of its own. gRPC hands a completion to the loop
    its call was made on; one for a closed loop fails in whichever loop is handling
    gRPC's events ("RuntimeError: Event loop is closed") and holds back the rest of
    that batch. Closing must let gRPC settle first, whatever else runs in the process."""
    other = LoopThread("another-loop")
    reported: list[dict[str, Any]] = []
    other.loop.set_exception_handler(lambda _loop, context: reported.append(context))
    busy = threading.Event()

    async def keep_reading() -> int:
        reads = 0
        async with AsyncClient(address) as neighbour:
            await neighbour.put(f"{prefix}/neighbour", b"v")
            while not busy.is_set():
                await neighbour.get(f"{prefix}/neighbour")
                reads += 1
        return reads

    reading = asyncio.run_coroutine_threadsafe(keep_reading(), other.loop)
    try:
        for i in range(60):
            with Client(address) as client:
                client.put(f"{prefix}/c{i}", b"v")
    finally:
        busy.set()
        reads = reading.result(30)
        other.stop()
    assert reads > 0
    assert [str(c.get("exception") or c.get("message")) for c in reported] == []


def test_the_blocking_client_is_shared_by_threads(client: Client, prefix: str) -> None:
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(40):
                key = f"{prefix}/t{t}/{i}"
                version = client.put(key, f"{t}:{i}".encode())
                assert client.get(key) == (key, f"{t}:{i}".encode(), version)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_connecting_fails_clearly(address: str, tmp_path: Path) -> None:
    with pytest.raises(NamespaceNotFound, match="no-such-namespace"):
        Client(address, namespace="no-such-namespace")
    with pytest.raises(ServiceUnavailable, match="no shard assignments from 127.0.0.1:1"):
        Client("127.0.0.1:1", connect_timeout_s=1)
    with pytest.raises(ValueError, match="host:port"):
        Client("localhost")
    with pytest.raises(
        TypeError, match="Client\\(\\) got unknown option\\(s\\) lingerms; the options"
    ):
        Client(address, lingerms=5)
