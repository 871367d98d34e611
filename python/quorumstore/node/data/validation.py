"""The checks of the data service's inputs: Arrow rows, key ranges."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow.ipc import NotIpcStream, read_ipc
from quorumstore.node.data.errors import invalid
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.wire.keys import compare_keys
from quorumstore.wire.schemas import ROWS_SCHEMA

#: Same limits as Oxia's client API (node/oxia/validation.py).
MAX_KEY_BYTES = 64 * 1024
MAX_VALUE_BYTES = 16 * 1024 * 1024


def read_rows(data: bytes, what: str) -> pa.Table:
    """The ROWS_SCHEMA table in an IPC stream; `Refused` (INVALID_ARGUMENT) if it is not one."""
    try:
        table = read_ipc(data)
    except NotIpcStream as e:
        raise invalid(f"{what} is not an Arrow IPC stream: {e}") from None
    missing = [f.name for f in ROWS_SCHEMA if f.name not in table.column_names]
    if missing:
        raise invalid(f"{what} has no column(s) {missing}; it has {table.column_names}")
    repeated = [name for name in ROWS_SCHEMA.names if table.column_names.count(name) > 1]
    if repeated:
        raise invalid(f"{what} has more than one column named {repeated}")
    table = table.select(ROWS_SCHEMA.names)
    for field in ROWS_SCHEMA:
        column = table.column(field.name)
        if column.type != field.type:
            raise invalid(f"{what}: column {field.name!r} is {column.type}, expected {field.type}")
        if column.null_count:
            raise invalid(f"{what}: column {field.name!r} holds {column.null_count} null(s)")
    try:
        table.validate(full=True)
    except pa.ArrowInvalid:
        raise invalid(f"{what}: {_malformed(table)}") from None
    return table.cast(ROWS_SCHEMA)


def _malformed(table: pa.Table) -> str:
    """What Arrow's full validation found wrong with rows of ROWS_SCHEMA's types."""
    keys = pa.chunked_array(
        [chunk.view(pa.binary()) for chunk in table.column("key").chunks], pa.binary()
    )
    try:
        keys.validate(full=True)
        table.column("value").validate(full=True)
    except pa.ArrowInvalid:
        return "the Arrow buffers are malformed (offsets out of order or out of bounds)"
    for row, key in enumerate(keys.to_pylist()):
        try:
            key.decode()
        except UnicodeDecodeError:
            return f"row {row}: the key is not valid UTF-8 (keys are strings)"
    return "the rows fail Arrow's full validation"


def check_rows(rows: pa.Table, unique_keys: bool) -> None:
    if rows.num_rows == 0:
        return
    keys, values = rows.column("key"), rows.column("value")
    key_bytes = pc.binary_length(keys.cast(pa.binary()))
    if pc.min(key_bytes).as_py() == 0:
        raise invalid(f"row {pc.index(key_bytes, 0).as_py()} has an empty key")
    longest_key = pc.max(key_bytes).as_py()
    if longest_key > MAX_KEY_BYTES:
        raise invalid(
            f"row {pc.index(key_bytes, longest_key).as_py()}: its key is {longest_key} bytes, "
            f"above the limit of {MAX_KEY_BYTES} bytes"
        )
    value_bytes = pc.binary_length(values)
    longest_value = pc.max(value_bytes).as_py()
    if longest_value > MAX_VALUE_BYTES:
        raise invalid(
            f"row {pc.index(value_bytes, longest_value).as_py()}: its value is {longest_value} "
            f"bytes, above the limit of {MAX_VALUE_BYTES} bytes"
        )
    if unique_keys:
        distinct = pc.count_distinct(keys).as_py()
        if distinct != rows.num_rows:
            raise invalid(
                f"{rows.num_rows - distinct} row(s) repeat a key of another row; "
                "each key may be written once per write"
            )


def check_range(min_inclusive: str, max_exclusive: str, what: str) -> None:
    if max_exclusive and compare_keys(min_inclusive, max_exclusive) > 0:
        raise invalid(
            f"{what}: {min_inclusive!r} sorts after {max_exclusive!r} in hierarchical key order"
        )


def key_ranges(request_ranges: Sequence[pb.KeyRange]) -> list[tuple[str, str]]:
    ranges = [(r.min_inclusive, r.max_exclusive) for r in request_ranges]
    for i, (low, high) in enumerate(ranges):
        check_range(low, high, f"ranges[{i}]")
    return ranges
