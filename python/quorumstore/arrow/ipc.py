"""Arrow IPC streams as quorumstore carries them: one schema, then record batches.

WAL entries, snapshot chunks, the data service, `quorumstore.Client`'s bulk paths and
Arrow-encoded values all read and write these, so they share the one encoding here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pyarrow as pa

#: Written explicitly: left unset, pyarrow reads two environment variables per writer,
#: and what goes to the WAL and the wire must not depend on the environment anyway.
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()


class NotIpcStream(ValueError):
    """Bytes that are not one whole Arrow IPC stream. pyarrow raises ArrowInvalid for
    most damage, OSError for a stream cut inside a message body, other ArrowExceptions
    for the rest (a type it does not know, a compressed buffer whose stated size cannot
    be allocated), and UnicodeDecodeError for a field name that is not UTF-8; callers
    that turn bad input into a clear error catch this one instead."""


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
    """The table in an IPC stream, whose field names are UTF-8: pyarrow decodes a name
    only when it is read, so a table with one that is not would fail wherever used."""
    with _reading():
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        _field_names(table.schema)
        return table


def ipc_batches(data: bytes) -> list[pa.RecordBatch]:
    """The record batches of an IPC stream, empty ones included."""
    with _reading():
        return list(pa.ipc.open_stream(pa.py_buffer(data)))


def _field_names(fields: Iterable[pa.Field]) -> list[str]:
    """The names of `fields` and of the fields nested in their types, each decoded
    (UnicodeDecodeError if one is not UTF-8)."""
    names = []
    for field in fields:
        names.append(field.name)
        nested = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        names += _field_names(nested.field(i) for i in range(nested.num_fields))
    return names


@contextmanager
def _reading() -> Iterator[None]:
    try:
        yield
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        raise NotIpcStream(str(e)) from e
