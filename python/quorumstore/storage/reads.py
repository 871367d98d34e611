"""Oxia reads over a shard's KV: point and floor/ceiling gets, key lists and range
scans, secondary-index reads, Arrow scans, and the applied position and version
counter that the apply stores beside the data."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from quorumstore.arrow import binary
from quorumstore.protocol.types import EMPTY_POSITION, LogPosition
from quorumstore.storage import change_log, secondary_indexes, sequences, sessions
from quorumstore.storage.keys import INTERNAL_PREFIX
from quorumstore.storage.kv import DEFAULT_RUN_BYTES, KvReader
from quorumstore.storage.records import (
    HEADER,
    Record,
    decode_record,
    fixed_width_data,
    record_headers,
)
from quorumstore.wire.keys import (
    USER_KEYS_END,
    USER_KEYS_START,
    decode_key,
    decode_keys,
    encode_key,
    key_range,
)
from quorumstore.wire.schemas import SCAN_SCHEMA

APPLIED_KEY = INTERNAL_PREFIX + b"applied"
NEXT_VERSION_ID_KEY = INTERNAL_PREFIX + b"next_version_id"

_POSITION = struct.Struct("<qqQ")  # term, offset, chain checksum
COUNTER = struct.Struct("<q")
_DIGEST = struct.Struct("<QQq")  # sum of record hashes, record count, next_version_id
_U64 = (1 << 64) - 1

#: A slice stop past the end of any Arrow binary value.
_BINARY_END = 2**31 - 1


class KeyComparison(enum.IntEnum):
    """Oxia's client.proto `KeyComparisonType`, in hierarchical key order."""

    EQUAL = 0
    FLOOR = 1
    CEILING = 2
    LOWER = 3
    HIGHER = 4


def _record_suffixes(records: pa.BinaryArray, starts: np.ndarray) -> pa.BinaryArray:
    """Record i from byte starts[i] on, for every i: the values behind variable-length
    strings. A list view over the records' bytes picks the suffixes, flattening packs
    them, and their sizes give the new offsets."""
    n = len(records)
    offsets = binary.offsets(records)
    begins = offsets[:-1] + starts.astype(np.int32)
    sizes = offsets[1:] - begins
    if (sizes < 0).any():
        raise ValueError("a record is shorter than its header and strings")
    data = records.buffers()[2]
    all_bytes = pa.Array.from_buffers(pa.uint8(), len(data), [None, data])
    packed = pc.list_flatten(pa.ListViewArray.from_arrays(begins, sizes, all_bytes))
    new_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(sizes, out=new_offsets[1:])
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(new_offsets), fixed_width_data(packed, 1)]
    )


#: Below this many records a plain loop beats the fixed cost of a dozen Arrow kernels.
_SMALL_BATCH = 64


def _small_records_batch(keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
    records = [decode_record(v) for v in values]
    columns = [
        pa.array([decode_key(k) for k in keys], pa.string()),
        pa.array([r.value for r in records], pa.binary()),
        *(pa.array([r[i] for r in records], pa.int64()) for i in range(1, 5)),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCAN_SCHEMA)


def _records_batch(keys: pa.BinaryArray, records: pa.BinaryArray) -> pa.RecordBatch:
    """SCAN_SCHEMA batch of raw KV items, decoded with Arrow kernels, not per row."""
    if pc.any(pc.less(pc.binary_length(records), HEADER.size)).as_py():
        raise ValueError(f"a record is shorter than its {HEADER.size}-byte header")
    header = record_headers(records)
    fields = [pa.array(header[name], pa.int64()) for name in SCAN_SCHEMA.names[2:]]
    string_lengths = header["client_identity_length"] + header["partition_key_length"]
    if string_lengths.any():  # client identities or partition keys precede some values
        value = _record_suffixes(records, HEADER.size + string_lengths)
    else:
        value = pc.binary_slice(records, HEADER.size, _BINARY_END)
    return pa.RecordBatch.from_arrays([decode_keys(keys), value, *fields], schema=SCAN_SCHEMA)


def _byte_ends(items: pa.BinaryArray) -> np.ndarray:
    """Bytes of items[0..i] for every i (int64), read from the array's offsets."""
    offsets = binary.offsets(items)
    return offsets[1:].astype(np.int64) - offsets[0]


def byte_bounded_runs(keys: pa.Array, values: pa.Array, limit: int) -> Iterator[tuple[int, int]]:
    """[start, stop) row runs whose keys and values hold at most `limit` bytes (or one
    row that alone holds more), cut by the arrays' offsets, not row by row. Both
    arrays are binary or string, not chunked."""
    ends = _byte_ends(keys) + _byte_ends(values)
    start = 0
    while start < len(ends):
        below = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, below + limit, "right")))
        yield start, stop
        start = stop


def _run_batch(keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
    """SCAN_SCHEMA batch of one scan run's raw items: decoded with Arrow kernels, or row
    by row for a short run (`_small_records_batch`)."""
    if len(keys) < _SMALL_BATCH:
        return _small_records_batch(keys, values)
    return _records_batch(pa.array(keys, pa.binary()), pa.array(values, pa.binary()))


def pack_position(position: LogPosition) -> bytes:
    return _POSITION.pack(position.term, position.offset, position.checksum)


def read_applied_position(kv: KvReader) -> LogPosition:
    raw = kv.get(APPLIED_KEY)
    return EMPTY_POSITION if raw is None else LogPosition(*_POSITION.unpack(raw))


def read_next_version_id(kv: KvReader) -> int:
    raw = kv.get(NEXT_VERSION_ID_KEY)
    return 0 if raw is None else COUNTER.unpack(raw)[0]


class ShardReader:
    """Oxia reads over a shard's KV, or over a consistent snapshot of it."""

    def __init__(self, kv: KvReader) -> None:
        self._kv = kv

    @property
    def applied_position(self) -> LogPosition:
        return read_applied_position(self._kv)

    @property
    def next_version_id(self) -> int:
        return read_next_version_id(self._kv)

    def get(self, key: str) -> Record | None:
        raw = self._kv.get(encode_key(key))
        return None if raw is None else decode_record(raw)

    def get_with_comparison(self, key: str, comparison: KeyComparison) -> tuple[str, Record] | None:
        if comparison == KeyComparison.EQUAL:
            record = self.get(key)
            return None if record is None else (key, record)
        seek = {
            KeyComparison.FLOOR: self._kv.seek_le,
            KeyComparison.CEILING: self._kv.seek_ge,
            KeyComparison.LOWER: self._kv.seek_lt,
            KeyComparison.HIGHER: self._kv.seek_gt,
        }[KeyComparison(comparison)]
        item = seek(encode_key(key))
        if item is None or not USER_KEYS_START <= item[0] < USER_KEYS_END:
            return None
        return decode_key(item[0]), decode_record(item[1])

    def list_keys(self, min_inclusive: str, max_exclusive: str) -> Iterator[str]:
        """Keys in [min, max) in hierarchical order; an empty max means unbounded."""
        for key, _ in self._kv.scan(*key_range(min_inclusive, max_exclusive)):
            yield decode_key(key)

    def range_scan(self, min_inclusive: str, max_exclusive: str) -> Iterator[tuple[str, Record]]:
        for key, raw in self._kv.scan(*key_range(min_inclusive, max_exclusive)):
            yield decode_key(key), decode_record(raw)

    def list_by_index(
        self, index_name: str, min_inclusive: str, max_exclusive: str
    ) -> Iterator[str]:
        """Primary keys whose secondary key in `index_name` is in [min, max), by secondary key."""
        for _, primary in secondary_indexes.scan(
            self._kv, index_name, min_inclusive, max_exclusive
        ):
            yield decode_key(primary)

    def range_scan_by_index(
        self, index_name: str, min_inclusive: str, max_exclusive: str
    ) -> Iterator[tuple[str, str, Record]]:
        """(primary key, secondary key, record) for each index entry in [min, max), by
        secondary key, then primary key."""
        entries = secondary_indexes.scan(self._kv, index_name, min_inclusive, max_exclusive)
        for secondary, primary in entries:
            raw = self._kv.get(primary)
            if raw is not None:
                yield decode_key(primary), decode_key(secondary), decode_record(raw)

    def get_by_index(
        self, index_name: str, key: str, comparison: KeyComparison
    ) -> tuple[str, str, Record] | None:
        """(primary key, secondary key, record) that `key` selects in `index_name`."""
        if comparison == KeyComparison.HIGHER:
            found = secondary_indexes.ceiling(self._kv, index_name, key, strict=True)
        elif comparison == KeyComparison.LOWER:
            found = secondary_indexes.lower(self._kv, index_name, key)
        else:
            found = secondary_indexes.ceiling(self._kv, index_name, key, strict=False)
            exact = found is not None and found[1] == encode_key(key)
            if comparison == KeyComparison.FLOOR and not exact:
                found = secondary_indexes.lower(self._kv, index_name, key)
            elif comparison == KeyComparison.EQUAL and not exact:
                found = None
        if found is None:
            return None
        primary, secondary = found
        raw = self._kv.get(primary)
        if raw is None:
            return None
        return decode_key(primary), decode_key(secondary), decode_record(raw)

    def open_sessions(self) -> list[sessions.SessionInfo]:
        """The shard's open sessions."""
        return sessions.read_sessions(self._kv)

    def session_info(self, session_id: int) -> sessions.SessionInfo | None:
        return sessions.read_session(self._kv, session_id)

    def read_changes(
        self, start_offset_exclusive: int, end_offset_inclusive: int
    ) -> Iterator[tuple[int, int, pa.RecordBatch]]:
        """(offset, timestamp_ms, changes) of each entry in (start, end] that changed something."""
        return change_log.read_changes(self._kv, start_offset_exclusive, end_offset_inclusive)

    def changes_kept_after(self) -> int:
        """Offset after which every entry's changes are still kept (-1: none expired)."""
        return change_log.changes_kept_after(self._kv)

    def latest_sequence_key(self, prefix: str) -> str | None:
        """The last key assigned under the sequence `prefix`."""
        return sequences.latest_key(self._kv, prefix)

    def sequence_dimensions(self, prefix: str) -> int:
        """How many numbers the keys of the sequence `prefix` carry (0: none yet)."""
        return sequences.dimensions(self._kv, prefix)

    def scan_arrow(
        self,
        min_inclusive: str,
        max_exclusive: str,
        batch_rows: int = 65536,
        batch_bytes: int = DEFAULT_RUN_BYTES,
    ) -> Iterator[pa.RecordBatch]:
        """`range_scan` as SCAN_SCHEMA record batches of at most `batch_rows` rows, each
        ending with the record that brings its stored bytes to `batch_bytes`: a scan of
        large values holds about `batch_bytes` of them at a time."""
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be positive, got {batch_rows}")
        for keys, values in self._kv.scan_runs(
            *key_range(min_inclusive, max_exclusive), batch_rows, batch_bytes
        ):
            yield _run_batch(keys, values)

    def state_digest(self) -> int:
        """Order-independent hash of every user record and the version counter.

        Two replicas that applied the same log prefix have equal digests whatever
        engine they run on and however they got there (replay, crash, snapshot).
        """
        total = count = 0
        for key, raw in self._kv.scan(USER_KEYS_START, USER_KEYS_END):
            h = xxhash.xxh3_64(COUNTER.pack(len(key)))
            h.update(key)
            h.update(raw)
            total = (total + h.intdigest()) & _U64
            count += 1
        return xxhash.xxh3_64_intdigest(_DIGEST.pack(total, count, self.next_version_id))
