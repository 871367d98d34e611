"""Oxia's hierarchical key order, and the encoding that lets plain byte order reproduce it.

Oxia compares keys segment by segment on '/': at every level a key whose rest has
no further '/' sorts before any key whose rest has one, so "a/z" < "a/b/c" and
"b" < "a/c". Servers store keys in this order and clients merge shards' results in
it, so both sides share the encoding here. An ordered byte store (RocksDB, a
SortedDict) can only compare bytes, so each key is encoded as

    key "s0/s1/.../sn"  ->  0x02 esc(s0) 0x00 0x01  ...  0x02 esc(sn-1) 0x00 0x01  0x01 esc(sn)

where esc() doubles every 0x00 as 0x00 0xFF. The tag says whether a further level
follows (0x02) or this is the last segment (0x01); the terminator 0x00 0x01 sorts
below every escaped byte, so a segment that is a prefix of another sorts first.
Escaping the last segment too keeps 0x00 0x01 unambiguous, which is what lets whole
Arrow arrays be encoded and decoded with string kernels instead of a loop per key.

Encoded user keys start with 0x01 or 0x02, so a store keeps its own bookkeeping
below USER_KEYS_START, where no user key can reach. A secondary index orders its
entries by secondary key, then primary key (`index_order`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow import binary

#: Lowest possible encoded user key (the encoding of "").
USER_KEYS_START = b"\x01"
#: Strict upper bound of every encoded user key.
USER_KEYS_END = b"\x03"

_LAST = b"\x01"
_MORE = b"\x02"
_TERMINATOR = b"\x00\x01"
_NEXT_LEVEL = _TERMINATOR + _MORE  # replaces a '/' that is not the last one
_LAST_LEVEL = _TERMINATOR + _LAST  # replaces the last '/'
_ESCAPED_ZERO = b"\x00\xff"
#: decode_keys' replacements, in the order they must be made.
_DECODINGS = ((_NEXT_LEVEL, b"/"), (_LAST_LEVEL, b"/"), (_ESCAPED_ZERO, b"\x00"))
# Binary arrays longer than this cannot exist (int32 offsets); used as "to the end".
_MAX_LEN = 2**31 - 1


def compare_keys(a: str, b: str) -> int:
    """Oxia's CompareWithSlash on the UTF-8 bytes of `a` and `b`: -1, 0 or +1."""
    x, y = a.encode(), b.encode()
    while x and y:
        ix, iy = x.find(b"/"), y.find(b"/")
        if ix < 0 and iy < 0:
            return (x > y) - (x < y)
        if ix < 0:
            return -1
        if iy < 0:
            return 1
        sx, sy = x[:ix], y[:iy]
        if sx != sy:
            return -1 if sx < sy else 1
        x, y = x[ix + 1 :], y[iy + 1 :]
    return (len(x) > len(y)) - (len(x) < len(y))


def encode_key(key: str) -> bytes:
    """Byte string whose bytewise order among encoded keys is `compare_keys` order."""
    data = key.encode()
    if b"\x00" in data:
        data = data.replace(b"\x00", _ESCAPED_ZERO)
    head, slash, last = data.rpartition(b"/")
    if not slash:
        return _LAST + last
    return _MORE + head.replace(b"/", _NEXT_LEVEL) + _LAST_LEVEL + last


def decode_key(data: bytes) -> str:
    """Inverse of `encode_key`; raises ValueError on bytes it cannot have produced."""
    if not data or data[:1] not in (_LAST, _MORE):
        raise ValueError(f"not an encoded user key: {data!r}")
    body = data[1:]
    if b"/" in body:
        raise ValueError(f"encoded key contains a raw '/': {data!r}")
    if data[:1] == _MORE:
        head, sep, last = body.rpartition(_LAST_LEVEL)
        if not sep or _LAST_LEVEL in head:
            raise ValueError(f"encoded key has no single last-level marker: {data!r}")
        body = head.replace(_NEXT_LEVEL, b"/") + b"/" + last
    if body.count(b"\x00") != body.count(_ESCAPED_ZERO):
        raise ValueError(f"encoded key contains an unescaped 0x00: {data!r}")
    return body.replace(_ESCAPED_ZERO, b"\x00").decode()


#: Below this many keys the per-call cost of the Arrow kernels exceeds a plain loop
#: (measured: the two meet near 256 keys for an Arrow result; for a list, kernels pay off
#: from ~500 keys, and the loop loses little in between).
_KERNEL_MIN_KEYS = 256


def encode_keys(keys: pa.Array) -> pa.BinaryArray:
    """`encode_key` over a whole StringArray, with Arrow kernels only (nulls stay null).

    The last '/' of each key is found by a reverse split, not a regex: RE2 cost ~10 ns
    per byte, 50 ms for a 25,000-key entry of 200-byte keys, most of that entry's apply.
    """
    if len(keys) < _KERNEL_MIN_KEYS:
        return pa.array(
            [None if k is None else encode_key(k) for k in keys.to_pylist()], pa.binary()
        )
    data = keys.cast(pa.binary()).fill_null(b"")
    if (np.frombuffer(binary.data(data), np.uint8) == 0).any():
        data = pc.replace_substring(data, b"\x00", _ESCAPED_ZERO)
    # [everything before the last '/', what follows it] for a key with a '/'; [key] else.
    parts = pc.split_pattern(data, b"/", max_splits=1, reverse=True)
    ends = parts.offsets.to_numpy()
    segments = parts.flatten()
    last = segments.take(ends[1:] - 1)
    nested = np.diff(ends) == 2
    encoded = None if nested.all() else pc.binary_join_element_wise(_LAST, last, b"")
    if nested.any():
        head = pc.replace_substring(segments.take(ends[:-1]), b"/", _NEXT_LEVEL)
        with_levels = pc.binary_join_element_wise(_MORE, head, _LAST_LEVEL, last, b"")
        encoded = (
            with_levels if encoded is None else pc.if_else(pa.array(nested), with_levels, encoded)
        )
    if keys.null_count:
        encoded = pc.if_else(keys.is_valid(), encoded, pa.scalar(None, pa.binary()))
    return encoded


def encode_key_list(keys: pa.StringArray) -> list[bytes]:
    """`encode_key` of every key of a StringArray without nulls, as a list (what a
    per-key consumer such as the state machine's apply loop reads)."""
    if len(keys) < _KERNEL_MIN_KEYS:
        return [encode_key(k) for k in keys.to_pylist()]
    return encode_keys(keys).to_pylist()


def decode_keys(data: pa.Array) -> pa.StringArray:
    """`decode_key` over a whole BinaryArray of encoded user keys, with Arrow kernels only.

    Unlike `decode_key` it checks only that the result is valid UTF-8; it is meant for
    keys read back from the store, which `encode_key` wrote.
    """
    body = pc.binary_slice(data, 1, _MAX_LEN)
    # Each replacement is a pass over every key (~40 ms per 10^6 keys); one whose
    # pattern cannot occur is skipped. Every pattern starts with 0x00 and ends with a
    # byte (0x02, 0x01, 0xFF) that must occur too: keys without '/' or NUL need no pass,
    # keys of one level without NUL one.
    raw = np.frombuffer(binary.data(body), np.uint8)
    if (raw == 0).any():
        for pattern, replacement in _DECODINGS:
            if (raw == pattern[-1]).any():
                body = pc.replace_substring(body, pattern, replacement)
    return body.cast(pa.string())


def key_range(min_inclusive: str, max_exclusive: str) -> tuple[bytes, bytes]:
    """Encoded [start, end) for a scan of user keys; an empty max means unbounded.

    The unbounded end is USER_KEYS_END, so a scan never strays into internal keys.
    """
    end = encode_key(max_exclusive) if max_exclusive else USER_KEYS_END
    return encode_key(min_inclusive), end


#: Between the encoded secondary and primary keys of `index_order`: it never occurs
#: inside an encoded key and sorts below every byte that can follow.
INDEX_ORDER_SEPARATOR = b"\x00\x00"


def index_order(secondary: str, primary: str) -> bytes:
    """Sorts index entries as an index keeps them: by secondary key, then primary key
    (what a client merging several shards' index scans compares)."""
    return encode_key(secondary) + INDEX_ORDER_SEPARATOR + encode_key(primary)
