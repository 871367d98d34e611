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


def test_a_field_name_that_is_not_utf8_makes_no_stream() -> None:
    """pyarrow reads such a table and fails only where a name is read (found by fuzzing
    the data service): a nested one too."""
    table = pa.table({"kx": [1], "s": pa.array([{"nx": 1}])})
    for name in (b"kx", b"nx"):
        damaged = ipc_bytes(table).replace(name, name[:1] + b"\xd7")
        with pytest.raises(NotIpcStream):
            read_ipc(damaged)


def test_a_compressed_buffer_too_large_to_allocate_makes_no_stream() -> None:
    """A buffer's stated size, which its reader allocates, is the sender's word (found by
    fuzzing the data service): pyarrow's MemoryError counts as damage too."""
    table = pa.table({"v": pa.array([b"a" * 1000], pa.binary())})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    stated = (1000).to_bytes(8, "little")
    damaged = sink.getvalue().to_pybytes().replace(stated, (1 << 60).to_bytes(8, "little"))
    for read in (read_ipc, ipc_batches):
        with pytest.raises(NotIpcStream):
            read(damaged)
