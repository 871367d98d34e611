"""Values stored as Arrow IPC streams (``valueFormat arrow``): each value is one stream
holding the value columns' schema message, a one-row record batch and the end marker.

A stream per value makes every value self-describing, but writing or reading one stream
per value costs tens of microseconds. Both directions therefore work on whole columns:
`encode` writes all rows as one stream of one-row batches (pyarrow's own loop) and cuts
it into per-value streams (a row holding an empty or null list or map goes in that
stream as a batch of its own: see `encode`); `decode` joins the values that share a schema message into
one stream (their schema once, their batches in order) and reads it in one call. The
bytes are cut and joined by Arrow compute kernels, not per value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow import binary
from quorumstore.arrow.ipc import NotIpcStream, ipc_buffer, read_ipc
from quorumstore.spark.arrow_types import holds

#: The IPC stream's end marker: a continuation token and a zero metadata length.
_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_CONTINUATION = b"\xff\xff\xff\xff"


class NotArrowValue(ValueError):
    """A stored value is not an Arrow IPC stream of one row."""


def _is_list_or_map(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_map(t)


def _holds_an_empty_list(array: pa.Array) -> np.ndarray:
    """Per row: whether it holds, at any depth, a list or map that is empty or null."""
    t = array.type
    flags = np.zeros(len(array), bool)
    if not holds(t, _is_list_or_map):
        return flags
    if pa.types.is_struct(t):
        for field in array.flatten():  # a null struct's fields are null
            flags |= _holds_an_empty_list(field)
        return flags
    # A row's child values are values[offsets[row]:offsets[row + 1]].
    offsets = array.offsets.to_numpy()
    flags |= (offsets[1:] == offsets[:-1]) | array.is_null().to_numpy(zero_copy_only=False)
    if holds(array.values.type, _is_list_or_map):
        inner = np.concatenate([[0], np.cumsum(_holds_an_empty_list(array.values))])
        flags |= inner[offsets[1:]] > inner[offsets[:-1]]
    return flags


def encode(columns: pa.RecordBatch) -> pa.Array:
    """Each row of `columns` (at least one) as one Arrow IPC stream (binary)."""
    # pyarrow's IPC writer writes more than a row's own child data for a one-row slice
    # whose list or map is empty or null (a zero-length slice of the child: the whole
    # child, in some versions), so such rows are first copied out each into a batch of
    # its own, which the writer then writes whole: a value holds only its own row.
    alone = np.zeros(columns.num_rows, bool)
    for column in columns.columns:
        alone |= _holds_an_empty_list(column)
    if not alone.any():
        return _one_stream_cut(pa.Table.from_batches([columns]))
    rows_alone, rows_together = np.flatnonzero(alone), np.flatnonzero(~alone)
    batches = [columns.take([row]) for row in rows_alone]
    if len(rows_together):
        batches.append(columns.take(rows_together))
    order = np.argsort(np.concatenate([rows_alone, rows_together]))
    return _one_stream_cut(pa.Table.from_batches(batches)).take(pa.array(order))


def _one_stream_cut(rows: pa.Table) -> pa.Array:
    """Each row as one stream, cut out of one stream of one-row batches."""
    n = rows.num_rows
    stream = ipc_buffer(rows, max_chunksize=1)
    reader = pa.BufferReader(stream)
    pa.ipc.read_message(reader)
    bounds = np.empty(n + 1, np.int64)
    bounds[0] = reader.tell()
    for row in range(n):  # a batch's size is only in its message header
        pa.ipc.read_message(reader)
        bounds[row + 1] = reader.tell()
    batches = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(bounds.astype(np.int32)), stream]
    )
    schema_message = stream.to_pybytes()[: bounds[0]]
    return pc.binary_join_element_wise(
        pa.scalar(schema_message, pa.binary()), batches, pa.scalar(_END, pa.binary()), b""
    )


def _schema_message(value: bytes) -> bytes:
    """The schema message a value starts with (continuation, length, metadata)."""
    if len(value) < 8 or not value.startswith(_CONTINUATION):
        raise NotArrowValue("a value is not an Arrow IPC stream (valueFormat arrow)")
    length = int.from_bytes(value[4:8], "little", signed=True)
    if length <= 0 or 8 + length + len(_END) > len(value):
        raise NotArrowValue("a value is not an Arrow IPC stream (valueFormat arrow)")
    return value[: 8 + length]


def _read_group(values: pa.Array, schema_message: bytes) -> pa.Table:
    """`values`, which share `schema_message`, read as one stream: one row per value."""
    batches = pc.binary_slice(values, len(schema_message), -len(_END))
    if pc.any(pc.equal(pc.binary_length(batches), 0)).as_py():
        raise NotArrowValue("an Arrow value holds no record batch; it must hold one row")
    stream = b"".join([schema_message, binary.data(batches), _END])  # three pieces
    try:
        table = read_ipc(stream)
    except NotIpcStream as e:
        raise NotArrowValue(
            f"a value is not an Arrow IPC stream (valueFormat arrow): {e}"
        ) from None
    chunks = table.column(0).chunks if table.num_columns else []
    rows_per_value = np.fromiter((len(c) for c in chunks), np.int64, len(chunks))
    if len(chunks) != len(values) or np.any(rows_per_value != 1):
        raise NotArrowValue(
            f"{len(values)} Arrow values hold {table.num_rows} rows in {len(chunks)} batches; "
            "each value must hold one batch of one row"
        )
    return table.combine_chunks()


def decode(values: pa.Array, schema: pa.Schema) -> list[pa.Array]:
    """Non-null Arrow IPC values (at least one) -> one array per field of `schema`, row for row.

    Values written with another schema (other columns, more of them, wider types) are
    read in their own group and cast; a missing column is an error.
    """
    values = values.cast(pa.binary())
    pending = pa.array(np.arange(len(values), dtype=np.int64))
    rest = values
    groups: list[tuple[pa.Array, pa.Table]] = []
    while len(rest):
        message = _schema_message(rest[0].as_py())
        same = pc.and_(
            pc.equal(pc.binary_slice(rest, 0, len(message)), pa.scalar(message, pa.binary())),
            pc.equal(pc.binary_slice(rest, -len(_END)), pa.scalar(_END, pa.binary())),
        )
        if not same[0].as_py():
            raise NotArrowValue("a value is not an Arrow IPC stream (valueFormat arrow)")
        table = _read_group(rest.filter(same), message)
        missing = [name for name in schema.names if name not in table.column_names]
        if missing:
            raise NotArrowValue(
                f"an Arrow value has no column(s) {missing}; it has {table.column_names}"
            )
        try:
            table = table.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise NotArrowValue(f"Arrow values do not cast to {schema}: {e}") from None
        groups.append((pending.filter(same), table))
        pending = pending.filter(pc.invert(same))
        rest = rest.filter(pc.invert(same))
    if len(groups) == 1:
        return [column.combine_chunks() for column in groups[0][1].columns]
    order = pc.sort_indices(pa.concat_arrays([rows for rows, _ in groups]))
    table = pa.concat_tables([t for _, t in groups]).take(order)
    return [column.combine_chunks() for column in table.columns]
