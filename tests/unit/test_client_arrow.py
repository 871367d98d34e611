"""quorumstore.client.arrow: the column shapes put_many accepts, per-shard splits, merges."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from quorumstore.client import arrow
from quorumstore.client.routing import ShardAssignment, ShardMap
from quorumstore.wire.keys import compare_keys, encode_key
from quorumstore.wire.schemas import SCAN_SCHEMA

KEYS = [f"/k/{i}" for i in range(50)]
VALUES = [f"v{i}".encode() for i in range(50)]


@pytest.mark.parametrize(
    "data",
    [
        pa.table({"key": KEYS, "value": VALUES}),
        pa.RecordBatch.from_pydict({"value": VALUES, "key": KEYS, "extra": list(range(50))}),
        dict(zip(KEYS, VALUES)),
        (KEYS, VALUES),
        (pa.chunked_array([KEYS[:10], KEYS[10:]]), pa.array(VALUES)),
        (KEYS, [v.decode() for v in VALUES]),  # str values are stored UTF-8 encoded
    ],
)
def test_every_accepted_shape_gives_string_keys_and_binary_values(data: arrow.PutManyData) -> None:
    keys, values = arrow.columns(data)
    assert (keys.type, values.type) == (pa.string(), pa.binary())
    assert keys.to_pylist() == KEYS and values.to_pylist() == VALUES


@pytest.mark.parametrize(
    "data, error, message",
    [
        (pa.table({"k": KEYS, "value": VALUES}), ValueError, "needs 'key' and 'value'"),
        ((KEYS, VALUES[:3]), ValueError, "50 keys but 3 values"),
        (([*KEYS[:1], None], VALUES[:2]), ValueError, "key column holds 1 nulls"),
        ((["", "/a"], [b"", b""]), ValueError, "a key is empty"),
        (([1, 2], [b"", b""]), TypeError, "key column must convert to string"),
        (["/a"], TypeError, "got list"),
    ],
)
def test_bad_input_is_refused_before_anything_is_sent(
    data: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        arrow.columns(data)  # type: ignore[arg-type]


def test_rows_are_split_by_shard_in_their_original_order() -> None:
    shards = ShardMap(
        [ShardAssignment(0, "a:1", 0, 2**31 - 1), ShardAssignment(1, "b:1", 2**31, 2**32 - 1)]
    )
    keys, values = arrow.columns((KEYS, VALUES))
    parts = arrow.split_by_shard(keys, values, shards)
    assert set(parts) == {0, 1}
    for shard, rows in parts.items():
        assert rows.schema == arrow.ROWS_SCHEMA
        part_keys = rows.column("key").to_pylist()
        assert part_keys == [k for k in KEYS if shards.shard_for(k) == shard]
        assert rows.column("value").to_pylist() == [VALUES[KEYS.index(k)] for k in part_keys]


def test_row_batches_respect_the_row_and_byte_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrow, "BULK_BATCH_ROWS", 7)
    rows = pa.RecordBatch.from_arrays(
        [pa.array(KEYS), pa.array(VALUES, pa.binary())], schema=arrow.ROWS_SCHEMA
    )
    batches = list(arrow.row_batches(rows))
    assert [b.num_rows for b in batches] == [7] * 7 + [1]
    monkeypatch.setattr(arrow, "BULK_BATCH_BYTES", rows.nbytes // 5)
    assert len(list(arrow.row_batches(rows))) >= 5


def test_merged_shard_tables_are_in_hierarchical_key_order() -> None:
    def table(keys: list[str]) -> pa.Table:
        n = len(keys)
        return pa.table(
            [pa.array(keys), pa.array([b""] * n), *([pa.array(range(n), pa.int64())] * 4)],
            schema=SCAN_SCHEMA,
        )

    merged = arrow.merge_tables([table(["/a/z", "/b", "/a/b/c"]), table(["/a/b", "/c/d/e"])])
    keys = merged.column("key").to_pylist()
    assert keys == sorted(keys, key=encode_key)
    assert keys == ["/b", "/a/b", "/a/z", "/a/b/c", "/c/d/e"]
    assert all(compare_keys(a, b) < 0 for a, b in itertools.pairwise(keys))
    assert arrow.merge_tables([]).schema == SCAN_SCHEMA
