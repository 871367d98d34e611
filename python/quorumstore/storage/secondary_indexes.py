"""Secondary indexes: (index name, secondary key) -> primary keys, kept at apply time.

A put may list (index name, secondary key) pairs. Each pair becomes an internal entry

    0x00 "idx/" esc(index name) 0x00 0x00 encode_key(secondary) 0x00 0x00 encode_key(primary)

whose byte order is (index, secondary key in hierarchical order, primary key): the
pair 0x00 0x00 never occurs inside an escaped name or an encoded key and sorts below
every byte that can follow, so a range of secondary keys is one KV range scan. The
pairs a primary key holds are also kept under its own reverse entry, so an overwrite,
a delete or a delete range removes exactly the entries of the records it replaces,
visiting only records that have indexes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from quorumstore.storage.keys import INTERNAL_PREFIX
from quorumstore.storage.kv import KvReader
from quorumstore.storage.overlay import InternalOverlay
from quorumstore.wire.keys import INDEX_ORDER_SEPARATOR, USER_KEYS_END, encode_key

_ENTRY_PREFIX = INTERNAL_PREFIX + b"idx/"
_REVERSE_PREFIX = INTERNAL_PREFIX + b"idx-of/"
#: Entries sort in `wire.keys.index_order`, the order clients merge shards' index scans in.
_SEPARATOR = INDEX_ORDER_SEPARATOR
_LENGTH = struct.Struct("<I")
#: Sorts after the encoding of the secondary key and any entry of it (see HIGHER).
_AFTER_KEY = b"\x00\x01"

IndexPair = tuple[str, str]


def _index_prefix(index_name: str) -> bytes:
    return _ENTRY_PREFIX + index_name.encode().replace(b"\x00", b"\x00\xff") + _SEPARATOR


def _entry_key(encoded_primary: bytes, pair: IndexPair) -> bytes:
    name, secondary = pair
    return _index_prefix(name) + encode_key(secondary) + _SEPARATOR + encoded_primary


def _encode_pairs(pairs: list[IndexPair]) -> bytes:
    parts = []
    for text in (s for pair in pairs for s in pair):
        data = text.encode()
        parts += [_LENGTH.pack(len(data)), data]
    return b"".join(parts)


def _decode_pairs(data: bytes) -> list[IndexPair]:
    texts = []
    at = 0
    while at < len(data):
        (size,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        texts.append(data[at : at + size].decode())
        at += size
    return list(zip(texts[::2], texts[1::2]))


def remove(state: InternalOverlay, encoded_primary: bytes) -> None:
    """Drops the index entries of the record at `encoded_primary`, if it has any."""
    reverse = _REVERSE_PREFIX + encoded_primary
    raw = state.get(reverse)
    if raw is None:
        return
    for pair in _decode_pairs(raw):
        state.delete(_entry_key(encoded_primary, pair))
    state.delete(reverse)


def replace(state: InternalOverlay, encoded_primary: bytes, pairs: list[IndexPair]) -> None:
    """The record at `encoded_primary` is now indexed by `pairs` only."""
    remove(state, encoded_primary)
    unique = list(dict.fromkeys(pairs))
    if not unique:
        return
    for pair in unique:
        state.put(_entry_key(encoded_primary, pair), b"")
    state.put(_REVERSE_PREFIX + encoded_primary, _encode_pairs(unique))


def remove_range(state: InternalOverlay, start: bytes, end: bytes) -> None:
    """Drops the entries of every record in the encoded primary range [start, end)."""
    for reverse, _ in state.scan(_REVERSE_PREFIX + start, _REVERSE_PREFIX + end):
        remove(state, reverse[len(_REVERSE_PREFIX) :])


def _split(prefix: bytes, entry: bytes) -> tuple[bytes, bytes]:
    """(encoded secondary key, encoded primary key) of an entry of the index at `prefix`."""
    rest = entry[len(prefix) :]
    secondary, _, primary = rest.partition(_SEPARATOR)
    return secondary, primary


def scan(kv: KvReader, index_name: str, start: str, end: str) -> Iterator[tuple[bytes, bytes]]:
    """(encoded secondary key, encoded primary key) of the entries whose secondary key
    is in [start, end) ("" end: unbounded), by secondary key, then primary key."""
    prefix = _index_prefix(index_name)
    upper = prefix + (encode_key(end) if end else USER_KEYS_END)
    for entry, _ in kv.scan(prefix + encode_key(start), upper):
        yield _split(prefix, entry)


def ceiling(kv: KvReader, index_name: str, key: str, *, strict: bool) -> tuple[bytes, bytes] | None:
    """(encoded primary, encoded secondary) of the first entry whose secondary key is
    >= `key` (> when strict): the lowest primary key of the lowest such secondary key."""
    prefix = _index_prefix(index_name)
    target = prefix + encode_key(key)
    item = kv.seek_ge(target + _AFTER_KEY if strict else target)
    if item is None or not item[0].startswith(prefix):
        return None
    secondary, primary = _split(prefix, item[0])
    return primary, secondary


def lower(kv: KvReader, index_name: str, key: str) -> tuple[bytes, bytes] | None:
    """(encoded primary, encoded secondary) of the last entry whose secondary key is
    < `key`: the highest primary key of the highest such secondary key."""
    prefix = _index_prefix(index_name)
    item = kv.seek_lt(prefix + encode_key(key))
    if item is None or not item[0].startswith(prefix):
        return None
    secondary, primary = _split(prefix, item[0])
    return primary, secondary
