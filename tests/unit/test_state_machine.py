"""Oxia write semantics, exactly-once application across crashes, reads, and snapshots."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.protocol.types import EMPTY_POSITION, LogPosition, make_entry
from quorumstore.storage import columnar_apply as columnar_kernel
from quorumstore.storage.kv import KvStore
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.reads import APPLIED_KEY, KeyComparison, ShardReader
from quorumstore.storage.records import Record, decode_record, encode_record
from quorumstore.storage.results import EntryResult, OpResult, Status
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.snapshot import install_snapshot, iter_snapshot_chunks
from quorumstore.storage.state_machine import LogDivergenceError, LogGapError, ShardStateMachine
from quorumstore.storage.write_batch import (
    SCHEMA,
    VERSION_ID_NOT_EXISTS,
    Op,
    Staging,
    StagingKind,
    WriteBatchBuilder,
    batch_timestamp_ms,
    decode_batch,
    encode_batch,
    puts_batch,
)
from quorumstore.wire.keys import compare_keys, key_range
from quorumstore.wire.metadata import ClientSerial
from quorumstore.wire.schemas import SCAN_SCHEMA
from state_machine_logs import chain, hierarchical, position_of, random_log, replay


class Shard:
    """A state machine plus the log it was fed, to append entries one batch at a time."""

    def __init__(self, kv: KvStore) -> None:
        self.kv = kv
        self.sm = ShardStateMachine(kv)
        self.head = self.sm.applied_position

    def apply(self, builder: WriteBatchBuilder, timestamp_ms: int = 1_000) -> list[OpResult]:
        entry = make_entry(self.head, 1, builder.build(timestamp_ms))
        self.head = position_of(entry)
        [result] = self.sm.apply([entry])
        assert result is not None and result.offset == entry.offset
        return result.results


@pytest.fixture
def shard() -> Shard:
    return Shard(MemoryKv())


def puts(*items: tuple[str, bytes], **options: object) -> WriteBatchBuilder:
    builder = WriteBatchBuilder()
    for key, value in items:
        builder.add_put(key, value, **options)  # type: ignore[arg-type]
    return builder


# --- write batches -------------------------------------------------------------


def test_builder_round_trip() -> None:
    builder = WriteBatchBuilder()
    builder.add_put(
        "a", b"1", expected_version_id=-1, session_id=7, client_identity="me", partition_key="p"
    )
    builder.add_delete("b", expected_version_id=3)
    builder.add_delete_range("c", "d")
    batch = decode_batch(builder.build(timestamp_ms=42))
    assert batch_timestamp_ms(batch) == 42
    no_extensions = {
        "sequence_key_delta": None,
        "secondary_indexes": None,
        "session_timeout_ms": None,
    }
    assert batch.to_pylist() == [
        {
            "op": Op.PUT,
            "key": "a",
            "end_key": None,
            "value": b"1",
            "expected_version_id": -1,
            "session_id": 7,
            "client_identity": "me",
            "partition_key": "p",
            **no_extensions,
        },
        {
            "op": Op.DELETE,
            "key": "b",
            "end_key": None,
            "value": None,
            "expected_version_id": 3,
            "session_id": None,
            "client_identity": None,
            "partition_key": None,
            **no_extensions,
        },
        {
            "op": Op.DELETE_RANGE,
            "key": "c",
            "end_key": "d",
            "value": None,
            "expected_version_id": None,
            "session_id": None,
            "client_identity": None,
            "partition_key": None,
            **no_extensions,
        },
    ]


def test_puts_batch_from_arrow_arrays() -> None:
    keys = pa.array(["x", "y/z"], pa.large_string())
    batch = decode_batch(puts_batch(keys, pa.array(["1", "2"]), timestamp_ms=5))
    assert batch.column("key").to_pylist() == ["x", "y/z"]
    assert batch.column("value").to_pylist() == [b"1", b"2"]
    assert batch.column("op").to_pylist() == [Op.PUT, Op.PUT]
    assert batch.column("expected_version_id").null_count == 2
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        puts_batch(keys, pa.array([b"1"]), 5)
    with pytest.raises(ValueError, match="'key' holds nulls"):
        puts_batch(pa.array(["a", None]), pa.array([b"1", b"2"]), 5)


def test_puts_batch_makes_the_entry_the_op_by_op_builder_makes() -> None:
    """The leader encodes plain puts column by column (puts_batch) and every other
    write op by op: the same puts must give the same entry either way."""
    puts = [("/a", b"1"), ("/b/\u00e9", b""), ("/c", b"x" * 10)]
    origin = ClientSerial("client/0", 7)
    builder = WriteBatchBuilder()
    for key, value in puts:
        builder.add_put(key, value)
    by_op = decode_batch(builder.build(5, origin))
    by_column = decode_batch(
        puts_batch(
            pa.array([k for k, _ in puts], pa.string()),
            pa.array([v for _, v in puts], pa.binary()),
            5,
            origin,
        )
    )
    assert by_column.equals(by_op, check_metadata=True)


def test_empty_batch_is_valid() -> None:
    assert decode_batch(WriteBatchBuilder().build(9)).num_rows == 0


def test_decode_batch_rejects_foreign_payloads() -> None:
    builder = WriteBatchBuilder()
    builder.add_put("/a", b"value")
    whole = builder.build(9)
    for damaged in (b"garbage", whole[:-20]):  # the cut one makes pyarrow raise OSError
        with pytest.raises(ValueError, match="not an Arrow IPC stream"):
            decode_batch(damaged)
    with pytest.raises(ValueError, match="schema mismatch"):
        decode_batch(ipc_bytes(pa.RecordBatch.from_pydict({"x": [1]})))
    with pytest.raises(ValueError, match="no timestamp_ms"):
        encode_batch(pa.RecordBatch.from_pylist([], SCHEMA))


# --- records -------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        Record(b"", 0, 0, 0, 0),
        Record(b"value", 5, 2, 10, 20, session_id=3, client_identity="", partition_key=None),
        Record(
            b"\x00" * 100,
            2**40,
            1,
            -1,
            2**62,
            session_id=None,
            client_identity="c\u00e9",
            partition_key="p/q",
        ),
    ],
)
def test_record_round_trip(record: Record) -> None:
    assert decode_record(encode_record(record)) == record


def test_decode_record_rejects_truncated_bytes() -> None:
    data = encode_record(Record(b"v", 1, 0, 0, 0, client_identity="identity"))
    with pytest.raises(ValueError):
        decode_record(data[:10])
    with pytest.raises(ValueError):
        decode_record(data[:-6])


# --- write semantics -----------------------------------------------------------


def test_versions_modification_counts_and_timestamps(shard: Shard) -> None:
    [first] = shard.apply(puts(("a", b"1"), client_identity="c1"), timestamp_ms=100)
    assert first == OpResult(Status.OK, Record(b"1", 0, 0, 100, 100, client_identity="c1"))
    [other, again] = shard.apply(puts(("b", b"x"), ("a", b"2")), timestamp_ms=200)
    assert other.version == Record(b"x", 1, 0, 200, 200)
    # The creation time survives the overwrite; the identity is the new put's.
    assert again.version == Record(b"2", 2, 1, 100, 200)
    assert shard.sm.get("a") == again.version
    assert shard.sm.next_version_id == 3


def test_timestamps_come_from_the_entry_not_the_clock(shard: Shard) -> None:
    [result] = shard.apply(puts(("k", b"v")), timestamp_ms=7)
    assert (result.version.created_ms, result.version.modified_ms) == (7, 7)


def test_expected_version_on_put(shard: Shard) -> None:
    [created] = shard.apply(puts(("k", b"1"), expected_version_id=-1))
    assert created.status == Status.OK
    [exists] = shard.apply(puts(("k", b"2"), expected_version_id=-1))
    [stale] = shard.apply(puts(("k", b"2"), expected_version_id=created.version.version_id + 1))
    [absent] = shard.apply(puts(("missing", b"2"), expected_version_id=0))
    assert [exists, stale, absent] == [OpResult(Status.UNEXPECTED_VERSION_ID)] * 3
    assert shard.sm.get("k") == created.version
    assert shard.sm.get("missing") is None
    assert shard.sm.next_version_id == 1  # failed puts consume no version id
    [updated] = shard.apply(puts(("k", b"3"), expected_version_id=created.version.version_id))
    assert updated.version == Record(b"3", 1, 1, 1_000, 1_000)


def test_delete_semantics(shard: Shard) -> None:
    [put] = shard.apply(puts(("k", b"1")))
    builder = WriteBatchBuilder()
    builder.add_delete("missing")
    builder.add_delete("missing", expected_version_id=-1)
    builder.add_delete("missing", expected_version_id=4)
    builder.add_delete("k", expected_version_id=-1)
    builder.add_delete("k", expected_version_id=put.version.version_id + 1)
    builder.add_delete("k", expected_version_id=put.version.version_id)
    builder.add_delete("k")
    assert [r.status for r in shard.apply(builder)] == [
        Status.KEY_NOT_FOUND,
        Status.KEY_NOT_FOUND,
        Status.UNEXPECTED_VERSION_ID,
        Status.UNEXPECTED_VERSION_ID,
        Status.UNEXPECTED_VERSION_ID,
        Status.OK,
        Status.KEY_NOT_FOUND,
    ]
    assert shard.sm.get("k") is None


RANGE_KEYS = ["", "a", "a/", "a/1", "a/2", "a/b/c", "a/y", "a/z", "a/z/1", "b", "/x", "a\x00/q"]


@pytest.mark.parametrize(
    "start,end", [("a/", "a/z"), ("a", "b"), ("a/1", ""), ("", "a/"), ("b", "a"), ("a/b/", "a/b/d")]
)
def test_delete_range_uses_hierarchical_order(shard: Shard, start: str, end: str) -> None:
    shard.apply(puts(*((k, b"v") for k in RANGE_KEYS)))
    builder = WriteBatchBuilder()
    builder.add_delete_range(start, end)
    assert shard.apply(builder) == [OpResult(Status.OK)]

    def in_range(k: str) -> bool:
        return compare_keys(start, k) <= 0 and (not end or compare_keys(k, end) < 0)

    expected = sorted((k for k in RANGE_KEYS if not in_range(k)), key=hierarchical)
    assert list(shard.sm.list_keys("", "")) == expected


def test_ops_see_earlier_ops_of_the_same_batch(shard: Shard) -> None:
    shard.apply(puts(("gone", b"0"), ("r/1", b"0")))
    builder = WriteBatchBuilder()
    builder.add_put("k", b"1", expected_version_id=-1)  # version 2
    builder.add_put("k", b"2", expected_version_id=2)  # sees the put above
    builder.add_put("k", b"3", expected_version_id=-1)  # k exists by now
    builder.add_delete("gone")
    builder.add_put("gone", b"back", expected_version_id=-1)  # sees the delete
    builder.add_put("r/2", b"x")  # version 5, then deleted by the range
    builder.add_delete_range("r/", "r/~")
    builder.add_delete("r/1")  # already gone with the range
    builder.add_put("r/3", b"y", expected_version_id=-1)  # version 6, after the range: stays
    results = shard.apply(builder, timestamp_ms=50)
    assert [r.status for r in results] == [
        Status.OK,
        Status.OK,
        Status.UNEXPECTED_VERSION_ID,
        Status.OK,
        Status.OK,
        Status.OK,
        Status.OK,
        Status.KEY_NOT_FOUND,
        Status.OK,
    ]
    assert results[1].version == Record(b"2", 3, 1, 50, 50)
    assert shard.sm.get("k") == results[1].version
    assert shard.sm.get("gone") == Record(b"back", 4, 0, 50, 50)
    assert list(shard.sm.list_keys("r/", "r/~")) == ["r/3"]
    assert shard.sm.get("r/3").version_id == 6
    assert shard.sm.next_version_id == 7


def test_empty_entry_only_advances_the_applied_position(shard: Shard) -> None:
    shard.apply(puts(("k", b"v")))
    digest = shard.sm.state_digest()
    assert shard.apply(WriteBatchBuilder()) == []
    assert shard.sm.applied_position == shard.head
    assert shard.sm.state_digest() == digest


def test_an_unknown_op_applies_as_an_invalid_op_and_writes_nothing(shard: Shard) -> None:
    batch = pa.RecordBatch.from_pylist(
        [{"op": 9, "key": "k"}], SCHEMA.with_metadata({b"timestamp_ms": b"1"})
    )
    entry = make_entry(EMPTY_POSITION, 1, encode_batch(batch))
    (result,) = shard.sm.apply([entry])
    assert [r.status for r in result.results] == [Status.INVALID_OP]
    assert shard.sm.applied_position == entry.position
    assert ShardReader(shard.kv).get("k") is None


# --- exactly once ----------------------------------------------------------------


@pytest.mark.parametrize("seed,crash_after", [(1, 0), (2, 7), (3, 19), (4, 30)])
def test_rocks_applies_each_entry_once_across_a_restart(
    tmp_path: Path, seed: int, crash_after: int
) -> None:
    log = random_log(seed, 30)
    digest, clean_results = replay(log)

    kv = RocksKv(tmp_path / "db")
    ShardStateMachine(kv).apply(log[:crash_after])
    kv.close()

    kv = RocksKv(tmp_path / "db")
    sm = ShardStateMachine(kv)
    assert sm.applied_position == (
        position_of(log[crash_after - 1]) if crash_after else EMPTY_POSITION
    )
    results = sm.apply(log)  # the whole log again, from the start
    assert results[:crash_after] == [None] * crash_after
    assert results[crash_after:] == clean_results[crash_after:]
    assert sm.state_digest() == digest
    assert sm.applied_position == position_of(log[-1])
    kv.close()


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_memory_crash_rolls_back_to_the_last_flush_and_replays_once(seed: int) -> None:
    log = random_log(seed, 40)
    digest, clean_results = replay(log)
    rng = random.Random(seed)
    flushed_at, crash_at = sorted(rng.sample(range(1, 40), 2))

    kv = MemoryKv()
    sm = ShardStateMachine(kv)
    sm.apply(log[:flushed_at])
    kv.flush()
    sm.apply(log[flushed_at:crash_at])
    kv.crash()

    sm = ShardStateMachine(kv)
    assert sm.applied_position == position_of(log[flushed_at - 1])
    results = sm.apply(log)
    assert results[:flushed_at] == [None] * flushed_at
    assert results[flushed_at:] == clean_results[flushed_at:]
    assert sm.state_digest() == digest


@pytest.mark.parametrize("seed", [8, 9])
def test_engines_agree(tmp_path: Path, seed: int) -> None:
    log = random_log(seed, 40)
    memory = ShardStateMachine(MemoryKv())
    rocks_kv = RocksKv(tmp_path / "db")
    rocks = ShardStateMachine(rocks_kv)
    assert memory.apply(log) == rocks.apply(log)
    assert memory.state_digest() == rocks.state_digest()
    assert list(memory.range_scan("", "")) == list(rocks.range_scan("", ""))
    rocks_kv.close()


def test_digest_sees_values_versions_and_the_counter() -> None:
    def digest_of(*builders: WriteBatchBuilder) -> int:
        shard = Shard(MemoryKv())
        for builder in builders:
            shard.apply(builder)
        return shard.sm.state_digest()

    base = digest_of(puts(("a", b"1"), ("b", b"2")))
    assert digest_of(puts(("b", b"2"), ("a", b"1"))) != base  # same data, other versions
    assert digest_of(puts(("a", b"1"), ("b", b"3"))) != base
    assert digest_of(puts(("a", b"1"), ("b", b"2"), ("c", b"3")), _delete("c")) != base  # counter
    assert digest_of(puts(("a", b"1"), ("b", b"2"))) == base


def _delete(key: str) -> WriteBatchBuilder:
    builder = WriteBatchBuilder()
    builder.add_delete(key)
    return builder


def test_gap_and_divergence_are_errors(shard: Shard) -> None:
    log = chain([puts(("k", b"v")).build(1)] * 3)
    shard.sm.apply(log[:1])
    with pytest.raises(LogGapError, match="offset 2: last applied offset is 0"):
        shard.sm.apply([log[2]])
    forked = make_entry(EMPTY_POSITION, 2, log[0].payload)
    with pytest.raises(LogDivergenceError, match="offset 0"):
        shard.sm.apply([forked])
    assert shard.sm.apply(log) == [None, *replay(log)[1][1:]]


# --- reads ---------------------------------------------------------------------

READ_KEYS = ["a", "a/1", "a/2", "a/b/c", "b", "b/1", "c/d/e"]


@pytest.fixture
def loaded(shard: Shard) -> Shard:
    shard.apply(puts(*((k, k.encode()) for k in READ_KEYS)))
    return shard


def expected_comparison(key: str, comparison: KeyComparison) -> str | None:
    ordered = sorted(READ_KEYS, key=hierarchical)
    matches = {
        KeyComparison.EQUAL: [k for k in ordered if compare_keys(k, key) == 0],
        KeyComparison.FLOOR: [k for k in ordered if compare_keys(k, key) <= 0][-1:],
        KeyComparison.CEILING: [k for k in ordered if compare_keys(k, key) >= 0][:1],
        KeyComparison.LOWER: [k for k in ordered if compare_keys(k, key) < 0][-1:],
        KeyComparison.HIGHER: [k for k in ordered if compare_keys(k, key) > 0][:1],
    }[comparison]
    return matches[0] if matches else None


@pytest.mark.parametrize("comparison", list(KeyComparison))
@pytest.mark.parametrize(
    "probe", ["", "a", "a/", "a/1", "a/15", "a/a", "a/z", "b/0", "c", "c/d/e", "zz", "/"]
)
def test_get_with_comparison(loaded: Shard, probe: str, comparison: KeyComparison) -> None:
    found = loaded.sm.get_with_comparison(probe, comparison)
    expected = expected_comparison(probe, comparison)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found[0] == expected
        assert found[1] == loaded.sm.get(expected)


def test_list_keys_and_range_scan(loaded: Shard) -> None:
    assert list(loaded.sm.list_keys("", "")) == sorted(READ_KEYS, key=hierarchical)
    assert list(loaded.sm.list_keys("a/", "a/~")) == ["a/1", "a/2"]
    assert list(loaded.sm.list_keys("b", "")) == ["b", "a/1", "a/2", "a/b/c", "b/1", "c/d/e"]
    scanned = list(loaded.sm.range_scan("a", "a/2"))
    assert [(k, r.value) for k, r in scanned] == [("a", b"a"), ("b", b"b"), ("a/1", b"a/1")]


def test_scan_arrow_matches_range_scan(shard: Shard) -> None:
    rng = random.Random(3)
    builder = WriteBatchBuilder()
    for i in range(300):
        builder.add_put(
            f"k/{i % 7}/{i}" if i % 3 else f"k{i}\x00",
            rng.randbytes(rng.randrange(40)),
            client_identity=rng.choice([None, "", "client-é"]),
            partition_key=rng.choice([None, "p" * rng.randrange(20)]),
        )
    shard.apply(builder)
    shard.apply(puts(("k/1/1", b"again")), timestamp_ms=2_000)

    batches = list(shard.sm.scan_arrow("", "", batch_rows=64))
    assert [b.num_rows for b in batches] == [64, 64, 64, 64, 44]
    assert all(b.schema == SCAN_SCHEMA for b in batches)
    rows = pa.Table.from_batches(batches).to_pylist()
    expected = [
        {
            "key": k,
            "value": r.value,
            "version_id": r.version_id,
            "modifications_count": r.modifications_count,
            "created_ms": r.created_ms,
            "modified_ms": r.modified_ms,
        }
        for k, r in shard.sm.range_scan("", "")
    ]
    assert rows == expected
    assert list(shard.sm.scan_arrow("x", "y")) == []


def test_scan_arrow_of_plain_records(shard: Shard, monkeypatch: pytest.MonkeyPatch) -> None:
    # Records without client identity or partition key take the one-slice value path.
    rng = random.Random(5)
    shard.apply(puts(*((f"p/{i:04d}", rng.randbytes(rng.randrange(30))) for i in range(200))))
    expected = [(k, r.value, r.version_id) for k, r in shard.sm.range_scan("", "")]
    batches = list(shard.sm.scan_arrow("", "", batch_rows=150))
    assert [b.num_rows for b in batches] == [150, 50]
    table = pa.Table.from_batches(batches)
    table.validate(full=True)
    assert (
        list(zip(*(table.column(c).to_pylist() for c in ("key", "value", "version_id"))))
        == expected
    )
    # A byte bound ends a batch with the record that reaches it, never inside one.
    sizes = [len(k) + len(v) for k, v in shard.kv.scan(*key_range("", ""))]
    bound = 30 * max(sizes)
    capped = list(shard.sm.scan_arrow("", "", batch_rows=150, batch_bytes=bound))
    assert len(capped) >= 4
    _assert_cut_by_bytes([b.num_rows for b in capped], sizes, bound)
    assert pa.Table.from_batches(capped).equals(table)


def _assert_cut_by_bytes(rows: list[int], sizes: list[int], bound: int) -> None:
    """Every batch but the last reaches `bound` bytes with its last record, not before."""
    start = 0
    for i, n in enumerate(rows):
        held = sizes[start : start + n]
        assert sum(held[:-1]) < bound
        if i < len(rows) - 1:
            assert sum(held) >= bound
        start += n
    assert start == len(sizes)


@pytest.mark.parametrize("value_bytes", [1000, 300_000])
def test_a_scan_of_large_values_holds_a_bounded_run_at_a_time(
    shard: Shard, value_bytes: int
) -> None:
    # 10 short runs (row by row) or 200 long ones (Arrow kernels): either way a batch
    # holds about batch_bytes, whatever batch_rows allows.
    n = 10 if value_bytes > 1000 else 200
    shard.apply(puts(*((f"s/{i:03d}", bytes([i % 256]) * value_bytes) for i in range(n))))
    whole = pa.Table.from_batches(list(shard.sm.scan_arrow("", "")))
    assert whole.num_rows == n
    sizes = [len(k) + len(v) for k, v in shard.kv.scan(*key_range("", ""))]
    bound = 3 * value_bytes
    capped = list(shard.sm.scan_arrow("", "", batch_rows=10_000, batch_bytes=bound))
    assert len(capped) >= n // 3
    _assert_cut_by_bytes([b.num_rows for b in capped], sizes, bound)
    assert pa.Table.from_batches(capped).equals(whole)


@pytest.mark.parametrize(
    "values", [[b""], [b"", b""], [b"", b"abc"], [b"abc", b""], [b"", b"", b"x" * 70_000]]
)
def test_scan_arrow_with_empty_and_lone_values(shard: Shard, values: list[bytes]) -> None:
    # Few non-empty values are where Arrow kernels return slices instead of copies.
    shard.apply(puts(*((f"k{i}", v) for i, v in enumerate(values)), client_identity="c"))
    [batch] = shard.sm.scan_arrow("", "")
    batch.validate(full=True)
    assert batch.column("value").to_pylist() == values


def test_reader_over_a_snapshot(loaded: Shard) -> None:
    view = loaded.kv.snapshot()
    loaded.apply(puts(("a", b"new")))
    reader = ShardReader(view)
    assert reader.get("a").value == b"a"
    assert reader.applied_position.offset == loaded.head.offset - 1
    assert reader.next_version_id == len(READ_KEYS)


# --- snapshots -------------------------------------------------------------------


def engine(kind: str, path: Path) -> KvStore:
    return MemoryKv() if kind == "memory" else RocksKv(path)


@pytest.mark.parametrize(
    "source_kind,target_kind", [("memory", "rocks"), ("rocks", "memory"), ("rocks", "rocks")]
)
def test_snapshot_round_trip(tmp_path: Path, source_kind: str, target_kind: str) -> None:
    log = random_log(11, 40)
    source_kv = engine(source_kind, tmp_path / "source")
    source = ShardStateMachine(source_kv)
    source.apply(log[:30])
    view = source_kv.snapshot()
    chunks = list(iter_snapshot_chunks(view, source.applied_position, chunk_bytes=64))
    assert len(chunks) > 3
    source_results = source.apply(log[30:])  # the view stays at offset 29

    target_kv = engine(target_kind, tmp_path / "target")
    target_kv.write([(b"\x01stale", b"x"), (b"\xffjunk", b"y"), (APPLIED_KEY, b"z" * 24)], [], [])
    position = install_snapshot(target_kv, chunks)
    assert position == position_of(log[29])
    target = ShardStateMachine(target_kv)
    assert target.applied_position == position
    assert ShardReader(view).state_digest() == target.state_digest()
    assert list(target_kv.scan(b"", None)) == list(view.scan(b"", None))

    assert target.apply(log)[30:] == source_results
    assert target.state_digest() == source.state_digest()
    view.close()
    source_kv.close()
    target_kv.close()


def test_snapshot_of_an_empty_kv(tmp_path: Path) -> None:
    chunks = list(iter_snapshot_chunks(MemoryKv().snapshot(), EMPTY_POSITION))
    assert len(chunks) == 1
    target = RocksKv(tmp_path / "db")
    assert install_snapshot(target, chunks) == EMPTY_POSITION
    assert list(target.scan(b"", None)) == []
    target.close()


def snapshot_chunks() -> tuple[list[bytes], LogPosition]:
    kv = MemoryKv()
    sm = ShardStateMachine(kv)
    sm.apply(random_log(12, 10))
    return list(
        iter_snapshot_chunks(kv.snapshot(), sm.applied_position, chunk_bytes=32)
    ), sm.applied_position


@pytest.mark.parametrize("kind", ["memory", "rocks"])
def test_interrupted_install_leaves_an_empty_kv(tmp_path: Path, kind: str) -> None:
    """Neither an applied position nor part of the snapshot's data: the user data is one
    bulk load, which the failed stream never completed."""
    chunks, _ = snapshot_chunks()
    kv = engine(kind, tmp_path / "db")
    ShardStateMachine(kv).apply(random_log(13, 5))

    def broken() -> Iterator[bytes]:
        yield from chunks[:-1]
        raise ConnectionError("peer went away")

    with pytest.raises(ConnectionError):
        install_snapshot(kv, broken())
    assert list(kv.scan(b"", None)) == []
    assert ShardStateMachine(kv).applied_position == EMPTY_POSITION
    kv.close()


@pytest.mark.parametrize(
    "mangle,message",
    [
        (lambda c: [], "no chunks"),
        (lambda c: c[:-1], "ended after chunk"),
        (lambda c: [c[0], c[2], *c[3:]], "chunk 2 arrived where chunk 1"),
        (lambda c: [*c, c[-1]], "continues after its last chunk"),
        (lambda c: c[1:], "chunk 1 arrived where chunk 0"),
        (lambda c: [b"junk"], "not an Arrow IPC stream"),
    ],
)
def test_install_rejects_broken_streams(mangle, message: str) -> None:
    chunks, _ = snapshot_chunks()
    with pytest.raises(ValueError, match=message):
        install_snapshot(MemoryKv(), mangle(chunks))


# --- the columnar apply of plain puts ------------------------------------------------


def _plain_put_entry(
    rng: random.Random, e: int, versions: dict[str, int]
) -> tuple[WriteBatchBuilder, ClientSerial | None, list[str]]:
    """An entry of 16-40 plain puts over a small key space (so keys get replaced), with
    client identities, partition keys, met expected versions (`versions`: each key's
    current version id) and, every other entry, an exactly-once origin; every fourth
    entry is an overwrite, whose range deletes come first (an inverted one, an unbounded
    one, one over the indexed record). Some entries hold what the columnar apply must
    leave to the loop: a key named twice, an expected version not met, a replaced record
    with secondary indexes. Returns the key of each op (a range's start)."""
    builder = WriteBatchBuilder()
    ranges = []
    if e % 4 == 3:
        candidates = [("k/1/", "k/1//"), ("k/3/", "k/4/"), ("top1", "top5"), ("k/2/", "k/1/")]
        ranges = rng.sample([*candidates, ("top9", "")], 2)
    for start, end in ranges:
        builder.add_delete_range(start, end)
    keys = [
        f"k/{k % 5}/{k}" if k % 2 else f"top{k}\x00"
        for k in rng.sample(range(120), rng.randrange(16, 41))
    ]
    if e % 7 == 3:
        keys.append(keys[0])  # named twice
    for key in keys:
        expected = None
        if not ranges and rng.random() < 0.3:
            expected = versions.get(key, VERSION_ID_NOT_EXISTS)
        builder.add_put(
            key,
            rng.randbytes(rng.randrange(30)),
            expected_version_id=expected,
            client_identity=rng.choice([None, "", "client-é"]),
            partition_key=rng.choice([None, "p" * rng.randrange(5)]),
        )
    if e % 9 == 5:
        keys.append("k/0/5")
        builder.add_put("k/0/5", b"x", expected_version_id=123_456)  # not met
    if e % 11 == 4:
        keys.append("k/1/1")
        builder.add_put("k/1/1", b"indexed", secondary_indexes=[("idx", "s")])
    origin = ClientSerial("writer", e) if e % 2 else None
    return builder, origin, [start for start, _ in ranges] + keys


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_columnar_apply_equals_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    machines = {name: ShardStateMachine(RocksKv(tmp_path / name)) for name in ("loop", "columnar")}
    columnar_apply = ShardStateMachine._apply_plain_puts
    # Per columnar attempt: whether it applied the entry, and whether ranges led it.
    took: list[bool] = []
    overwrites: list[bool] = []

    def attempt(self: ShardStateMachine, *args: object) -> EntryResult | None:
        result = columnar_apply(self, *args)  # type: ignore[arg-type]
        took.append(result is not None)
        entry_batch = args[1]
        assert isinstance(entry_batch, pa.RecordBatch)
        deletes_ranges = pc.any(pc.equal(entry_batch.column("op"), Op.DELETE_RANGE.value))
        overwrites.append(result is not None and deletes_ranges.as_py())
        return result

    monkeypatch.setattr(ShardStateMachine, "_apply_plain_puts", attempt)
    rng = random.Random(seed)
    versions: dict[str, int] = {}
    head = EMPTY_POSITION
    for e in range(40):
        builder, origin, keys = _plain_put_entry(rng, e, versions)
        entry = make_entry(head, 1, builder.build(1_000 + e, origin))
        head = position_of(entry)
        results = {}
        for name, machine in machines.items():
            monkeypatch.setattr(
                columnar_kernel, "_COLUMNAR_MIN_OPS", 10**9 if name == "loop" else 16
            )
            [results[name]] = machine.apply([entry])
        assert results["columnar"] == results["loop"]
        for key, result in zip(keys, results["loop"].results):
            if result.version is not None:
                versions[key] = result.version.version_id
        for key in [k for k in versions if machines["loop"].get(k) is None]:
            del versions[key]  # deleted by a range
    monkeypatch.setattr(columnar_kernel, "_COLUMNAR_MIN_OPS", 16)
    views = [list(m._store.scan(b"", None)) for m in machines.values()]  # internal keys too
    assert views[0] == views[1]
    assert len(versions) > 60  # live keys, after the ranges deleted some
    assert took.count(True) > 15 and took.count(False) >= 5
    assert overwrites.count(True) >= 5
    # A retried exactly-once write returns the original results, stored column by column.
    first_origin = ClientSerial("writer", 39)
    retry = make_entry(head, 1, WriteBatchBuilder().build(9_999, first_origin))
    [duplicate] = machines["columnar"].apply([retry])
    assert duplicate.duplicate
    # Stored results keep each record's version, not its value (see `encode_results`),
    # after the OK of each range delete (the last entry is an overwrite).
    assert [(r.status, r.version) for r in duplicate.results] == [
        (r.status, r.version and r.version._replace(value=b"")) for r in results["loop"].results
    ]
    assert duplicate.results[:2] == [OpResult(Status.OK)] * 2


# --- prepared applies ---------------------------------------------------------------


def _mixed_entry(
    rng: random.Random, e: int, versions: dict[str, int]
) -> tuple[bytes, list[str] | None]:
    """Plain-put entries (column by column, or left to the loop) with the key of each op,
    and small mixed ones, exactly-once, some repeating the last serial (a retry) or an
    older one."""
    if e % 3 == 0:
        builder, origin, keys = _plain_put_entry(rng, e, versions)
        return builder.build(1_000 + e, origin), keys
    [small] = random_log(rng.randrange(10**6), 1)
    serial = max(0, rng.choice([e, e, e, e - 1, e - 3]))
    return _reoriginated(small.payload, 1_000 + e, ClientSerial("writer", serial)), None


def _reoriginated(payload: bytes, timestamp_ms: int, origin: ClientSerial) -> bytes:
    batch = decode_batch(payload)
    builder = WriteBatchBuilder()
    for row in batch.to_pylist():
        if row["op"] == Op.PUT.value:
            builder.add_put(row["key"], row["value"], row["expected_version_id"])
        elif row["op"] == Op.DELETE.value:
            builder.add_delete(row["key"], row["expected_version_id"])
        else:
            builder.add_delete_range(row["key"], row["end_key"] or "")
    return builder.build(timestamp_ms, origin)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_prepared_apply_equals_the_apply_proper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """`prepare` computes an entry's apply without making it; the apply then writes what
    was computed. Every result and the whole KV (internal keys too) must be what the
    apply proper makes, and preparing must change nothing."""
    monkeypatch.setattr(columnar_kernel, "_COLUMNAR_MIN_OPS", 16)
    proper = ShardStateMachine(RocksKv(tmp_path / "proper"))
    prepared = ShardStateMachine(RocksKv(tmp_path / "prepared"))
    rng = random.Random(seed)
    versions: dict[str, int] = {}
    head = EMPTY_POSITION
    duplicates = 0
    for e in range(60):
        payload, keys = _mixed_entry(rng, e, versions)
        entry = make_entry(head, 1, payload)
        head = position_of(entry)
        [expected] = proper.apply([entry])
        before = list(prepared._store.scan(b"", None))
        counter = prepared.next_version_id
        assert prepared.prepare(entry)
        assert list(prepared._store.scan(b"", None)) == before, "preparing wrote to the KV"
        assert (prepared.applied_position.offset, prepared.next_version_id) == (
            entry.offset - 1,
            counter,
        ), "preparing moved the applied position or the version counter"
        [result] = prepared.apply([entry])
        assert result == expected
        assert expected is not None
        duplicates += expected.duplicate
        for key, op in zip(keys or (), expected.results):
            if op.version is not None:
                versions[key] = op.version.version_id
        for key in [k for k in versions if proper.get(k) is None]:
            del versions[key]
        assert prepared.next_version_id == proper.next_version_id
    assert list(prepared._store.scan(b"", None)) == list(proper._store.scan(b"", None))
    assert prepared.applied_position == proper.applied_position == head
    assert duplicates >= 5


def test_a_prepared_apply_is_dropped_when_another_entry_takes_its_offset(
    tmp_path: Path,
) -> None:
    """A deposed leader prepared its entry; the next leader's entry at the same offset
    is applied instead, as if nothing had been prepared."""
    shard = Shard(RocksKv(tmp_path / "kv"))
    shard.apply(puts(("a", b"1")))
    base = shard.head
    ours = make_entry(base, 1, puts(("a", b"ours"), ("b", b"ours")).build(2_000))
    theirs = make_entry(base, 2, puts(("a", b"theirs")).build(3_000))
    assert shard.sm.prepare(ours)
    assert not shard.sm.prepare(make_entry(position_of(ours), 1, puts(("c", b"x")).build(4_000)))
    assert shard.sm.prepare(ours)
    assert shard.sm.prepare(ours)  # again: nothing to do
    [result] = shard.sm.apply([theirs])
    assert result is not None and result.offset == theirs.offset
    assert shard.sm.applied_position == position_of(theirs)
    assert shard.sm.get("a") == Record(b"theirs", 1, 1, 1_000, 3_000)
    assert shard.sm.get("b") is None
    # Used up: applying its own entry later (at the next offset, say) computes afresh.
    assert shard.sm.prepare(make_entry(position_of(theirs), 2, puts(("b", b"2")).build(5_000)))
    other = make_entry(position_of(theirs), 2, puts(("b", b"other")).build(6_000))
    shard.sm.apply([other])
    assert shard.sm.get("b") is not None and shard.sm.get("b").value == b"other"  # type: ignore[union-attr]


def test_an_entry_of_a_staged_write_is_not_prepared(tmp_path: Path) -> None:
    """A publishing entry reads all its write's pieces; that stays with the apply proper."""
    sm = ShardStateMachine(RocksKv(tmp_path / "kv"))
    piece = puts_batch(
        pa.array(["k"]), pa.array([b"v"], pa.binary()), 1_000,
        staging=Staging(StagingKind.PIECE, "w", 0),
    )  # fmt: skip
    entry = make_entry(EMPTY_POSITION, 1, piece)
    assert not sm.prepare(entry)
    assert sm.apply([entry])[0] is not None


def test_preparing_the_prepared_entry_again_computes_nothing(
    tmp_path: Path, computed_applies: list[int]
) -> None:
    """A leader whose Acks are late sends the entry again (retransmission, heartbeats);
    each written Append asks to prepare it, and only the first may cost an apply."""
    shard = Shard(RocksKv(tmp_path / "kv"))
    entry = make_entry(shard.head, 1, puts(("a", b"1")).build(2_000))
    for _ in range(3):
        assert shard.sm.prepare(entry)
    assert computed_applies == [entry.offset]
    [result] = shard.sm.apply([entry])
    assert computed_applies == [entry.offset] and result is not None and result.results[0].version
