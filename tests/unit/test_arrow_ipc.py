"""The one IPC stream encoding of WAL entries, snapshot chunks and the data service."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quorumstore.arrow.ipc import NotIpcStream, ipc_batches, ipc_bytes, read_ipc

SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary())], metadata={b"m": b"1"})


def _batch(keys: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(keys), pa.array([k.encode() for k in keys], pa.binary())], schema=SCHEMA
    )


def test_a_batch_round_trips_with_its_schema_metadata() -> None:
    batch = _batch(["/a", "/b/c", ""])
    table = read_ipc(ipc_bytes(batch))
    assert table.schema.equals(SCHEMA, check_metadata=True)
    assert table.to_batches()[0].equals(batch)


def test_a_table_keeps_its_batches_empty_ones_included() -> None:
    table = pa.Table.from_batches([_batch(["/a"]), _batch([]), _batch(["/b", "/c"])])
    batches = ipc_batches(ipc_bytes(table))
    assert [b.num_rows for b in batches] == [1, 0, 2]
    assert pa.Table.from_batches(batches).equals(table)


@pytest.mark.parametrize("cut", [0, 20, 40])
def test_bytes_that_are_no_whole_stream_raise_one_error(cut: int) -> None:
    """pyarrow raises ArrowInvalid for junk and OSError for a stream cut in a body."""
    whole = ipc_bytes(_batch(["/a"]))
    damaged = whole[: len(whole) - cut] if cut else b"not an arrow stream"
    for read in (read_ipc, ipc_batches):
        with pytest.raises(NotIpcStream):
            read(damaged)
