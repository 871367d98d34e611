"""Recognises the common Oxia write -- puts that set a key and a value and nothing else.

Such a write is checked and encoded column by column (`puts_batch`) instead of op by
op. Telling it apart must itself stay off the per-op path: asking each put which
fields it sets (`ListFields`) costs ~1.5 µs per put, which for a 64-put batch was a
quarter of the leader's work before replication.

The test here is by size instead. Every field a put sets beyond its key and value
adds at least two bytes to its encoding (a tag and a payload byte), as does any
unknown field. So a request with no deletes and no range deletes holds plain puts
exactly when its encoded size, which protobuf computes in C, equals the size its keys
and values alone encode to. For a large request that size comes from the Arrow
arrays' offsets, in numpy, with no Python loop over the puts. A small one (most
requests of Oxia's own clients hold one put) is measured by building its key-and-value
copy and asking protobuf: numpy's fixed cost per call made the arithmetic ~75 µs for a
one-put request, the copy ~20 µs; they cost the same at about 50 puts.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from quorumstore import arrow_binary
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.protobuf_columns import varint_sizes

# One byte per tag: the fields involved are numbered below 16.
assert pb.PutRequest.KEY_FIELD_NUMBER < 16 and pb.PutRequest.VALUE_FIELD_NUMBER < 16
assert pb.WriteRequest.PUTS_FIELD_NUMBER < 16
_TAG_BYTES = 1


class PlainPuts(NamedTuple):
    """The keys and values of a write of plain puts, in request order."""

    keys: pa.StringArray
    values: pa.BinaryArray
    #: UTF-8 size of the shortest and the longest key, size of the largest value (0: no puts).
    shortest_key_bytes: int
    longest_key_bytes: int
    largest_value_bytes: int


def _field_bytes(lengths: np.ndarray) -> np.ndarray:
    """Encoded size of a length-delimited proto3 field of each length (0: not encoded)."""
    return (lengths > 0) * (_TAG_BYTES + varint_sizes(lengths) + lengths)


#: Requests with at most this many puts are measured by their key-and-value copy.
SMALL_REQUEST_PUTS = 32


def plain_puts(request: pb.WriteRequest) -> PlainPuts | None:
    """The request's plain puts, or None if it holds anything else (see the module doc)."""
    if request.deletes or request.delete_ranges:
        return None
    puts = request.puts
    if len(puts) <= SMALL_REQUEST_PUTS:
        return _small_plain_puts(request)
    keys = pa.array([put.key for put in puts], pa.string())
    values = pa.array([put.value for put in puts], pa.binary())
    key_bytes, value_bytes = arrow_binary.lengths(keys), arrow_binary.lengths(values)
    put_bytes = _field_bytes(key_bytes) + _field_bytes(value_bytes)
    expected = int((_TAG_BYTES + varint_sizes(put_bytes) + put_bytes).sum(dtype=np.int64))
    if request.HasField("shard"):
        expected += pb.WriteRequest(shard=request.shard).ByteSize()
    if request.ByteSize() != expected:
        return None
    if not len(keys):
        return PlainPuts(keys, values, 0, 0, 0)
    return PlainPuts(
        keys, values, int(key_bytes.min()), int(key_bytes.max()), int(value_bytes.max())
    )


def _small_plain_puts(request: pb.WriteRequest) -> PlainPuts | None:
    keys = [put.key for put in request.puts]
    values = [put.value for put in request.puts]
    copy = pb.WriteRequest(puts=[pb.PutRequest(key=k, value=v) for k, v in zip(keys, values)])
    if request.HasField("shard"):
        copy.shard = request.shard
    if request.ByteSize() != copy.ByteSize():
        return None
    key_bytes = [len(key.encode()) for key in keys]
    return PlainPuts(
        pa.array(keys, pa.string()),
        pa.array(values, pa.binary()),
        min(key_bytes, default=0),
        max(key_bytes, default=0),
        max(map(len, values), default=0),
    )
