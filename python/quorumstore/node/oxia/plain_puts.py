"""Recognises the common Oxia write -- puts that set a key and a value and nothing else.

Such a write is checked and encoded column by column (`puts_batch`) instead of op by
op. Telling it apart must itself stay off the per-op path: asking each put which
fields it sets (`ListFields`) costs ~1.5 µs per put, and even reading each put's key
and value makes protobuf build a Python object per put, ~1 µs apiece for a request
just parsed.

So the request's bytes are parsed a second time, as columns (`oxia_write_columns.proto`):
protobuf's C parser merges all puts into one message, filling a list of keys and a list
of values in request order. Every other field a put sets, including a field unknown to
this version, is an unknown field of that merged message; a request holds plain puts
exactly when it has no deletes, no range deletes and the merged puts no unknown fields.
A put whose key or value is empty (proto3 does not encode it) leaves that column short;
then that column is read put by put.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
from google.protobuf.unknown_fields import UnknownFieldSet

from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto.oxia_write_columns_pb2 import WriteRequestColumns


class PlainPuts(NamedTuple):
    """The keys and values of a write of plain puts, in request order."""

    keys: pa.StringArray
    values: pa.BinaryArray
    #: UTF-8 size of the shortest and the longest key, size of the largest value (0: no puts).
    shortest_key_bytes: int
    longest_key_bytes: int
    largest_value_bytes: int


def plain_puts(request: pb.WriteRequest) -> PlainPuts | None:
    """The request's plain puts, or None if it holds anything else (see the module doc)."""
    if request.deletes or request.delete_ranges:
        return None
    # Serialized from the parsed request, so each put holds its key and its value once
    # at most: protobuf keeps the last of repeated occurrences of a singular field.
    columns = WriteRequestColumns.FromString(request.SerializeToString()).puts
    if len(UnknownFieldSet(columns)):
        return None
    puts = request.puts
    key_list = list(columns.key) if len(columns.key) == len(puts) else [p.key for p in puts]
    values = list(columns.value) if len(columns.value) == len(puts) else [p.value for p in puts]
    # Sizes by builtins over the lists, no Python code per put: numpy's fixed cost per
    # call would be most of the work for the one-put requests of Oxia's own clients.
    key_bytes = list(map(len, map(str.encode, key_list)))
    return PlainPuts(
        pa.array(key_list, pa.string()),
        pa.array(values, pa.binary()),
        min(key_bytes, default=0),
        max(key_bytes, default=0),
        max(map(len, values), default=0),
    )
