"""Typed values (``valueFormat json`` and ``arrow``): what a write stores, what a read
decodes, JSON written by Spark's own ``to_json``, and Arrow values from other writers."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import random

import numpy as np
import pyarrow as pa
import pytest

from quorumstore.spark import arrow_values, json_values
from quorumstore.spark.arrow_values import NotArrowValue
from quorumstore.spark.datasource_values import SchemaError, ValueCodec, parse_schema
from quorumstore.spark.json_values import base64_decoded

UTC = datetime.UTC
SCHEMA = (
    "b BINARY, ts TIMESTAMP, d DATE, dec DECIMAL(10,2), f DOUBLE, n BIGINT, ok BOOLEAN, "
    "m MAP<STRING, BINARY>, tags ARRAY<BINARY>, s STRUCT<x: DATE, y: BINARY, z: ARRAY<BINARY>>, "
    "deep STRUCT<counts: MAP<STRING, INT>, when: MAP<STRING, DATE>>"
)


def codec(ddl: str = SCHEMA, fmt: str = "json") -> ValueCodec:
    return ValueCodec(fmt, parse_schema(ddl))


def full_row(i: int) -> dict[str, object]:
    data = bytes(range(i % 7)) + b"\xff" * (i % 3)  # every base64 padding length
    return {
        "b": data,
        "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, 123000, tzinfo=UTC),
        "d": datetime.date(2024, 5, 6),
        "dec": decimal.Decimal("12.34"),
        "f": float("nan") if i == 3 else 1.25 * i,
        "n": 2**40 + i,
        "ok": i % 2 == 0,
        "m": [("a", data), ("b", None)],
        "tags": [data, b"", None],
        "s": {"x": datetime.date(2020, 1, i + 1), "y": data, "z": [data]},
        "deep": {"counts": [("c", i)], "when": [("w", datetime.date(2021, 2, 3))]},
    }


@pytest.mark.parametrize("fmt", ["json", "arrow"])
def test_every_type_round_trips_with_nulls_at_every_level(fmt: str) -> None:
    c = codec(fmt=fmt)
    rows = [full_row(i) for i in range(9)]
    rows.append(dict.fromkeys(full_row(0)))  # every column null
    rows.append({**full_row(1), "s": {"x": None, "y": None, "z": None}, "tags": None, "m": []})
    batch = pa.RecordBatch.from_pylist(rows, schema=c.arrow)
    stored = c.encode(batch)
    values = pa.array(list(stored.to_pylist()) + [None], pa.binary())  # and a deleted value
    decoded = c.decode(values)
    got = pa.Table.from_arrays(decoded, schema=c.arrow)
    want = pa.Table.from_pylist([*rows, dict.fromkeys(full_row(0))], schema=c.arrow)
    assert got.num_rows == want.num_rows
    for name in c.arrow.names:
        # NaN != NaN, so compare the JSON-able form of each column
        assert repr(got.column(name).to_pylist()) == repr(want.column(name).to_pylist()), name


def test_maps_and_binary_are_stored_as_spark_writes_them() -> None:
    c = codec("m MAP<STRING, INT>, b BINARY, a ARRAY<BINARY>")
    batch = pa.RecordBatch.from_pylist(
        [{"m": [("a", 1), ("b", 2)], "b": b"\x00\x01hi", "a": [b"ab"]}], schema=c.arrow
    )
    assert json.loads(c.encode(batch)[0].as_py()) == {
        "m": {"a": 1, "b": 2},
        "b": "AAFoaQ==",
        "a": ["YWI="],
    }


def _random_text(rng: random.Random) -> str | None:
    if rng.random() < 0.1:
        return None
    chars = ["a", "é", '"', "\\", "\n", "\x00", "\x1f", "\u2028", "😀", " ", "/"]
    return "".join(rng.choice(chars) for _ in range(rng.randint(0, 6)))


def _random_float(rng: random.Random) -> float | None:
    special = [
        None,
        0.1,
        100.0,
        -0.0,
        1e20,
        1e-7,
        5e-324,
        float("nan"),
        float("inf"),
        -float("inf"),
    ]
    return rng.choice([*special, rng.random() * 1e6])


def _random_bytes(rng: random.Random) -> bytes | None:
    if rng.random() < 0.1:
        return None
    return bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))  # every padding


_FIRST_US = -62135596800 * 10**6  # 0001-01-01T00:00:00, UTC
_LAST_US = 253402300799999999  # 9999-12-31T23:59:59.999999, UTC


def _random_timestamp(rng: random.Random, tz: datetime.timezone | None) -> datetime.datetime | None:
    if rng.random() < 0.1:
        return None
    us = rng.randint(_FIRST_US, _LAST_US)
    if rng.random() < 0.3:
        us -= us % 10**6  # whole seconds: written without a fraction
    moment = datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(microseconds=us)
    return moment if tz is not None else moment.replace(tzinfo=None)


def test_json_values_are_the_objects_the_json_module_writes() -> None:
    """Columns the Arrow kernels write (strings needing every escape, numbers, booleans,
    dates, lists and structs of them, with nulls at every level) beside columns written
    value by value: every value parses to what `json.dumps` of its row parses to (float32
    compared as float32, which the kernels write in its shortest form), and reads back."""
    c = codec(
        "s STRING, n BIGINT, f DOUBLE, g FLOAT, ok BOOLEAN, d DATE, l ARRAY<STRING>, "
        "st STRUCT<x: INT, y: ARRAY<DOUBLE>>, ll ARRAY<ARRAY<TINYINT>>, b BINARY, "
        "m MAP<STRING, INT>, dec DECIMAL(10,2), ts TIMESTAMP, tn TIMESTAMP_NTZ, "
        "big DECIMAL(38,10), mm MAP<STRING, STRUCT<b: BINARY, t: ARRAY<TIMESTAMP>>>"
    )
    rng = random.Random(3)
    rows = [
        {
            "s": _random_text(rng),
            "n": rng.choice([None, 2**63 - 1, -(2**63), 0]),
            "f": _random_float(rng),
            "g": _random_float(rng),
            "ok": rng.choice([None, True, False]),
            "d": rng.choice([None, datetime.date(2024, 5, 6)]),
            "l": rng.choice([None, [], [_random_text(rng) for _ in range(3)]]),
            "st": rng.choice(
                [None, {"x": None, "y": None}, {"x": 5, "y": [_random_float(rng), None]}]
            ),
            "ll": rng.choice([None, [[1, None], None, []]]),
            "b": _random_bytes(rng),
            "m": rng.choice(
                [None, [], [(_random_text(rng) or "", rng.choice([None, 1, -7]))], [("k", 1)]]
            ),
            "dec": rng.choice(
                [None, decimal.Decimal(rng.randint(-(10**10) + 1, 10**10 - 1)) / 100]
            ),
            "ts": _random_timestamp(rng, UTC),
            "tn": _random_timestamp(rng, None),
            "big": rng.choice(
                [None, decimal.Decimal("1E-10"), decimal.Decimal(rng.randint(0, 10**20)) / 10**10]
            ),
            "mm": rng.choice(
                [
                    None,
                    [("a", None)],
                    [("b", {"b": _random_bytes(rng), "t": [_random_timestamp(rng, UTC)]})],
                ]
            ),
        }
        for _ in range(2000)
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=c.arrow)
    for part in (batch, batch.slice(17, 900)):
        stored = c.encode(part).to_pylist()
        for value, row in zip(stored, part.to_pylist(maps_as_pydicts="strict"), strict=True):
            written = json.loads(value)
            expected = json.loads(json.dumps(row, default=json_values._default))
            for obj in (written, expected):
                obj["g"] = None if obj["g"] is None else float(np.float32(obj["g"]))
            assert repr(written) == repr(expected), value
        decoded = pa.Table.from_arrays(c.decode(pa.array(stored, pa.binary())), schema=c.arrow)
        assert repr(decoded.to_pylist()) == repr(pa.Table.from_batches([part]).to_pylist())


def test_json_columns_arrow_kernels_can_write_are_not_written_value_by_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(array: pa.Array) -> pa.Array:
        raise AssertionError(f"{array.type} written value by value")

    monkeypatch.setattr(json_values, "_python_text", refuse)
    c = codec(
        "s STRING, n INT, f DOUBLE, ok BOOLEAN, d DATE, st STRUCT<l: ARRAY<STRING>>, "
        "ts TIMESTAMP, tn TIMESTAMP_NTZ, dec DECIMAL(5,2), b BINARY, m MAP<STRING, BINARY>"
    )
    row = {
        "s": 'a"b',
        "n": 1,
        "f": 2.0,
        "ok": True,
        "d": None,
        "st": {"l": ["x", None]},
        "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        "tn": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "dec": decimal.Decimal("-1.50"),
        "b": b"\x00hi",
        "m": [("k", b"v"), ("n", None)],
    }
    stored = c.encode(pa.RecordBatch.from_pylist([row], schema=c.arrow))
    assert stored.to_pylist() == [
        (
            b'{"s":"a\\"b","n":1,"f":2.0,"ok":true,"d":null,"st":{"l":["x",null]},'
            b'"ts":"2024-01-02T03:04:05.000006+00:00","tn":"2024-01-02T03:04:05","dec":"-1.50",'
            b'"b":"AGhp","m":{"k":"dg==","n":null}}'
        )
    ]


def test_json_written_by_sparks_to_json_decodes() -> None:
    # Printed by Spark 4.3's to_json(struct(...)) with spark.sql.session.timeZone=UTC.
    spark_json = (
        b'{"b":"AAFoaQ==","ts":"2024-01-02T03:04:05.123Z","d":"2024-05-06","dec":12.34,'
        b'"m":{"a":"eA==","b":null},"a":["","YWI="],"ntz":"2024-01-02T03:04:05.000"}'
    )
    c = codec(
        "b BINARY, ts TIMESTAMP, d DATE, dec DECIMAL(10,2), m MAP<STRING, BINARY>, "
        "a ARRAY<BINARY>, ntz TIMESTAMP_NTZ"
    )
    row = pa.Table.from_arrays(c.decode(pa.array([spark_json])), schema=c.arrow).to_pylist()[0]
    assert row == {
        "b": b"\x00\x01hi",
        "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, 123000, tzinfo=UTC),
        "d": datetime.date(2024, 5, 6),
        "dec": decimal.Decimal("12.34"),
        "m": [("a", b"x"), ("b", None)],
        "a": [b"", b"ab"],
        "ntz": datetime.datetime(2024, 1, 2, 3, 4, 5),
    }


def test_base64_decoding_of_a_whole_column_matches_the_standard_library() -> None:
    rng = random.Random(7)
    data = [None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 40)) for _ in range(500)]
    text = pa.array([None if d is None else base64.b64encode(d).decode() for d in data])
    assert base64_decoded(text).to_pylist() == data
    assert base64_decoded(text.slice(37, 100)).to_pylist() == data[37:137]


@pytest.mark.parametrize(
    ("text", "why"),
    [("AAF", "multiple of 4"), ("A=AA", "before its end"), ("AA!A", "not base64")],
)
def test_a_binary_member_that_is_not_base64_is_a_clear_error(text: str, why: str) -> None:
    c = codec("b BINARY")
    with pytest.raises(ValueError, match=why):
        c.decode(pa.array([json.dumps({"b": text}).encode()]))


def test_a_map_member_that_is_not_an_object_is_a_clear_error() -> None:
    c = codec("m MAP<STRING, INT>")
    with pytest.raises(ValueError, match="expected a JSON object for a map"):
        c.decode(pa.array([b'{"m": [["a", 1]]}']))


def test_maps_with_keys_json_cannot_hold_are_refused_when_the_schema_is_given() -> None:
    with pytest.raises(SchemaError, match="cast the map's keys to string"):
        codec("s STRUCT<m: MAP<INT, STRING>>")


# ------------------------------------------------------------------ arrow


def ipc_stream(table: pa.Table) -> bytes:
    """A value as any Arrow writer would store it: one IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_each_arrow_value_is_a_stream_any_arrow_reader_reads_alone() -> None:
    c = codec(fmt="arrow")
    rows = [full_row(i) for i in range(5)]
    stored = c.encode(pa.RecordBatch.from_pylist(rows, schema=c.arrow))
    for i, value in enumerate(stored.to_pylist()):
        alone = pa.ipc.open_stream(value).read_all()
        assert repr(alone.to_pylist()) == repr(pa.Table.from_pylist([rows[i]], c.arrow).to_pylist())


def test_arrow_values_of_other_writers_and_schemas_decode_in_their_order() -> None:
    c = codec("name STRING, age BIGINT", fmt="arrow")
    ours = c.encode(
        pa.RecordBatch.from_pylist([{"name": "a", "age": 1}, {"name": "b", "age": 2}], c.arrow)
    )
    narrower = ipc_stream(pa.table({"age": pa.array([3], pa.int32()), "name": ["c"]}))
    wider = ipc_stream(pa.table({"name": ["d"], "age": [4], "extra": [True]}))
    values = pa.array([ours[0].as_py(), narrower, wider, ours[1].as_py(), narrower, None])
    decoded = pa.Table.from_arrays(c.decode(values), schema=c.arrow).to_pylist()
    assert decoded == [
        {"name": "a", "age": 1},
        {"name": "c", "age": 3},
        {"name": "d", "age": 4},
        {"name": "b", "age": 2},
        {"name": "c", "age": 3},
        {"name": None, "age": None},
    ]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"not arrow at all", "not an Arrow IPC stream"),
        (ipc_stream(pa.table({"name": ["x", "y"], "age": [1, 2]})), "one batch of one row"),
        (ipc_stream(pa.table({"name": ["x"]})), r"no column\(s\) \['age'\]"),
        (ipc_stream(pa.table({"name": ["x"], "age": ["old"]})), "do not cast"),
    ],
    ids=["not-ipc", "two-rows", "missing-column", "uncastable"],
)
def test_a_value_that_is_not_one_arrow_row_is_a_clear_error(value: bytes, why: str) -> None:
    c = codec("name STRING, age BIGINT", fmt="arrow")
    good = c.encode(pa.RecordBatch.from_pylist([{"name": "a", "age": 1}], c.arrow))[0].as_py()
    with pytest.raises(NotArrowValue, match=why):
        c.decode(pa.array([good, value]))


NESTED = (
    "tags ARRAY<STRING>, m MAP<STRING, ARRAY<INT>>, s STRUCT<x: MAP<STRING, INT>, y: INT>, "
    "grid ARRAY<ARRAY<STRING>>"
)


def _nested_row(rng: random.Random) -> dict[str, object]:
    def some(make: object, most: int = 40) -> object:
        """None, empty, or up to `most` items: every shape at every depth."""
        kind = rng.random()
        if kind < 0.15:
            return None
        return [make() for _ in range(0 if kind < 0.3 else rng.randint(1, most))]  # type: ignore[operator]

    return {
        "tags": some(lambda: "t" * rng.randint(0, 30)),
        "m": some(lambda: (f"k{rng.random()}", some(lambda: rng.randint(0, 9)))),
        "s": None if rng.random() < 0.1 else {"x": some(lambda: (f"x{rng.random()}", 1)), "y": 2},
        "grid": some(lambda: some(lambda: "g" * 20)),
    }


def test_an_arrow_value_of_nested_lists_holds_only_its_own_row() -> None:
    """Rows with empty or null lists or maps at any depth among rows with long ones:
    each value reads alone as its row and is no larger than its row written alone."""
    c = codec(NESTED, fmt="arrow")
    rng = random.Random(5)
    rows = [_nested_row(rng) for _ in range(400)]
    batch = pa.RecordBatch.from_pylist(rows, schema=c.arrow)
    stored = c.encode(batch).to_pylist()
    for i, value in enumerate(stored):
        alone = pa.ipc.open_stream(value).read_all()
        assert alone.to_pylist() == pa.Table.from_batches([batch.slice(i, 1)]).to_pylist()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch.take([i]))
        assert len(value) <= len(sink.getvalue()), f"row {i} carries more than its own data"
    assert pa.Table.from_arrays(c.decode(pa.array(stored)), schema=c.arrow).equals(
        pa.Table.from_batches([batch])
    )


def test_a_batch_is_written_as_one_stream_whatever_its_lists_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    streams = []
    write_stream = arrow_values.ipc_buffer
    monkeypatch.setattr(
        arrow_values, "ipc_buffer", lambda *a, **k: streams.append(1) or write_stream(*a, **k)
    )
    c = codec(NESTED, fmt="arrow")
    full = {"tags": ["a"], "m": [("k", [1])], "s": {"x": [("x", 1)], "y": 1}, "grid": [["g"]]}
    empty = {"tags": ["a"], "m": [("k", [])], "s": {"x": [("x", 1)], "y": 1}, "grid": [["g"]]}
    rows = [full] * 1000 + [empty] * 3 + [full]
    stored = c.encode(pa.RecordBatch.from_pylist(rows, schema=c.arrow))
    assert len(streams) == 1
    assert pa.Table.from_arrays(c.decode(stored), schema=c.arrow).to_pylist() == rows


def test_an_arrow_value_holds_only_its_own_row_when_its_list_is_empty() -> None:
    # A one-row slice whose list is empty makes pyarrow's IPC writer write the list's
    # whole child data; every value would then carry the rows of its whole batch.
    c = codec("tags ARRAY<STRING>, m MAP<STRING, INT>", fmt="arrow")
    rows = [{"tags": ["x" * 100] * (i % 2), "m": [("k", i)] * (i % 2)} for i in range(2000)]
    stored = c.encode(pa.RecordBatch.from_pylist(rows, schema=c.arrow))
    assert max(len(v) for v in stored.to_pylist()) < 2000
    assert pa.Table.from_arrays(c.decode(stored), schema=c.arrow).to_pylist() == [
        {"tags": r["tags"], "m": r["m"]} for r in rows
    ]
