"""The apply is total: whatever bytes a committed entry holds, every replica applies it
to the same state and results, and none raises (issue 49: a poison entry must not
stop a shard)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, make_entry
from quorumstore.storage.kv import KvStore
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.reads import APPLIED_KEY
from quorumstore.storage.results import EntryResult, Status
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import (
    BINARY_TYPES,
    SCHEMA,
    SECONDARY_INDEX,
    TIMESTAMP_KEY,
    InvalidBatchError,
    Op,
    WriteBatchBuilder,
    decode_batch,
    encode_batch,
)


def _position(entry: LogEntry) -> LogPosition:
    return LogPosition(entry.term, entry.offset, entry.checksum)


class _Replicas:
    """State machines fed the same entries, one per KV."""

    def __init__(self, *kvs: KvStore) -> None:
        self.kvs = kvs
        self.machines = [ShardStateMachine(kv) for kv in kvs]
        self.head = EMPTY_POSITION

    def apply(self, payload: bytes) -> EntryResult:
        entry = make_entry(self.head, 1, payload)
        self.head = _position(entry)
        results = [machine.apply([entry]) for machine in self.machines]
        first = results[0][0]
        assert first is not None
        for [other] in results[1:]:
            assert other is not None
            assert (other.offset, list(other.results), other.invalid, other.refused) == (
                first.offset,
                list(first.results),
                first.invalid,
                first.refused,
            )
        for machine in self.machines:
            assert machine.applied_position == self.head
        return first

    def assert_same_state(self) -> None:
        states = [list(kv.scan(b"", b"\xff" * 4)) for kv in self.kvs]
        digests = {machine.state_digest() for machine in self.machines}
        assert len(digests) == 1
        assert all(state == states[0] for state in states[1:])


def _timestamped(batch: pa.RecordBatch, metadata: dict[bytes, bytes] | None = None) -> bytes:
    return ipc_bytes(
        batch.replace_schema_metadata({TIMESTAMP_KEY: b"1000"} if metadata is None else metadata)
    )


def _with_bad_key(rows: list[dict[str, object]], bad_row: int, bad: bytes) -> pa.RecordBatch:
    """A SCHEMA batch of `rows` whose key at `bad_row` is the raw bytes `bad`."""
    batch = pa.RecordBatch.from_pylist(rows, SCHEMA)
    raw = batch.column("key").view(pa.binary()).to_pylist()
    raw[bad_row] = bad
    key = pa.array(raw, pa.binary()).view(pa.string())
    return batch.set_column(SCHEMA.get_field_index("key"), SCHEMA.field("key"), key)


# --- the reproduction and each kind of op the apply cannot apply --------------------------


@pytest.fixture
def replicas(tmp_path: Path) -> _Replicas:
    return _Replicas(MemoryKv(), RocksKv(tmp_path / "rocks"))


def test_a_key_that_is_not_utf8_fails_its_op_only(replicas: _Replicas) -> None:
    rows = [{"op": Op.PUT, "key": k, "value": b"v"} for k in ("/a", "/b", "/c")]
    result = replicas.apply(_timestamped(_with_bad_key(rows, 1, b"\xff")))
    assert [r.status for r in result.results] == [Status.OK, Status.INVALID_OP, Status.OK]
    assert result.invalid == "op 1 cannot be applied: key is not valid UTF-8"
    assert [m.get("/a") is not None for m in replicas.machines] == [True, True]
    assert [m.get("/c") is not None for m in replicas.machines] == [True, True]
    replicas.assert_same_state()


def test_many_plain_puts_with_a_bad_key_skip_the_columnar_apply(replicas: _Replicas) -> None:
    rows = [{"op": Op.PUT, "key": f"/k{i:04d}", "value": b"v"} for i in range(300)]
    result = replicas.apply(_timestamped(_with_bad_key(rows, 200, b"\xc3")))
    statuses = [r.status for r in result.results]
    assert statuses.count(Status.INVALID_OP) == 1 and statuses[200] is Status.INVALID_OP
    assert replicas.machines[0].get("/k0299") is not None
    replicas.assert_same_state()


@pytest.mark.parametrize(
    "row,reason",
    [
        ({"op": 9, "key": "/k"}, "op code 9 is unknown"),
        ({"op": Op.CLOSE_SESSION, "key": ""}, "session_id None is no session's"),
        (
            {"op": Op.PUT, "key": "/s", "value": b"", "sequence_key_delta": [1, None]},
            "sequence_key_delta holds a null",
        ),
        (
            {"op": Op.PUT, "key": "/i", "value": b"", "secondary_indexes": [None]},
            "secondary_indexes holds a null",
        ),
    ],
)
def test_an_op_the_apply_cannot_apply_gets_invalid_op(
    replicas: _Replicas, row: dict[str, object], reason: str
) -> None:
    ok = {"op": Op.PUT, "key": "/ok", "value": b"v"}
    batch = pa.RecordBatch.from_pylist([ok, row, ok], SCHEMA)
    result = replicas.apply(_timestamped(batch))
    assert [r.status for r in result.results] == [Status.OK, Status.INVALID_OP, Status.OK]
    assert result.invalid == f"op 1 cannot be applied: {reason}"
    replicas.assert_same_state()


@pytest.mark.parametrize("session_id", [(1 << 63) - 1, -(1 << 63), 0])
def test_closing_an_id_no_session_can_have_finds_no_session(
    replicas: _Replicas, session_id: int
) -> None:
    """Any int64 reaches the apply from a client's CloseSession (found by fuzzing it):
    the largest, which no session can have, is as absent as any other never assigned."""
    close = WriteBatchBuilder()
    close.add_close_session(session_id)
    result = replicas.apply(close.build(1))
    assert [r.status for r in result.results] == [Status.SESSION_DOES_NOT_EXIST]
    assert result.invalid is None
    replicas.assert_same_state()


@pytest.mark.parametrize(
    "payload,reason",
    [
        (b"not arrow", "not an Arrow IPC stream"),
        (_timestamped(pa.RecordBatch.from_pylist([], SCHEMA), {}), "no timestamp_ms"),
        (
            _timestamped(pa.RecordBatch.from_pylist([], SCHEMA), {TIMESTAMP_KEY: b"\xff"}),
            "'timestamp_ms' is not valid UTF-8",
        ),
        (
            _timestamped(
                pa.RecordBatch.from_pylist([], SCHEMA),
                {TIMESTAMP_KEY: b"1", b"client_id": b"c", b"serial": b"-1"},
            ),
            "'serial' is '-1'",
        ),
        (
            _timestamped(
                pa.RecordBatch.from_pylist([], SCHEMA), {TIMESTAMP_KEY: b"1", b"stage": b"s"}
            ),
            "no piece metadata",
        ),
        (ipc_bytes(pa.RecordBatch.from_pydict({"x": [1]})), "schema mismatch"),
    ],
    ids=["garbage", "no-timestamp", "timestamp-not-utf8", "negative-serial", "piece", "schema"],
)
def test_an_entry_that_is_no_write_batch_is_an_error_result(
    replicas: _Replicas, payload: bytes, reason: str
) -> None:
    replicas.apply(WriteBatchBuilder().build(1))
    result = replicas.apply(payload)
    assert result.results == [] and result.invalid is not None and reason in result.invalid
    builder = WriteBatchBuilder()
    builder.add_put("/after", b"x")
    assert [r.status for r in replicas.apply(builder.build(2)).results] == [Status.OK]
    replicas.assert_same_state()


def test_encode_batch_refuses_strings_that_are_not_utf8() -> None:
    rows = [{"op": Op.PUT, "key": "/a", "value": b""}]
    batch = _with_bad_key(rows, 0, b"\xff").replace_schema_metadata({TIMESTAMP_KEY: b"1"})
    with pytest.raises(InvalidBatchError, match="not valid UTF-8"):
        encode_batch(batch)


def test_valid_entries_apply_as_before() -> None:
    """The invalid-op checks leave a valid entry's effect alone: the same KV bytes as an
    entry of only its valid ops."""
    mixed, clean = _Replicas(MemoryKv()), _Replicas(MemoryKv())
    for replicas in (mixed, clean):
        builder = WriteBatchBuilder()
        builder.add_create_session(5_000, "me")
        builder.add_put("/e", b"1", session_id=1, secondary_indexes=[("i", "x")])
        builder.add_put("/s", b"2", partition_key="p", sequence_key_delta=[1, 2])
        replicas.apply(builder.build(10))
    builder = WriteBatchBuilder()
    builder.add_put("/e", b"3", secondary_indexes=[("i", "y")])
    builder.add_put("/z", b"4")
    valid = decode_batch(builder.build(11)).replace_schema_metadata(None)
    bad = pa.RecordBatch.from_pylist([{"op": 9, "key": "/e"}], SCHEMA)
    with_bad = mixed.apply(
        _timestamped(
            pa.concat_batches([valid.slice(0, 1), bad, valid.slice(1)]), {TIMESTAMP_KEY: b"11"}
        )
    )
    alone = clean.apply(builder.build(11))
    assert with_bad.results[0] == alone.results[0] and with_bad.results[2] == alone.results[1]
    # Every byte but the applied position's checksum, which is of the entry's payload.
    states = [dict(r.kvs[0].scan(b"", b"\xff")) for r in (mixed, clean)]
    for state in states:
        del state[APPLIED_KEY]
    assert states[0] == states[1]


# --- fuzzing -------------------------------------------------------------------------

_TEXT = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["", "/a", "/a/b", "/b", "p"]),
    st.binary(max_size=4).map(lambda b: b),  # raw bytes, often not UTF-8
)


def _column_value(name: str, draw: st.DrawFn) -> object:
    """A value for column `name`; strings may come as raw bytes (set in by `_raw_batch`)."""
    if name == "op":
        return draw(st.one_of(st.sampled_from(list(Op)), st.integers(-128, 127)))
    if name in ("key", "end_key", "client_identity", "partition_key"):
        return draw(st.one_of(st.none(), _TEXT)) if name != "key" else draw(_TEXT)
    if name == "value":
        return draw(st.one_of(st.none(), st.binary(max_size=8)))
    if name in ("expected_version_id", "session_id", "session_timeout_ms"):
        return draw(
            st.one_of(st.none(), st.integers(-2, 4), st.sampled_from([(1 << 63) - 1, -(1 << 63)]))
        )
    if name == "sequence_key_delta":
        delta = st.one_of(st.none(), st.integers(0, 3), st.just((1 << 64) - 1))
        return draw(st.one_of(st.none(), st.lists(delta, max_size=3)))
    pair = st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {
                "index_name": st.one_of(st.none(), _TEXT),
                "secondary_key": st.one_of(st.none(), _TEXT),
            }
        ),
    )
    return draw(st.one_of(st.none(), st.lists(pair, max_size=2)))


def _as_bytes(value: object) -> object:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):
        return [_as_bytes(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_bytes(v) for k, v in value.items()}
    return value


def _index_column(values: list[object]) -> pa.Array:
    """The secondary_indexes column of `values`, whose strings may be bytes that are
    not UTF-8 and whose pairs may hold nulls, as a hostile writer's could."""
    offsets, names, secondaries, pair_is_null = [0], [], [], []
    for pairs in values:
        for pair in pairs or ():  # type: ignore[attr-defined]
            pair_is_null.append(pair is None)
            names.append(None if pair is None else _as_bytes(pair["index_name"]))
            secondaries.append(None if pair is None else _as_bytes(pair["secondary_key"]))
        offsets.append(len(names))
    structs = pa.StructArray.from_arrays(
        [pa.array(column, pa.binary()).view(pa.string()) for column in (names, secondaries)],
        fields=list(SECONDARY_INDEX),
        mask=pa.array(pair_is_null, pa.bool_()),
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()),
        structs,
        type=SCHEMA.field("secondary_indexes").type,
        mask=pa.array([v is None for v in values], pa.bool_()),
    )


@st.composite
def _raw_batch(draw: st.DrawFn) -> bytes:
    """A SCHEMA batch of arbitrary values, strings not necessarily UTF-8 (nulls even in
    the columns SCHEMA forbids them in, now and then), with arbitrary metadata."""
    n = draw(st.integers(0, 6))
    columns = []
    for field in SCHEMA:
        values = [_column_value(field.name, draw) for _ in range(n)]
        if field.name == "secondary_indexes":
            columns.append(_index_column(values))
        elif field.name in BINARY_TYPES:
            strings = pa.array([_as_bytes(v) for v in values], pa.binary()).view(pa.string())
            columns.append(strings)
        else:
            columns.append(pa.array(values, field.type))
    metadata = draw(
        st.one_of(
            st.just({TIMESTAMP_KEY: b"1000"}),
            st.dictionaries(
                st.sampled_from(
                    [TIMESTAMP_KEY, b"client_id", b"serial", b"publish", b"pieces", b"discard"]
                ),
                st.one_of(st.binary(max_size=3), st.sampled_from([b"0", b"1", b"7", b"c"])),
            ),
        )
    )
    batch = pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
    return ipc_bytes(batch.replace_schema_metadata(metadata))


def _valid_payload(i: int) -> bytes:
    builder = WriteBatchBuilder()
    builder.add_create_session(5_000, "c")
    builder.add_put(f"/v{i % 3}", b"x", session_id=1, secondary_indexes=[("i", f"s{i}")])
    builder.add_put("/seq", b"y", partition_key="p", sequence_key_delta=[1])
    builder.add_delete_range("/v1", "/v2")
    return builder.build(1_000 + i)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    """A valid payload with a few bytes flipped, cut or inserted."""
    data = bytearray(_valid_payload(draw(st.integers(0, 5))))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[at:]
            if not data:
                break
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
    return bytes(data)


_PAYLOADS = st.lists(
    st.one_of(
        st.binary(max_size=64),
        _raw_batch(),
        _mutated(),
        st.integers(0, 5).map(_valid_payload),
    ),
    min_size=1,
    max_size=6,
)


def test_fuzzed_entries_apply_alike_on_every_replica_and_never_raise() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        replicas = _Replicas(MemoryKv(), RocksKv(Path(tmp) / "rocks"))

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(_PAYLOADS)
        def run(payloads: list[bytes]) -> None:
            for payload in payloads:
                result = replicas.apply(payload)
                invalid_ops = sum(r.status is Status.INVALID_OP for r in result.results)
                # A repeated serial answers with the original's stored results, whose
                # reason (`invalid`) is never stored.
                assert (
                    result.duplicate
                    or not result.results
                    or (result.invalid is None) == (invalid_ops == 0)
                )
                event(
                    "an op invalid"
                    if invalid_ops
                    else "entry invalid"
                    if result.invalid
                    else "applied"
                )
            replicas.assert_same_state()

        run()
