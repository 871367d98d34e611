"""The data service (node/data/) through DataClient, against real servers.

Most tests share one `quorumstore standalone` process (4 shards, one replica each);
the follower tests start a 3-node cluster (tests/cluster_harness.py's LocalCluster).
Key filter planning (spark/datasource_keys.py) is checked here too: it decides what
the scans ask for.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThan,
    Not,
    StringStartsWith,
)

from cluster_harness import LocalCluster
from quorumstore import Client
from quorumstore.arrow.ipc import ipc_bytes, read_ipc
from quorumstore.client.data_service import STAGE_COPY_GRACE_S, DataClient, DataClientError
from quorumstore.node.data.writes import MAX_ENTRY_BYTES, MAX_WRITE_BYTES, PIECE_BYTES
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.proto import quorumstore_data_pb2_grpc as pb_grpc
from quorumstore.spark.datasource_keys import KeyFilter, intersect, prefix_ranges
from quorumstore.spark.datasource_stream import ChangeKeys
from quorumstore.storage.write_batch import Op
from quorumstore.testing import standalone_server
from quorumstore.wire.hashing import key_hash
from quorumstore.wire.keys import compare_keys, index_order
from quorumstore.wire.metadata import ClientSerial
from quorumstore.wire.schemas import INDEX_SCAN_SCHEMA

pytestmark = pytest.mark.integration

SHARDS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(address, data dir) of a standalone server with 4 shards."""
    data = tmp_path_factory.mktemp("standalone")
    with standalone_server(data, SHARDS, fsync=False) as address:
        yield address, data


@pytest.fixture
def client(server: tuple[str, Path]) -> Iterator[DataClient]:
    with DataClient(server[0], retry_s=10) as c:
        yield c


ROWS_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary())])


def rows(keys: list[str], tag: str = "v") -> pa.Table:
    return pa.table({"key": keys, "value": [f"{tag}:{k}".encode() for k in keys]}, ROWS_SCHEMA)


def write_all(client: DataClient, table: pa.Table, client_id: str) -> None:
    for shard, part in client.route(table).items():
        client.write(shard, part, origin=ClientSerial(client_id, 0))


def scan_all(client: DataClient, **kwargs) -> dict[str, bytes]:
    out = {}
    for s in client.shards():
        for batch, _ in client.scan(s.shard, **kwargs):
            out.update(zip(batch.column("key").to_pylist(), batch.column("value").to_pylist()))
    return out


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}/"


# ------------------------------------------------------------------ routing, reads


def test_shards_tile_the_hash_space_and_route_like_key_hash(client: DataClient) -> None:
    shards = client.shards()
    assert [s.shard for s in shards] == list(range(SHARDS))
    assert shards[0].min_hash == 0 and shards[-1].max_hash == 0xFFFFFFFF
    assert all(a.max_hash + 1 == b.min_hash for a, b in itertools.pairwise(shards))
    table = rows([f"r/{i}" for i in range(200)])
    for shard, part in client.route(table).items():
        for key in part.column("key").to_pylist():
            s = client.shard(shard)
            assert s.min_hash <= key_hash(key) <= s.max_hash


def test_write_then_scan_round_trip_with_commit_offsets(client: DataClient) -> None:
    prefix = unique("rt")
    table = rows([f"{prefix}{i:04d}" for i in range(1000)])
    write_all(client, table, f"rt-{prefix}")
    got = scan_all(client, ranges=prefix_ranges(prefix))
    assert got == dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))
    shard = client.shard_of(f"{prefix}0000")
    chunks = list(client.scan(shard, ranges=prefix_ranges(prefix), batch_rows=7))
    assert all(b.num_rows <= 7 for b, _ in chunks)
    offsets = {o for _, o in chunks}
    assert offsets == {client.offsets(shard).commit_offset}


def test_a_scan_that_finds_nothing_still_reports_its_offset(client: DataClient) -> None:
    [(batch, offset)] = list(client.scan(0, ranges=prefix_ranges("no-such-prefix/")))
    assert batch.num_rows == 0 and offset == client.offsets(0).commit_offset


def test_point_reads_by_key(client: DataClient) -> None:
    prefix = unique("pt")
    keys = [f"{prefix}{i}" for i in range(20)]
    write_all(client, rows(keys), f"pt-{prefix}")
    shard = client.shard_of(keys[3])
    mine = [k for k in keys if client.shard_of(k) == shard]
    [(batch, _)] = list(client.scan(shard, keys=[*mine, f"{prefix}missing", mine[0]]))
    assert sorted(batch.column("key").to_pylist()) == sorted(mine)


def test_a_scan_sees_one_snapshot_while_writes_go_on(client: DataClient) -> None:
    prefix = unique("snap")
    keys = [f"{prefix}{i:05d}" for i in range(3000)]
    write_all(client, rows(keys, "old"), f"snap-a-{prefix}")
    shard = client.shard_of(keys[0])
    mine = client.route(rows(keys, "new"))[shard]
    stream = client.scan(shard, ranges=prefix_ranges(prefix), batch_rows=100)
    first, offset = next(stream)
    client.write(shard, mine, origin=ClientSerial(f"snap-b-{prefix}", 0))  # every key, mid-scan
    values = first.column("value").to_pylist() + [
        v for b, _ in stream for v in b.column("value").to_pylist()
    ]
    assert len(values) == mine.num_rows and all(v.startswith(b"old:") for v in values)
    assert offset < client.offsets(shard).commit_offset


def test_an_index_scan_streams_each_shards_records_in_index_order(
    server: tuple[str, Path], client: DataClient
) -> None:
    """ScanArrow through a secondary index: a range of secondary keys, chunks of at most
    batch_rows in (secondary key, primary key) order with the secondary key beside each
    record; an empty answer still has the index schema; keys or several ranges are
    refused."""
    prefix = unique("ix")
    index = f"by-tag-{prefix[3:-1]}"
    with Client(server[0]) as writer:
        for i in range(40):
            writer.put(f"{prefix}{i:02d}", f"{i}", secondary_indexes={index: f"t{i % 3}"})
    stub = pb_grpc.QuorumstoreDataStub(grpc.insecure_channel(server[0]))

    def scan(shard: int, low: str, high: str) -> list[pa.Table]:
        request = pb.ScanRequest(
            namespace="default",
            shard=shard,
            ranges=[pb.KeyRange(min_inclusive=low, max_exclusive=high)],
            batch_rows=4,
            secondary_index_name=index,
        )
        return [read_ipc(chunk.ipc) for chunk in stub.ScanArrow(request)]

    found = []
    for shard in range(SHARDS):
        chunks = scan(shard, "t1", "t3")
        assert all(c.schema == INDEX_SCAN_SCHEMA and c.num_rows <= 4 for c in chunks)
        rows_ = [row for c in chunks for row in c.select(["secondary_key", "key"]).to_pylist()]
        pairs = [(r["secondary_key"], r["key"]) for r in rows_]
        assert pairs == sorted(pairs, key=lambda p: index_order(*p))
        assert all(client.shard_of(key) == shard for _, key in pairs)
        found += pairs
    assert sorted(found) == sorted(
        (f"t{i % 3}", f"{prefix}{i:02d}") for i in range(40) if i % 3 in (1, 2)
    )
    [empty] = scan(0, "x", "y")
    assert empty.num_rows == 0 and empty.schema == INDEX_SCAN_SCHEMA
    for bad in (
        pb.ScanRequest(namespace="default", shard=0, keys=["a"], secondary_index_name=index),
        pb.ScanRequest(
            namespace="default",
            shard=0,
            ranges=[pb.KeyRange(max_exclusive="b"), pb.KeyRange(min_inclusive="c")],
            secondary_index_name=index,
        ),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.ScanArrow(bad))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reads one range of secondary keys" in caught.value.details()


def test_split_ranges_cut_a_shard_into_pieces_of_at_most_max_rows(client: DataClient) -> None:
    prefix = unique("split")
    keys = [f"{prefix}{i:04d}" for i in range(800)]
    write_all(client, rows(keys), f"split-{prefix}")
    shard = client.shard_of(keys[0])
    ranges = prefix_ranges(prefix)
    pieces = client.split_ranges(shard, ranges, 50)
    counts = [sum(b.num_rows for b, _ in client.scan(shard, ranges=[p])) for p in pieces]
    assert max(counts) <= 50 and sum(counts) == sum(
        b.num_rows for b, _ in client.scan(shard, ranges=ranges)
    )
    assert client.split_ranges(shard, ranges, 10**9) == ranges


# ------------------------------------------------------------------ writes


def test_a_retried_serial_is_applied_once(client: DataClient) -> None:
    prefix = unique("once")
    table = rows([f"{prefix}{i}" for i in range(50)])
    shard, part = next(iter(client.route(table).items()))
    first = client.write(shard, part, origin=ClientSerial(f"once-{prefix}", 3))
    again = client.write(shard, part, origin=ClientSerial(f"once-{prefix}", 3))
    assert not first.duplicate and again.duplicate
    [(batch, _)] = list(client.scan(shard, keys=part.column("key").to_pylist()))
    assert set(batch.column("modifications_count").to_pylist()) == {0}


def test_replace_deletes_the_range_and_puts_in_one_entry(client: DataClient) -> None:
    prefix = unique("repl")
    keys = [f"{prefix}{i:03d}" for i in range(300)]
    write_all(client, rows(keys), f"repl-a-{prefix}")
    shard = client.shard_of(keys[0])
    before = client.offsets(shard).commit_offset
    in_range = [k for k in keys[100:199] if client.shard_of(k) == shard]
    replacement = rows(in_range[:10], "new")
    result = client.write(
        shard,
        replacement,
        replace=(keys[100], keys[199]),
        origin=ClientSerial(f"repl-b-{prefix}", 0),
    )
    assert result.offset == before + 1
    got = {
        k
        for b, _ in client.scan(shard, ranges=prefix_ranges(prefix))
        for k in b.column("key").to_pylist()
    }
    expected = {k for k in keys if client.shard_of(k) == shard and not (keys[100] <= k < keys[199])}
    assert got == expected | set(replacement.column("key").to_pylist())
    [changes] = list(client.changes(shard, before, result.offset))
    assert changes.column("operation").to_pylist()[0] == 2  # the range, then the puts
    assert set(changes.column("offset").to_pylist()) == {result.offset}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (pa.table({"key": ["a", "a"], "value": [b"1", b"2"]}), "repeat a key"),
        (pa.table({"key": ["", "b"], "value": [b"1", b"2"]}), "empty key"),
        (pa.table({"key": ["a"], "other": [b"1"]}), "no column"),
        (pa.table({"key": ["a"], "value": ["text"]}), "is string, expected binary"),
    ],
)
def test_bad_rows_are_refused_before_anything_is_written(
    client: DataClient, table: pa.Table, message: str
) -> None:
    request = pb.WriteArrowRequest(
        namespace="default", shard=0, unique_keys=True, ipc=ipc_bytes(table)
    )
    with pytest.raises(grpc.RpcError) as caught:
        _stub(client).WriteArrow(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()


@pytest.mark.parametrize("cut", [0, 20])
def test_rows_that_are_no_whole_ipc_stream_are_refused(client: DataClient, cut: int) -> None:
    """Junk, and a stream cut inside its record batch (pyarrow's OSError, not ArrowInvalid)."""
    whole = ipc_bytes(pa.table({"key": ["a"], "value": [b"1"]}))
    request = pb.WriteArrowRequest(
        namespace="default", shard=0, ipc=whole[: len(whole) - cut] if cut else b"junk"
    )
    with pytest.raises(grpc.RpcError) as caught:
        _stub(client).WriteArrow(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not an Arrow IPC stream" in caught.value.details()


def _stub(client: DataClient) -> pb_grpc.QuorumstoreDataStub:
    return pb_grpc.QuorumstoreDataStub(grpc.insecure_channel(client.shard(0).leader))


def test_staged_rows_are_invisible_until_published_once(
    client: DataClient, server: tuple[str, Path]
) -> None:
    prefix = unique("stage")
    write_id = uuid.uuid4().hex
    table = rows([f"{prefix}{i:03d}" for i in range(300)])
    shard, part = max(client.route(table).items(), key=lambda item: item[1].num_rows)
    client.stage(shard, write_id, "p0-a1", 0, part.slice(0, 100))
    client.stage(shard, write_id, "p0-a1", 1, part.slice(100))
    client.stage(shard, write_id, "p0-a0", 0, rows(["ghost/from-a-failed-attempt"]))
    staging = server[1] / "node" / "data-staging" / write_id
    assert staging.is_dir()
    assert scan_all(client, ranges=prefix_ranges(prefix)) == {}
    origin = ClientSerial(f"spark-write/{write_id}", 0)
    parts = [("p0-a1", 2, part.num_rows)]
    check = client.publish(shard, write_id, parts, origin=origin, validate_only=True)
    assert check.rows == part.num_rows and scan_all(client, ranges=prefix_ranges(prefix)) == {}
    done = client.publish(shard, write_id, parts, origin=origin, unique_keys=True)
    assert not done.duplicate and done.rows == part.num_rows
    assert len(scan_all(client, ranges=prefix_ranges(prefix))) == part.num_rows
    assert client.publish(
        shard, write_id, parts, origin=origin
    ).duplicate  # files are gone; still answered
    client.discard(write_id)
    assert not staging.exists()
    assert scan_all(client, ranges=prefix_ranges("ghost/")) == {}


def sized_part(
    client: DataClient, prefix: str, shard: int, rows: int, value_bytes: int
) -> pa.Table:
    """`rows` rows under `prefix` that route to `shard`, each value `value_bytes` long (its
    key, then #)."""
    candidates = pa.array([f"{prefix}{i:07d}" for i in range(rows * (SHARDS + 1))])
    keys = client.route(
        pa.table({"key": candidates, "value": pa.nulls(len(candidates), pa.binary())})
    )[shard].column("key")
    assert len(keys) >= rows
    keys = keys.slice(0, rows)
    filler = pa.scalar(b"#" * (value_bytes - len(keys[0].as_py())))
    values = pc.binary_join_element_wise(pc.cast(keys, pa.binary()), filler, b"")
    return pa.table({"key": keys, "value": values})


def test_a_part_larger_than_one_entry_is_published_whole(client: DataClient) -> None:
    """Above MAX_ENTRY_BYTES a shard's part goes out as replicated pieces that one entry
    publishes: a reader sees none of it, then all of it, and its changes come chunked."""
    prefix, shard = unique("big"), 0
    part = sized_part(client, prefix, shard, (MAX_ENTRY_BYTES + 2 * PIECE_BYTES) // 1000, 1000)
    keys = part.column("key")
    assert part.nbytes > MAX_ENTRY_BYTES
    write_id = uuid.uuid4().hex
    halves = [part.slice(0, len(part) // 2), part.slice(len(part) // 2)]
    for name, half in zip(["p0-a0", "p1-a0"], halves):
        for chunk, start in enumerate(range(0, half.num_rows, 8192)):
            client.stage(shard, write_id, name, chunk, half.slice(start, 8192))
    parts = [
        (name, -(-h.num_rows // 8192), h.num_rows) for name, h in zip(["p0-a0", "p1-a0"], halves)
    ]
    first, last = keys[0].as_py(), keys[-1].as_py()

    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:  # what a reader sees while the part is published
        with DataClient(client.bootstrap[0]) as reader:
            while not stop.is_set():
                [(batch, _)] = list(reader.scan(shard, keys=[first, last]))
                seen.add(batch.num_rows)

    watcher = threading.Thread(target=watch)
    watcher.start()
    origin = ClientSerial(f"spark-write/{write_id}", 0)
    try:
        done = client.publish(shard, write_id, parts, origin=origin, unique_keys=True)
    finally:
        stop.set()
        watcher.join()
    assert done.rows == part.num_rows and not done.duplicate
    assert seen <= {0, 2} and 0 in seen
    stored = pa.Table.from_batches(
        [b for b, _ in client.scan(shard, ranges=prefix_ranges(prefix))]
    ).select(["key", "value"])
    assert stored.num_rows == part.num_rows
    assert stored.sort_by("key").cast(part.schema).equals(part.sort_by("key"))
    # The publish is one entry; its changes arrive in chunks of the default size.
    changes = pa.Table.from_batches(list(client.changes(shard, done.offset - 1, done.offset)))
    assert changes.num_rows == part.num_rows
    assert set(changes.column("offset").to_pylist()) == {done.offset}
    assert pc.all(pc.equal(changes.column("key"), keys)).as_py()
    assert client.publish(shard, write_id, parts, origin=origin).duplicate


def test_a_part_above_the_write_limit_is_refused_whole(client: DataClient) -> None:
    """A shard's part above MAX_WRITE_BYTES is refused by the check the job's commit runs
    first and by the publish itself, clearly and before anything is replicated."""
    prefix, shard = unique("huge"), 0
    part = sized_part(client, prefix, shard, MAX_WRITE_BYTES // (64 * 1024) + 8, 64 * 1024)
    assert part.nbytes > MAX_WRITE_BYTES
    write_id = uuid.uuid4().hex
    chunks = 0
    for chunks, start in enumerate(range(0, part.num_rows, 128), start=1):
        client.stage(shard, write_id, "p0-a0", chunks - 1, part.slice(start, 128))
    origin = ClientSerial(f"spark-write/{write_id}", 0)
    head = client.offsets(shard).commit_offset
    for validate_only in (True, False):
        with pytest.raises(DataClientError) as caught:
            client.publish(
                shard,
                write_id,
                [("p0-a0", chunks, part.num_rows)],
                origin=origin,
                validate_only=validate_only,
            )
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"above the limit of {MAX_WRITE_BYTES} bytes" in str(caught.value)
        assert "split it into smaller writes" in str(caught.value)
    assert client.offsets(shard).commit_offset == head  # nothing was replicated
    assert sum(b.num_rows for b, _ in client.scan(shard, ranges=prefix_ranges(prefix))) == 0
    client.discard(write_id)


def test_publishing_rows_that_are_not_staged_fails_cleanly(client: DataClient) -> None:
    write_id = uuid.uuid4().hex
    with pytest.raises(DataClientError) as caught:
        client.publish(
            0, write_id, [("p9-a9", 1, 10)], origin=ClientSerial(f"spark-write/{write_id}", 0)
        )
    assert caught.value.code == grpc.StatusCode.ABORTED  # not retried: no retry finds them
    assert "not on this node" in str(caught.value)


def test_a_late_attempt_cannot_stage_for_a_discarded_write(
    client: DataClient, server: tuple[str, Path]
) -> None:
    """A zombie task of a failed job stages after the job's abort: refused, nothing left."""
    write_id = uuid.uuid4().hex
    client.stage(0, write_id, "p0-a0", 0, rows(["zombie/a"]))
    client.discard(write_id)
    with pytest.raises(DataClientError) as caught:
        client.stage(0, write_id, "p0-a0", 1, rows(["zombie/b"]))
    assert caught.value.code == grpc.StatusCode.ABORTED  # not retried: the job is over
    assert "already published or discarded" in str(caught.value)
    assert not (server[1] / "node" / "data-staging" / write_id).exists()


def test_staging_refuses_ids_that_could_escape_its_directory(client: DataClient) -> None:
    for write_id, part in [
        ("../../etc", "p"),
        (uuid.uuid4().hex, "../x"),
        (uuid.uuid4().hex, ".hidden"),
    ]:
        with pytest.raises(DataClientError) as caught:
            client.stage(0, write_id, part, 0, rows(["k"]))
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


# ------------------------------------------------------------------ changes


def _write_entries(client: DataClient, shard: int, sizes: list[int]) -> list[list[str]]:
    """One entry of `sizes[i]` new keys of `shard` each; returns their keys."""
    prefix = unique("chg")
    written = []
    for i, size in enumerate(sizes):
        candidates = (f"{prefix}{i}-{j}" for j in itertools.count())
        keys = list(itertools.islice((k for k in candidates if client.shard_of(k) == shard), size))
        client.write(shard, rows(keys), origin=ClientSerial(f"chg-{prefix}", i))
        written.append(keys)
    return written


def _read_changes(client: DataClient, shard: int, **request: int) -> list[pb.ArrowChunk]:
    stub = pb_grpc.QuorumstoreDataStub(grpc.insecure_channel(client.shard(shard).leader))
    return list(
        stub.ReadChanges(pb.ReadChangesRequest(namespace="default", shard=shard, **request))
    )


def test_changes_come_in_offset_order_cut_at_entry_boundaries(client: DataClient) -> None:
    shard = 1
    start = client.offsets(shard).commit_offset
    written = _write_entries(client, shard, [6] * 5)
    end = client.offsets(shard).commit_offset
    chunks = _read_changes(
        client, shard, start_offset_exclusive=start, end_offset_inclusive=end, max_rows=6
    )
    assert [c.commit_offset for c in chunks] == list(range(start + 1, end + 1))  # one entry each
    batches = [read_ipc(c.ipc) for c in chunks]
    assert [b.column("key").to_pylist() for b in batches] == written
    later = pa.Table.from_batches(list(client.changes(shard, start + 2, end)))
    assert later.column("key").to_pylist() == [k for keys in written[2:] for k in keys]
    assert sorted(set(later.column("offset").to_pylist())) == [start + 3, start + 4, start + 5]


def test_an_entry_larger_than_a_chunk_is_split_and_resumable_inside(client: DataClient) -> None:
    shard = 2
    start = client.offsets(shard).commit_offset
    written = _write_entries(client, shard, [2, 7, 1])
    end = client.offsets(shard).commit_offset
    chunks = _read_changes(
        client, shard, start_offset_exclusive=start, end_offset_inclusive=end, max_rows=3
    )
    keys = [read_ipc(c.ipc).column("key").to_pylist() for c in chunks]
    # [2 rows of entry 1] [3 of entry 2] [3 of entry 2] [its last 1, then entry 3]
    assert keys == [written[0], written[1][:3], written[1][3:6], written[1][6:] + written[2]]
    assert [c.commit_offset for c in chunks] == [start + 1, start + 1, start + 1, start + 3]
    # A stream broken after the third chunk resumes after the 6 rows of entry 2 it had.
    rest = _read_changes(
        client,
        shard,
        start_offset_exclusive=start + 1,
        end_offset_inclusive=end,
        max_rows=3,
        skip_rows=6,
    )
    assert [read_ipc(c.ipc).column("key").to_pylist() for c in rest] == [keys[-1]]
    with pytest.raises(grpc.RpcError) as caught:
        _read_changes(
            client, shard, start_offset_exclusive=start + 1, end_offset_inclusive=end, skip_rows=7
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    got = pa.Table.from_batches(list(client.changes(shard, start, end, max_rows=3)))
    assert got.column("key").to_pylist() == [k for keys in written for k in keys]


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "stream broken by the test"


class _BreaksAfter:
    """A real ReadChanges stream that fails, as a lost connection does, after `chunks` chunks."""

    def __init__(self, stream, chunks: int) -> None:
        self._stream, self._left = stream, chunks

    def __iter__(self):
        return self

    def __next__(self) -> pb.ArrowChunk:
        if self._left == 0:
            raise _Unavailable()
        self._left -= 1
        return next(self._stream)

    def cancel(self) -> bool:
        return self._stream.cancel()


def test_a_change_stream_broken_inside_a_split_entry_resumes_after_its_last_row(
    client: DataClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = 3
    start = client.offsets(shard).commit_offset
    written = _write_entries(client, shard, [2, 7, 1])
    end = client.offsets(shard).commit_offset
    requests: list[pb.ReadChangesRequest] = []
    real_stub = client._stub

    class BreakingStub:
        def __init__(self, address: str) -> None:
            self._inner = real_stub(address)

        def ReadChanges(self, request: pb.ReadChangesRequest):
            requests.append(request)
            stream = self._inner.ReadChanges(request)
            return _BreaksAfter(stream, 3) if len(requests) == 1 else stream

    monkeypatch.setattr(client, "_stub", BreakingStub)
    got = pa.Table.from_batches(list(client.changes(shard, start, end, max_rows=3)))
    assert got.column("key").to_pylist() == [k for keys in written for k in keys]
    # Broken after [entry 1] [3 rows of entry 2] [3 more]: resumed inside entry 2.
    assert [(r.start_offset_exclusive, r.skip_rows) for r in requests] == [
        (start, 0),
        (start + 1, 6),
    ]


def test_changes_not_applied_yet_are_unavailable(client: DataClient) -> None:
    end = client.offsets(2).commit_offset + 1000
    request = pb.ReadChangesRequest(
        namespace="default", shard=2, start_offset_exclusive=-1, end_offset_inclusive=end
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(_stub(client).ReadChanges(request))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not yet" in caught.value.details()


# ------------------------------------------------------------------ followers (3 nodes)


@pytest.mark.timeout(180)
def test_followers_serve_reads_only_when_asked(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=3, shards=1, replication_factor=3, fsync=False)
    try:
        cluster.start()
        with DataClient(",".join(cluster.nodes), retry_s=30) as c:
            write_all(c, rows([f"f/{i}" for i in range(100)]), "followers")
            [s] = c.shards()
            follower = s.followers[0]
            stub = pb_grpc.QuorumstoreDataStub(grpc.insecure_channel(follower))
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.ScanArrow(pb.ScanRequest(namespace="default", shard=0)))
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert dict(caught.value.trailing_metadata())["leader-hint"] == s.leader
            deadline = time.monotonic() + 30
            while True:  # the follower applies what the leader committed, soon
                chunks = list(
                    stub.ScanArrow(
                        pb.ScanRequest(namespace="default", shard=0, allow_follower=True)
                    )
                )
                if (
                    sum(read_ipc(ch.ipc).num_rows for ch in chunks) == 100
                    or time.monotonic() > deadline
                ):
                    break
                time.sleep(0.2)
            assert sum(read_ipc(ch.ipc).num_rows for ch in chunks) == 100
            assert len(scan_all(c, allow_follower=True)) == 100
    finally:
        cluster.close()


@pytest.mark.timeout(180)
def test_rows_staged_before_a_leader_change_are_published_by_the_new_leader(
    tmp_path: Path,
) -> None:
    """Staging copies every chunk to the followers too, so a job whose shard changes
    leader between its tasks' staging and its commit still publishes."""
    cluster = LocalCluster(tmp_path, nodes=3, shards=1, replication_factor=3, fsync=False)
    try:
        cluster.start()
        with DataClient(",".join(cluster.nodes), retry_s=30) as c:
            write_id = uuid.uuid4().hex
            table = rows([f"moved/{i:03d}" for i in range(50)])
            c.stage(0, write_id, "p0-a0", 0, table)
            [shard] = c.shards()
            cluster.kill9(shard.leader)
            cluster.wait_new_leader(0, not_on=shard.leader, after_term=shard.term)
            origin = ClientSerial(f"spark-write/{write_id}", 0)
            result = c.publish(0, write_id, [("p0-a0", 1, 50)], origin=origin)
            assert result.rows == 50 and not result.duplicate
            assert scan_all(c, ranges=prefix_ranges("moved/")) == dict(
                zip(table.column("key").to_pylist(), table.column("value").to_pylist())
            )
            c.discard(write_id)
    finally:
        cluster.close()


def test_calls_on_every_shard_leave_their_client_with_the_leaders_they_found(
    tmp_path: Path,
) -> None:
    """A leader that `each_shard`'s calls found elected (their table came from this
    client, which had not seen the election) is this client's leader afterwards: the
    next round's calls go to it, not to the paused node it replaced first. Staging
    copies are not waited for on a node a fault held a call on, so rounds with that
    node still paused take far less than the copy grace plus a watch's check."""
    cluster = LocalCluster(tmp_path, nodes=3, shards=3, replication_factor=3, fsync=False)
    try:
        cluster.start()
        with DataClient(",".join(cluster.nodes), retry_s=30) as c:
            before = {s.shard: s for s in c.shards()}
            victim = before[0].leader
            led = [s.shard for s in before.values() if s.leader == victim]
            write_id = uuid.uuid4().hex
            table = rows(["a"])
            cluster.pause(victim)
            try:
                c.each_shard(
                    led, lambda client, shard: client.stage(shard, write_id, "p", 0, table)
                )
                after = {s.shard: s for s in c.shards()}
                for shard in led:
                    assert after[shard].term > before[shard].term, after[shard]
                    assert after[shard].leader not in ("", victim), after[shard]
                started = time.monotonic()
                c.each_shard(
                    led, lambda client, shard: client.stage(shard, write_id, "p", 1, table)
                )
                took = time.monotonic() - started
            finally:
                cluster.resume(victim)
            # Without the first, a watch's first check (LEADER_CHECK_S) and more; without
            # the second, the copy grace.
            assert took < STAGE_COPY_GRACE_S, f"a round with the node paused took {took:.2f} s"
            c.discard(write_id)
    finally:
        cluster.close()


# ------------------------------------------------------------------ key filter planning


def _in(key: str, ranges: list[tuple[str, str]]) -> bool:
    return any(
        compare_keys(lo, key) <= 0 and (not hi or compare_keys(key, hi) < 0) for lo, hi in ranges
    )


def test_prefix_ranges_hold_exactly_the_keys_with_the_prefix() -> None:
    rng = random.Random(3)
    alphabet = ["a", "b", "/", "\x00", "\U0010ffff", "é", "\ud7ff", "\ue000"]
    keys = sorted(
        {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(4000)}
    )
    prefixes = {"", "/", "a/", "a//", "\U0010ffff", "a/\U0010ffff"} | {
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(150)
    }
    for prefix in prefixes:
        ranges = prefix_ranges(prefix)
        wrong = [k for k in keys if _in(k, ranges) != k.startswith(prefix)]
        assert not wrong, (prefix, ranges, wrong[:5])


def test_a_filtered_change_feed_keeps_every_change_to_a_followed_key() -> None:
    """Point changes are kept exactly when their key has the prefix and lies in the range; a
    range delete is kept whenever it removed (here: holds) such a key, and dropped when it
    cannot."""
    rng = random.Random(5)
    alphabet = ["a", "b", "/", "é"]
    keys = sorted(
        {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(3000)}
    )

    def some_range() -> tuple[str, str]:
        low, high = sorted(rng.sample(keys, 2), key=functools.cmp_to_key(compare_keys))
        return low, high

    ranges = [some_range() for _ in range(300)] + [("", ""), ("a/", "")]  # unbounded too
    batch = pa.record_batch(
        {
            "key": keys + [start for start, _ in ranges],
            "operation": pa.array(
                [Op.PUT.value] * len(keys) + [Op.DELETE_RANGE.value] * len(ranges), pa.int8()
            ),
            "range_end": [None] * len(keys) + [end for _, end in ranges],
        }
    )
    followed = [ChangeKeys(prefix) for prefix in ["a", "a/", "b/a", "/", "é/b"]]
    followed += [ChangeKeys("", *some_range()) for _ in range(5)]
    followed += [ChangeKeys("a", "a", ""), ChangeKeys("b/", "", "b/b"), ChangeKeys("", "b", "")]
    for keys_followed in followed:
        prefix, bounds = keys_followed.prefix, [(keys_followed.start, keys_followed.end)]
        kept = keys_followed.mask(batch).to_pylist()
        assert kept[: len(keys)] == [k.startswith(prefix) and _in(k, bounds) for k in keys]
        for (start, end), keep in zip(ranges, kept[len(keys) :], strict=True):
            holds = any(
                k.startswith(prefix) and _in(k, bounds) and _in(k, [(start, end)]) for k in keys
            )
            assert keep or not holds, (keys_followed, start, end)
    disjoint = pa.record_batch(
        {
            "key": ["b/", "c"],
            "operation": pa.array([Op.DELETE_RANGE.value] * 2, pa.int8()),
            "range_end": ["b/z", "d"],
        }
    )
    assert ChangeKeys("a/").mask(disjoint).to_pylist() == [False, False]
    assert ChangeKeys("", "a", "b").mask(disjoint).to_pylist() == [False, False]


def test_key_filters_prune_to_exact_ranges_and_mask_exactly() -> None:
    f = KeyFilter()
    for pushed in [
        StringStartsWith(("key",), "user/1"),
        GreaterThanOrEqual(("key",), "user/10"),
        LessThan(("key",), "user/15"),
    ]:
        assert f.push(pushed)
    assert not f.push(EqualTo(("value",), b"x"))
    assert not f.push(Not(EqualTo(("key",), "user/11")))  # negations stay with Spark
    ranges = f.ranges([("", "")])
    assert ranges == prefix_ranges("user/1")
    keys = pa.array(["user/1", "user/10", "user/12/x", "user/15", "user/2", "user/1a"])
    assert keys.filter(f.mask(keys)).to_pylist() == [
        "user/10",
        "user/12/x",
    ]  # "user/1a" > "user/15"
    assert intersect(ranges, [("user/12", "")]) == [("user/12", "user/2"), ("user/1/", "user/2/")]


def test_contradicting_key_filters_read_nothing() -> None:
    f = KeyFilter()
    f.push(StringStartsWith(("key",), "a"))
    f.push(StringStartsWith(("key",), "b"))
    assert f.ranges([("", "")]) == []
    # Nor do the point reads of an equality or IN that Spark no longer rechecks.
    f.push(In(("key",), ["a/b", "b/c"]))
    assert not f.matches("a/b") and not f.matches("b/c")
    assert f.mask(pa.array(["a/b", "b/c"])).to_pylist() == [False, False]
    g = KeyFilter()
    g.push(In(("key",), ["x", "y"]))
    g.push(EqualTo(("key",), "z"))
    assert g.keys == frozenset()
