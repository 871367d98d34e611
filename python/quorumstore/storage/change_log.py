"""A shard's change log: what each applied entry changed, kept in the replicated KV for a while.

The state machine records, in the same atomic KV write as an entry's own changes, one
record per entry that changed something:

    key   INTERNAL_PREFIX + b"changes/" + offset (8 bytes, big-endian: byte order is offset order)
    value timestamp_ms (8 bytes, little-endian) + format (1 byte) + one Arrow IPC record
          batch message of CHANGES_SCHEMA (schema-less: the schema is fixed, see `decode`)

so the change feed of a shard is its KV range [changes/a, changes/b): consistent with the
state (the same snapshot holds both), identical on every replica (it is part of what the
log's application produces), and it survives crashes, snapshots and elections with it.
Entries that change nothing (the leader's no-op, a retried exactly-once write, failed
conditional ops only) have no record.

The rows are the entry's net effect, as Oxia's notifications describe it (one per key,
its last op winning, plus one per deleted range), ordered so that applying them in row
order reproduces the entry (see `entry_changes`). `event` is Oxia's `NotificationType`:
KEY_CREATED for a put whose record has `modifications_count == 0`, KEY_MODIFIED for
other puts, KEY_DELETED, KEY_RANGE_DELETED; so Oxia notifications can be served from
this log.

Retention is by entry time and deterministic: every `_EXPIRY_INTERVAL` offsets, the
apply deletes the oldest records whose entry is more than `CHANGE_RETENTION_MS` older
than the entry being applied (at most `_EXPIRE_PER_CHECK` of them), and remembers the
newest offset it dropped. Every replica applying the same log therefore keeps the same
records, and a reader asking for expired changes learns it (`changes_kept_after`)
instead of silently missing them.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

import pyarrow as pa

from quorumstore.storage.keys import INTERNAL_PREFIX
from quorumstore.storage.kv import KvReader
from quorumstore.storage.write_batch import Op
from quorumstore.wire.keys import USER_KEYS_END, decode_key

#: How long the changes of an entry are kept, judged by entry timestamps.
CHANGE_RETENTION_MS = 60 * 60 * 1000
#: Expiry runs at offsets divisible by this (so the oldest record is not read on every apply) ...
_EXPIRY_INTERVAL = 64
#: ... and drops at most this many records each time, so one apply never stalls on it.
_EXPIRE_PER_CHECK = 2 * _EXPIRY_INTERVAL

_PREFIX = INTERNAL_PREFIX + b"changes/"
_END = INTERNAL_PREFIX + b"changes0"  # b"0" follows b"/": the end of the prefix
#: Newest offset whose changes expired (absent: none did).
_KEPT_AFTER_KEY = INTERNAL_PREFIX + b"changes-kept-after"
_OFFSET = struct.Struct(">q")
_HEADER = struct.Struct("<qB")  # timestamp_ms, format
_FORMAT = 1
_NONE_EXPIRED = -1


class ChangeEvent(enum.IntEnum):
    """Oxia's `NotificationType`, by number."""

    KEY_CREATED = 0
    KEY_MODIFIED = 1
    KEY_DELETED = 2
    KEY_RANGE_DELETED = 3


CHANGES_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        # write_batch.Op: PUT, DELETE or DELETE_RANGE.
        pa.field("operation", pa.int8(), nullable=False),
        # The value put; null for deletes.
        pa.field("value", pa.binary()),
        # The record after a put (its version); null for deletes.
        pa.field("version_id", pa.int64()),
        pa.field("modifications_count", pa.int64()),
        pa.field("created_ms", pa.int64()),
        pa.field("modified_ms", pa.int64()),
        # DELETE_RANGE's exclusive end ("" or null: unbounded).
        pa.field("range_end", pa.string()),
        # ChangeEvent.
        pa.field("event", pa.int8(), nullable=False),
    ]
)


def change_key(offset: int) -> bytes:
    return _PREFIX + _OFFSET.pack(offset)


def _offset_of(key: bytes) -> int:
    return _OFFSET.unpack_from(key, len(_PREFIX))[0]


#: A change row as one struct: `entry_changes` converts all rows with one `pa.array`
#: call, as each call costs about 9 us before its first element (measured here) and
#: nine column-wise calls cost an entry of one put more than all its rows.
_ROW_TYPE = pa.struct(list(CHANGES_SCHEMA))
_PUT, _DELETE, _DELETE_RANGE = Op.PUT.value, Op.DELETE.value, Op.DELETE_RANGE.value
_CREATED, _MODIFIED = ChangeEvent.KEY_CREATED.value, ChangeEvent.KEY_MODIFIED.value
_DELETED, _RANGE_DELETED = ChangeEvent.KEY_DELETED.value, ChangeEvent.KEY_RANGE_DELETED.value
#: The version columns of a delete's row: value, version_id, modifications_count,
#: created_ms, modified_ms.
_NO_VERSION = (None,) * 5


class _Version(Protocol):
    """What the change log reads of a stored record (records.Record, whose
    fields are read-only)."""

    @property
    def value(self) -> bytes: ...
    @property
    def version_id(self) -> int: ...
    @property
    def modifications_count(self) -> int: ...
    @property
    def created_ms(self) -> int: ...
    @property
    def modified_ms(self) -> int: ...


def entry_changes(
    changes: Mapping[bytes, bytes | None],
    stored: Mapping[bytes, bytes | None],
    ranges: Sequence[tuple[bytes, bytes]],
    versions: Mapping[bytes, tuple[str, _Version]],
) -> pa.RecordBatch | None:
    """The CHANGES_SCHEMA batch of what one entry did; None if it changed nothing.

    The arguments are the state machine's view of the entry once its ops ran:
    `changes`, encoded key -> new record or None (deleted); `stored`, the records the
    point ops found before the entry (None: absent); `ranges`, the encoded ranges it
    deleted; and `versions`, for each key written, its user key and the record the
    apply built (so nothing is decoded back here). The rows are the deleted ranges, then the
    deleted keys that existed before, then the written keys: applying them in order
    reproduces the entry's effect, as the KV's own atomic write does (ranges, deletes,
    puts). Built as one tuple per row and converted by one `pa.array` call (see
    `_ROW_TYPE`): entries are mostly small, where Arrow kernels would cost more than the
    loop.
    """
    rows: list[tuple[object, ...]] = [
        (
            decode_key(start),
            _DELETE_RANGE,
            *_NO_VERSION,
            "" if end == USER_KEYS_END else decode_key(end),
            _RANGE_DELETED,
        )
        for start, end in ranges
    ]
    # A key deleted without having existed before the entry (put, then deleted by a
    # later op of the same entry) changed nothing. Keys the point ops did not read
    # (a closed session's ephemeral records) existed.
    rows += [
        (decode_key(key), _DELETE, *_NO_VERSION, None, _DELETED)
        for key, record in changes.items()
        if record is None and stored.get(key, b"") is not None
    ]
    for key, record in changes.items():
        if record is not None:
            user_key, r = versions[key]
            rows.append(
                (
                    user_key,
                    _PUT,
                    r.value,
                    r.version_id,
                    r.modifications_count,
                    r.created_ms,
                    r.modified_ms,
                    None,
                    _CREATED if r.modifications_count == 0 else _MODIFIED,
                )
            )
    if not rows:
        return None
    return pa.RecordBatch.from_struct_array(pa.array(rows, _ROW_TYPE))


def encode(timestamp_ms: int, changes: pa.RecordBatch) -> bytes:
    # One copy of the serialized batch, not two: a large entry's record is hundreds of MB.
    return b"".join((_HEADER.pack(timestamp_ms, _FORMAT), changes.serialize()))


def decode(data: bytes) -> tuple[int, pa.RecordBatch]:
    """(entry timestamp_ms, changes) of a stored record."""
    timestamp_ms, fmt = _HEADER.unpack_from(data)
    if fmt != _FORMAT:
        raise ValueError(f"change record has format {fmt}; this version reads format {_FORMAT}")
    batch = pa.ipc.read_record_batch(pa.py_buffer(data)[_HEADER.size :], CHANGES_SCHEMA)
    return timestamp_ms, batch


def changes_kept_after(kv: KvReader) -> int:
    """Offset after which every change is still kept (-1: nothing ever expired)."""
    raw = kv.get(_KEPT_AFTER_KEY)
    return _NONE_EXPIRED if raw is None else _OFFSET.unpack(raw)[0]


def record_changes(
    kv: KvReader, offset: int, timestamp_ms: int, changes: pa.RecordBatch | None
) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """Puts and deletes that record an entry's changes and expire old records.

    `changes` is `entry_changes(...)` of the entry at `offset`, stamped `timestamp_ms`;
    `kv` is the state before the entry is applied.
    """
    puts = [] if changes is None else [(change_key(offset), encode(timestamp_ms, changes))]
    deletes: list[bytes] = []
    if offset % _EXPIRY_INTERVAL == 0:
        horizon = timestamp_ms - CHANGE_RETENTION_MS
        expired = _NONE_EXPIRED
        # From the first record not yet expired: seeking from the prefix would walk the
        # tombstones of every record expired so far.
        item = kv.seek_ge(change_key(changes_kept_after(kv) + 1))
        for _ in range(_EXPIRE_PER_CHECK):
            if item is None or item[0] >= _END or _HEADER.unpack_from(item[1])[0] >= horizon:
                break
            deletes.append(item[0])
            expired = _offset_of(item[0])
            item = kv.seek_gt(item[0])
        if expired != _NONE_EXPIRED:
            puts.append((_KEPT_AFTER_KEY, _OFFSET.pack(expired)))
    return puts, deletes


def read_changes(
    kv: KvReader, start_offset_exclusive: int, end_offset_inclusive: int
) -> Iterator[tuple[int, int, pa.RecordBatch]]:
    """(offset, timestamp_ms, changes) of each recorded entry in (start, end], in order."""
    if end_offset_inclusive <= start_offset_exclusive:
        return
    start = change_key(max(start_offset_exclusive + 1, 0))
    end = change_key(end_offset_inclusive + 1)
    for key, value in kv.scan(start, end):
        timestamp_ms, batch = decode(value)
        yield _offset_of(key), timestamp_ms, batch
