"""The stored form of a user key's value: a fixed header, optional strings, the value.

The header holds version_id, modifications_count, created_ms, modified_ms, session_id
(-1: none), flags, then the lengths of client_identity and partition_key, whose bytes
follow it, then the value. Both lengths sit at fixed offsets, so a whole Arrow array of
records decodes with kernels (`record_headers`). `HEADER_LAYOUT` is the one definition
of the header: the struct for single records and the numpy dtype for arrays of them
are both built from it.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: (field, struct format code) of each header field, in stored order, little-endian.
HEADER_LAYOUT = (
    ("version_id", "q"),
    ("modifications_count", "q"),
    ("created_ms", "q"),
    ("modified_ms", "q"),
    ("session_id", "q"),
    ("flags", "B"),
    ("client_identity_length", "I"),
    ("partition_key_length", "I"),
)


def packed_dtype(layout: tuple[tuple[str, str], ...]) -> np.dtype:
    """The numpy record type of a little-endian struct layout, packed as `struct` packs it."""
    return np.dtype([(name, "<" + code) for name, code in layout])


HEADER = struct.Struct("<" + "".join(code for _, code in HEADER_LAYOUT))
#: The header as numpy records, for arrays of records.
HEADER_DTYPE = packed_dtype(HEADER_LAYOUT)
assert HEADER_DTYPE.itemsize == HEADER.size

HAS_CLIENT_IDENTITY = 1
HAS_PARTITION_KEY = 2
_HAS_STRINGS = HAS_CLIENT_IDENTITY | HAS_PARTITION_KEY
#: The record has secondary index entries (kept by `secondary_indexes`).
HAS_INDEXES = 4
NO_SESSION = -1


class Record(NamedTuple):
    """A stored value with its version: what a get or a successful put returns.

    A NamedTuple rather than a frozen dataclass: as immutable, and several times
    cheaper to build in the per-op apply loop.
    """

    value: bytes
    version_id: int
    modifications_count: int
    created_ms: int
    modified_ms: int
    session_id: int | None = None
    client_identity: str | None = None
    partition_key: str | None = None
    #: Whether secondary index entries point at the record.
    indexed: bool = False


def encode_record(record: Record) -> bytes:
    return encode_record_head(record) + record.value


def encode_record_head(record: Record) -> bytes:
    """The stored form of `record` up to its value (what stored op results keep)."""
    flags = 0
    client_identity = partition_key = b""
    if record.client_identity is not None:
        flags |= HAS_CLIENT_IDENTITY
        client_identity = record.client_identity.encode()
    if record.partition_key is not None:
        flags |= HAS_PARTITION_KEY
        partition_key = record.partition_key.encode()
    if record.indexed:
        flags |= HAS_INDEXES
    header = HEADER.pack(
        record.version_id,
        record.modifications_count,
        record.created_ms,
        record.modified_ms,
        NO_SESSION if record.session_id is None else record.session_id,
        flags,
        len(client_identity),
        len(partition_key),
    )
    return header + client_identity + partition_key if flags & _HAS_STRINGS else header


def decode_record(data: bytes) -> Record:
    if len(data) < HEADER.size:
        raise ValueError(
            f"record of {len(data)} bytes is shorter than its {HEADER.size}-byte header"
        )
    version_id, mods, created, modified, session, flags, ci_len, pk_len = HEADER.unpack_from(data)
    value_at = HEADER.size + ci_len + pk_len
    if len(data) < value_at:
        raise ValueError(
            f"record of {len(data)} bytes is truncated: its strings end at byte {value_at}"
        )
    ci_at = HEADER.size + ci_len
    return Record(
        value=data[value_at:],
        version_id=version_id,
        modifications_count=mods,
        created_ms=created,
        modified_ms=modified,
        session_id=None if session == NO_SESSION else session,
        client_identity=data[HEADER.size : ci_at].decode() if flags & HAS_CLIENT_IDENTITY else None,
        partition_key=data[ci_at:value_at].decode() if flags & HAS_PARTITION_KEY else None,
        indexed=bool(flags & HAS_INDEXES),
    )


def fixed_width_data(array: pa.Array, width: int) -> pa.Buffer:
    """The data buffer of a fixed-width array, from its first element (kernels may slice)."""
    return array.buffers()[1].slice(array.offset * width)


def record_headers(records: pa.BinaryArray) -> np.ndarray:
    """The header of every record (all at least HEADER.size bytes), as HEADER_DTYPE
    records viewing one copy of those bytes.

    The bytes are reinterpreted in place, so this relies on Arrow's native byte order
    being little-endian, as on every platform quorumstore runs on.
    """
    raw = pc.binary_slice(records, 0, HEADER.size).cast(pa.binary(HEADER.size))
    return np.frombuffer(fixed_width_data(raw, HEADER.size), HEADER_DTYPE, len(raw))
