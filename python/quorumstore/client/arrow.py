"""Bulk paths: `put_many` and `scan` move Arrow record batches, not keys one by one.

Both use quorumstore's data service (`proto/quorumstore_data.proto`), served by every
node next to Oxia's protocol:

- `put_many` hashes the keys once, splits the columns per shard with Arrow kernels
  and sends each shard's rows as Arrow IPC in `WriteArrow` calls of at most
  `BULK_BATCH_ROWS` rows / about `BULK_BATCH_BYTES` each. Every call is ONE
  replicated entry, exactly-once on the shard's lanes like any write batch.
- `scan` asks every shard for `ScanArrow` (one KV snapshot per shard, so a shard's
  part never shows half a write batch) and merges the shards' tables in hierarchical
  key order with one sort on the encoded keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.client.routing import ShardMap
from quorumstore.wire.keys import INDEX_ORDER_SEPARATOR, encode_keys
from quorumstore.wire.schemas import INDEX_SCAN_SCHEMA, ROWS_SCHEMA, SCAN_SCHEMA

#: Rows and (about) bytes of one `WriteArrow` call of `put_many`.
BULK_BATCH_ROWS = 65536
BULK_BATCH_BYTES = 8 << 20

#: What `put_many` accepts: a table or record batch with `key` and `value` columns,
#: a mapping of key to value, or a (keys, values) pair of sequences or Arrow arrays.
PutManyData: TypeAlias = (
    pa.Table
    | pa.RecordBatch
    | Mapping[str, bytes]
    | tuple[
        pa.Array | pa.ChunkedArray | Sequence[str], pa.Array | pa.ChunkedArray | Sequence[bytes]
    ]
)


def _array(column: object, kind: pa.DataType, name: str) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    try:
        array = column if isinstance(column, pa.Array) else pa.array(column, kind)
        array = array.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise TypeError(f"put_many: the {name} column must convert to {kind}: {e}") from None
    if array.null_count:
        raise ValueError(f"put_many: the {name} column holds {array.null_count} nulls")
    return array


def columns(data: PutManyData) -> tuple[pa.StringArray, pa.BinaryArray]:
    """The (keys, values) arrays of whatever `put_many` was given."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        if "key" not in data.schema.names or "value" not in data.schema.names:
            raise ValueError(
                f"put_many: the table has columns {data.schema.names}; it needs 'key' and 'value'"
            )
        keys_in, values_in = data.column("key"), data.column("value")
    elif isinstance(data, Mapping):
        keys_in, values_in = list(data.keys()), list(data.values())
    elif isinstance(data, tuple) and len(data) == 2:
        keys_in, values_in = data
    else:
        raise TypeError(
            "put_many takes a pyarrow Table or RecordBatch with 'key' and 'value' columns, "
            f"a mapping of key to value, or a (keys, values) pair; got {type(data).__name__}"
        )
    keys = _array(keys_in, pa.string(), "key")
    values = _array(values_in, pa.binary(), "value")
    if len(keys) != len(values):
        raise ValueError(f"put_many: {len(keys)} keys but {len(values)} values")
    if len(keys) and pc.min(pc.binary_length(keys)).as_py() == 0:
        raise ValueError("put_many: a key is empty")
    return keys, values


def split_by_shard(
    keys: pa.StringArray, values: pa.BinaryArray, shards: ShardMap
) -> dict[int, pa.RecordBatch]:
    """Each shard's rows (ROWS_SCHEMA), in their original order."""
    rows = pa.RecordBatch.from_arrays([keys, values], schema=ROWS_SCHEMA)
    if len(shards.shards) == 1:
        return {shards.shards[0]: rows}
    ids = pa.array(shards.shards_for(keys.to_pylist()))
    return {shard: rows.filter(pc.equal(ids, shard)) for shard in pc.unique(ids).to_pylist()}


def row_batches(rows: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """`rows` in slices of at most BULK_BATCH_ROWS rows and about BULK_BATCH_BYTES."""
    per_row = max(1, rows.nbytes // max(rows.num_rows, 1))
    step = max(1, min(BULK_BATCH_ROWS, BULK_BATCH_BYTES // per_row))
    for start in range(0, rows.num_rows, step):
        yield rows.slice(start, step)


def merge_tables(tables: Sequence[pa.Table], *, by_index: bool = False) -> pa.Table:
    """One table of every shard's rows, in hierarchical key order; `by_index`: rows
    found through an index, in index order -- by secondary key, then primary key
    (`wire.keys.index_order`, column-wise)."""
    if not tables:
        return (INDEX_SCAN_SCHEMA if by_index else SCAN_SCHEMA).empty_table()
    table = pa.concat_tables(tables).combine_chunks()
    if len(tables) == 1:
        return table
    order_keys = encode_keys(table.column("key").combine_chunks())
    if by_index:
        order_keys = pc.binary_join_element_wise(
            encode_keys(table.column("secondary_key").combine_chunks()),
            order_keys,
            INDEX_ORDER_SEPARATOR,
        )
    return table.take(pc.sort_indices(order_keys))
