"""Pieces of a staged write, kept in the replicated KV until one entry publishes them.

One shard's part of a Spark job can be larger than one entry may be (an entry travels
to each follower in one gRPC message). The leader then replicates the part as PIECES,
entries that every replica keeps here without applying them, and publishes them with
one small entry whose apply applies them all in the KV write of that one entry
(`write_batch.Staging`). So readers see none of the part, then all of it, on every
replica; and the pieces survive crashes, elections and snapshots like any state.

    key   INTERNAL_PREFIX + b"staged/" + stage + b"/" + piece number (4 bytes, big-endian)
    value timestamp_ms (8 bytes, little-endian) + the piece entry's payload

A stage is named "<write id>/<attempt>": each publish attempt stages under its own
name, so a retried publish never applies another attempt's pieces, and discarding a
write (its name is a prefix of its stages') drops every attempt's pieces at once.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from quorumstore.storage.keys import INTERNAL_PREFIX
from quorumstore.storage.kv import KvReader
from quorumstore.storage.write_batch import decode_batch

_PREFIX = INTERNAL_PREFIX + b"staged/"
_END = INTERNAL_PREFIX + b"staged0"  # b"0" follows b"/": the end of the prefix
_PIECE = struct.Struct(">I")
_TIMESTAMP = struct.Struct("<q")


def piece_key(stage: str, number: int) -> bytes:
    return _PREFIX + stage.encode() + b"/" + _PIECE.pack(number)


def piece_record(timestamp_ms: int, payload: bytes) -> bytes:
    return _TIMESTAMP.pack(timestamp_ms) + payload


def name_range(name: str) -> tuple[bytes, bytes]:
    """The keys of stage `name`'s pieces, or of every stage of write `name`."""
    prefix = _PREFIX + name.encode()
    return prefix + b"/", prefix + b"0"


def read_pieces(kv: KvReader, stage: str) -> list[pa.RecordBatch]:
    """Stage `stage`'s pieces in piece order, as batches without schema metadata."""
    return [
        decode_batch(value[_TIMESTAMP.size :]).replace_schema_metadata(None)
        for _, value in kv.scan(*name_range(stage))
    ]


def has_pieces(kv: KvReader, write_id: str) -> bool:
    """Whether write `write_id` has pieces kept here."""
    start, end = name_range(write_id)
    item = kv.seek_ge(start)
    return item is not None and item[0] < end


def writes_staged_before(kv: KvReader, timestamp_ms: int) -> list[str]:
    """Ids of the writes whose first kept piece was staged before `timestamp_ms`."""
    found = []
    item = kv.seek_ge(_PREFIX)
    while item is not None and item[0] < _END:
        write_id = item[0][len(_PREFIX) :].split(b"/", 1)[0].decode()
        if _TIMESTAMP.unpack_from(item[1])[0] < timestamp_ms:
            found.append(write_id)
        item = kv.seek_ge(name_range(write_id)[1])
    return found
