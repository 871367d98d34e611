"""What applying an entry answers, per op, and the compact form a client's latest
exactly-once serial keeps of it (see "Exactly-once serials" in docs/protocol.md)."""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from quorumstore.storage.records import Record, decode_record, encode_record_head, packed_dtype


class Status(enum.IntEnum):
    """Oxia's client.proto `Status`, and INVALID_OP."""

    OK = 0
    KEY_NOT_FOUND = 1
    UNEXPECTED_VERSION_ID = 2
    SESSION_DOES_NOT_EXIST = 3
    #: quorumstore's own: an op the apply cannot apply (an unknown op code, a string
    #: that is not UTF-8, a null where a value is needed), so it changed nothing. Oxia
    #: has no such status: the write's RPC answers INVALID_ARGUMENT.
    INVALID_OP = 4


class OpResult(NamedTuple):
    """One op's outcome. A NamedTuple, as `Record` is: the apply loop makes one per op,
    and a frozen dataclass took twice as long to build."""

    status: Status
    #: The record a put wrote. Only its version fields are the result: the results
    #: stored for an exactly-once retry (`encode_results`) keep no value.
    version: Record | None = None
    #: The key a put wrote when the shard chose it (sequence keys).
    key: str | None = None
    #: The id of a session the op created.
    session_id: int | None = None


OK = OpResult(Status.OK)
KEY_NOT_FOUND = OpResult(Status.KEY_NOT_FOUND)
UNEXPECTED_VERSION_ID = OpResult(Status.UNEXPECTED_VERSION_ID)
SESSION_DOES_NOT_EXIST = OpResult(Status.SESSION_DOES_NOT_EXIST)
INVALID_OP = OpResult(Status.INVALID_OP)


@dataclass(frozen=True, slots=True)
class EntryResult:
    offset: int
    results: Sequence[OpResult]
    #: True when the entry repeated an exactly-once serial already applied: nothing
    #: changed, and `results` are the original write's (empty for an older serial).
    duplicate: bool = False
    #: Why a publish changed nothing (its pieces were discarded first); else None.
    refused: str | None = None
    #: Why the entry could not be applied at all (then `results` is empty), or which
    #: of its ops could not (the first INVALID_OP); else None. Made from the entry's
    #: bytes alone, so every replica says the same; never stored.
    invalid: str | None = None


#: (field, struct format code) of each stored result's header, little-endian.
RESULT_LAYOUT = (("status", "B"), ("flags", "B"), ("length", "I"))
_RESULT = struct.Struct("<" + "".join(code for _, code in RESULT_LAYOUT))
#: The result header as numpy records, for the columnar apply's results.
RESULT_DTYPE = packed_dtype(RESULT_LAYOUT)
assert RESULT_DTYPE.itemsize == _RESULT.size

COUNTER = struct.Struct("<q")
RESULT_RECORD, RESULT_KEY, RESULT_SESSION = 1, 2, 4
_NO_HEADS: Mapping[int, bytes] = MappingProxyType({})


def encode_results(results: Sequence[OpResult], heads: Mapping[int, bytes] = _NO_HEADS) -> bytes:
    """Compact bytes of per-op results, kept with a client's latest serial.

    Per result: the header, the record without its value (a write's response carries
    the version, never the value, so storing it would write every value twice), then
    (when flagged) the key's length and UTF-8 bytes and the session id. `heads` maps
    `id(record)` to the record's encoded head where the caller has it already (the
    apply loop encodes every put's; encoding it again was a tenth of a 64-put apply).
    """
    parts = [COUNTER.pack(len(results))]
    for r in results:
        record = (
            b"" if r.version is None else heads.get(id(r.version)) or encode_record_head(r.version)
        )
        flags = (
            (RESULT_RECORD if r.version is not None else 0)
            | (RESULT_KEY if r.key is not None else 0)
            | (RESULT_SESSION if r.session_id is not None else 0)
        )
        parts.append(_RESULT.pack(r.status, flags, len(record)))
        parts.append(record)
        if r.key is not None:
            key = r.key.encode()
            parts += [COUNTER.pack(len(key)), key]
        if r.session_id is not None:
            parts.append(COUNTER.pack(r.session_id))
    return b"".join(parts)


def decode_results(data: bytes) -> list[OpResult]:
    (count,) = COUNTER.unpack_from(data)
    at = COUNTER.size
    out = []
    for _ in range(count):
        status, flags, length = _RESULT.unpack_from(data, at)
        at += _RESULT.size
        record = decode_record(data[at : at + length]) if flags & RESULT_RECORD else None
        at += length
        key = session_id = None
        if flags & RESULT_KEY:
            (size,) = COUNTER.unpack_from(data, at)
            at += COUNTER.size
            key = data[at : at + size].decode()
            at += size
        if flags & RESULT_SESSION:
            (session_id,) = COUNTER.unpack_from(data, at)
            at += COUNTER.size
        out.append(OpResult(Status(status), record, key, session_id))
    return out
