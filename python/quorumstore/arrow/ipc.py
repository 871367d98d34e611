"""Arrow IPC streams as quorumstore carries them: one schema, then record batches.

WAL entries, snapshot chunks, the data service, `quorumstore.Client`'s bulk paths and
Arrow-encoded values all read and write these, so they share the one encoding here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

#: Written explicitly: left unset, pyarrow reads two environment variables per writer,
#: and what goes to the WAL and the wire must not depend on the environment anyway.
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()


class NotIpcStream(ValueError):
    """Bytes that are not one whole Arrow IPC stream. pyarrow raises ArrowInvalid for
    some damage and OSError for a stream cut inside a message body; callers that turn
    bad input into a clear error catch this one instead."""


def ipc_buffer(data: pa.Table | pa.RecordBatch, max_chunksize: int | None = None) -> pa.Buffer:
    """An IPC stream holding `data`, schema included, in batches of at most
    `max_chunksize` rows if given (a table's own batches otherwise)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema, options=_WRITE_OPTIONS) as writer:
        if isinstance(data, pa.Table):
            writer.write_table(data, max_chunksize=max_chunksize)
        else:
            writer.write_batch(data)
    return sink.getvalue()


def ipc_bytes(data: pa.Table | pa.RecordBatch) -> bytes:
    """`ipc_buffer` as bytes, what protobuf messages and the WAL carry."""
    return ipc_buffer(data).to_pybytes()


def read_ipc(data: bytes) -> pa.Table:
    """The table in an IPC stream."""
    with _reading():
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def ipc_batches(data: bytes) -> list[pa.RecordBatch]:
    """The record batches of an IPC stream, empty ones included."""
    with _reading():
        return list(pa.ipc.open_stream(pa.py_buffer(data)))


@contextmanager
def _reading() -> Iterator[None]:
    try:
        yield
    except (pa.ArrowInvalid, OSError) as e:
        raise NotIpcStream(str(e)) from e
