"""A shard's KV as the application of the committed log prefix, applied exactly once.

Every entry is applied with ONE atomic KV write that also records the entry's
position (`applied`) and the version counter (`next_version_id`) under internal
keys. After a crash the KV is therefore exactly the application of some prefix of
the log, and re-applying the log from the start skips what that prefix holds.

Semantics follow Oxia's server (db.go): version ids come from a per-shard counter
bumped by every successful put, the creation time survives overwrites, a version
check against an absent key fails unless it expects absence (-1), and ops in one
batch see the effects of the ops before them.
"""

from __future__ import annotations

import enum
import itertools
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from quorumstore import arrow_binary
from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition
from quorumstore.storage import change_log, secondary_indexes, sequences, sessions, staging
from quorumstore.storage.keys import (
    INTERNAL_PREFIX,
    USER_KEYS_END,
    USER_KEYS_START,
    decode_key,
    decode_keys,
    encode_key,
    encode_key_list,
    encode_keys,
    key_range,
)
from quorumstore.storage.kv import DEFAULT_RUN_BYTES, Item, KvReader, KvStore
from quorumstore.storage.overlay import InternalOverlay
from quorumstore.storage.serials import decode_serial_record, serial_changes, serial_key
from quorumstore.storage.write_batch import (
    VERSION_ID_NOT_EXISTS,
    ClientSerial,
    Op,
    Staging,
    StagingKind,
    batch_origin,
    batch_staging,
    batch_timestamp_ms,
    decode_batch,
)

APPLIED_KEY = INTERNAL_PREFIX + b"applied"
NEXT_VERSION_ID_KEY = INTERNAL_PREFIX + b"next_version_id"

_POSITION = struct.Struct("<qqQ")  # term, offset, chain checksum
_COUNTER = struct.Struct("<q")
_DIGEST = struct.Struct("<QQq")  # sum of record hashes, record count, next_version_id
_U64 = (1 << 64) - 1

# Record header: version_id, modifications_count, created_ms, modified_ms, session_id
# (-1: none), flags, then the lengths of client_identity and partition_key, whose bytes
# follow, then the value. Both lengths sit at fixed offsets so a whole Arrow array of
# records can be decoded with kernels (scan_arrow).
_HEADER = struct.Struct("<qqqqqBII")
_HAS_CLIENT_IDENTITY = 1
_HAS_PARTITION_KEY = 2
_HAS_STRINGS = _HAS_CLIENT_IDENTITY | _HAS_PARTITION_KEY
#: The record has secondary index entries (kept by `secondary_indexes`).
_HAS_INDEXES = 4
_NO_SESSION = -1

# Plain ints for the per-op loop.
_PUT, _DELETE_RANGE = Op.PUT.value, Op.DELETE_RANGE.value
_CREATE_SESSION, _CLOSE_SESSION = Op.CREATE_SESSION.value, Op.CLOSE_SESSION.value
_KNOWN_OPS = {op.value for op in Op}

#: A slice stop past the end of any Arrow binary value.
_BINARY_END = 2**31 - 1


class Status(enum.IntEnum):
    """Oxia's client.proto `Status`."""

    OK = 0
    KEY_NOT_FOUND = 1
    UNEXPECTED_VERSION_ID = 2
    SESSION_DOES_NOT_EXIST = 3


class KeyComparison(enum.IntEnum):
    """Oxia's client.proto `KeyComparisonType`, in hierarchical key order."""

    EQUAL = 0
    FLOOR = 1
    CEILING = 2
    LOWER = 3
    HIGHER = 4


class LogGapError(RuntimeError):
    """An entry does not directly follow the last applied one."""


class LogDivergenceError(RuntimeError):
    """An entry at the applied offset differs from the one that was applied there."""


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


_OK = OpResult(Status.OK)
_KEY_NOT_FOUND = OpResult(Status.KEY_NOT_FOUND)
_UNEXPECTED_VERSION_ID = OpResult(Status.UNEXPECTED_VERSION_ID)
_SESSION_DOES_NOT_EXIST = OpResult(Status.SESSION_DOES_NOT_EXIST)


@dataclass(frozen=True, slots=True)
class EntryResult:
    offset: int
    results: Sequence[OpResult]
    #: True when the entry repeated an exactly-once serial already applied: nothing
    #: changed, and `results` are the original write's (empty for an older serial).
    duplicate: bool = False
    #: Why a publish changed nothing (its pieces were discarded first); else None.
    refused: str | None = None


#: One atomic KV write: puts, deletes, delete ranges.
_KvWrite = tuple[Iterable[Item], list[bytes], list[tuple[bytes, bytes]]]


class _Prepared(NamedTuple):
    """An entry's apply computed ahead of its commit (`ShardStateMachine.prepare`)."""

    #: The applied position it was computed on.
    base: LogPosition
    #: The entry's own position.
    position: LogPosition
    write: _KvWrite
    next_version_id: int
    result: EntryResult | None


class _NotPrepared(Exception):
    """An entry `ShardStateMachine.prepare` leaves to the apply proper."""


_RESULT = struct.Struct("<BBI")  # status, flags, record length
_NO_HEADS: Mapping[int, bytes] = MappingProxyType({})
_RESULT_RECORD, _RESULT_KEY, _RESULT_SESSION = 1, 2, 4

# The same layouts as numpy records, for the columnar apply of plain puts.
_RECORD_HEADER = np.dtype(
    [
        ("version_id", "<i8"),
        ("modifications_count", "<i8"),
        ("created_ms", "<i8"),
        ("modified_ms", "<i8"),
        ("session_id", "<i8"),
        ("flags", "u1"),
        ("client_identity_length", "<u4"),
        ("partition_key_length", "<u4"),
    ]
)
_RESULT_HEADER = np.dtype([("status", "u1"), ("flags", "u1"), ("length", "<u4")])
assert (_RECORD_HEADER.itemsize, _RESULT_HEADER.itemsize) == (_HEADER.size, _RESULT.size)


def encode_results(results: Sequence[OpResult], heads: Mapping[int, bytes] = _NO_HEADS) -> bytes:
    """Compact bytes of per-op results, kept with a client's latest serial.

    Per result: the header, the record without its value (a write's response carries
    the version, never the value, so storing it would write every value twice), then
    (when flagged) the key's length and UTF-8 bytes and the session id. `heads` maps
    `id(record)` to the record's encoded head where the caller has it already (the
    apply loop encodes every put's; encoding it again was a tenth of a 64-put apply).
    """
    parts = [_COUNTER.pack(len(results))]
    for r in results:
        record = (
            b"" if r.version is None else heads.get(id(r.version)) or _encode_record_head(r.version)
        )
        flags = (
            (_RESULT_RECORD if r.version is not None else 0)
            | (_RESULT_KEY if r.key is not None else 0)
            | (_RESULT_SESSION if r.session_id is not None else 0)
        )
        parts.append(_RESULT.pack(r.status, flags, len(record)))
        parts.append(record)
        if r.key is not None:
            key = r.key.encode()
            parts += [_COUNTER.pack(len(key)), key]
        if r.session_id is not None:
            parts.append(_COUNTER.pack(r.session_id))
    return b"".join(parts)


def decode_results(data: bytes) -> list[OpResult]:
    (count,) = _COUNTER.unpack_from(data)
    at = _COUNTER.size
    out = []
    for _ in range(count):
        status, flags, length = _RESULT.unpack_from(data, at)
        at += _RESULT.size
        record = decode_record(data[at : at + length]) if flags & _RESULT_RECORD else None
        at += length
        key = session_id = None
        if flags & _RESULT_KEY:
            (size,) = _COUNTER.unpack_from(data, at)
            at += _COUNTER.size
            key = data[at : at + size].decode()
            at += size
        if flags & _RESULT_SESSION:
            (session_id,) = _COUNTER.unpack_from(data, at)
            at += _COUNTER.size
        out.append(OpResult(Status(status), record, key, session_id))
    return out


def encode_record(record: Record) -> bytes:
    return _encode_record_head(record) + record.value


def _encode_record_head(record: Record) -> bytes:
    """The stored form of `record` up to its value (what `encode_results` keeps)."""
    flags = 0
    client_identity = partition_key = b""
    if record.client_identity is not None:
        flags |= _HAS_CLIENT_IDENTITY
        client_identity = record.client_identity.encode()
    if record.partition_key is not None:
        flags |= _HAS_PARTITION_KEY
        partition_key = record.partition_key.encode()
    if record.indexed:
        flags |= _HAS_INDEXES
    header = _HEADER.pack(
        record.version_id,
        record.modifications_count,
        record.created_ms,
        record.modified_ms,
        _NO_SESSION if record.session_id is None else record.session_id,
        flags,
        len(client_identity),
        len(partition_key),
    )
    return header + client_identity + partition_key if flags & _HAS_STRINGS else header


def decode_record(data: bytes) -> Record:
    if len(data) < _HEADER.size:
        raise ValueError(
            f"record of {len(data)} bytes is shorter than its {_HEADER.size}-byte header"
        )
    version_id, mods, created, modified, session, flags, ci_len, pk_len = _HEADER.unpack_from(data)
    value_at = _HEADER.size + ci_len + pk_len
    if len(data) < value_at:
        raise ValueError(
            f"record of {len(data)} bytes is truncated: its strings end at byte {value_at}"
        )
    ci_at = _HEADER.size + ci_len
    return Record(
        value=data[value_at:],
        version_id=version_id,
        modifications_count=mods,
        created_ms=created,
        modified_ms=modified,
        session_id=None if session == _NO_SESSION else session,
        client_identity=data[_HEADER.size : ci_at].decode()
        if flags & _HAS_CLIENT_IDENTITY
        else None,
        partition_key=data[ci_at:value_at].decode() if flags & _HAS_PARTITION_KEY else None,
        indexed=bool(flags & _HAS_INDEXES),
    )


SCAN_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("version_id", pa.int64(), nullable=False),
        pa.field("modifications_count", pa.int64(), nullable=False),
        pa.field("created_ms", pa.int64(), nullable=False),
        pa.field("modified_ms", pa.int64(), nullable=False),
    ]
)
#: A scan through a secondary index: each record and the secondary key it was found by.
INDEX_SCAN_SCHEMA = SCAN_SCHEMA.append(pa.field("secondary_key", pa.string(), nullable=False))


def _fixed_width_data(array: pa.Array, width: int) -> pa.Buffer:
    """The data buffer of a fixed-width array, from its first element (kernels may slice)."""
    return array.buffers()[1].slice(array.offset * width)


def _record_headers(records: pa.BinaryArray) -> np.ndarray:
    """The header of every record (all at least _HEADER.size bytes), as numpy records
    viewing one copy of those bytes.

    The bytes are reinterpreted in place, so this relies on Arrow's native byte order
    being little-endian, as on every platform quorumstore runs on.
    """
    raw = pc.binary_slice(records, 0, _HEADER.size).cast(pa.binary(_HEADER.size))
    return np.frombuffer(_fixed_width_data(raw, _HEADER.size), _RECORD_HEADER, len(raw))


def _record_suffixes(records: pa.BinaryArray, starts: np.ndarray) -> pa.BinaryArray:
    """Record i from byte starts[i] on, for every i: the values behind variable-length
    strings. A list view over the records' bytes picks the suffixes, flattening packs
    them, and their sizes give the new offsets."""
    n = len(records)
    offsets = arrow_binary.offsets(records)
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
        pa.binary(), n, [None, pa.py_buffer(new_offsets), _fixed_width_data(packed, 1)]
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
    if pc.any(pc.less(pc.binary_length(records), _HEADER.size)).as_py():
        raise ValueError(f"a record is shorter than its {_HEADER.size}-byte header")
    header = _record_headers(records)
    fields = [pa.array(header[name], pa.int64()) for name in SCAN_SCHEMA.names[2:]]
    string_lengths = header["client_identity_length"] + header["partition_key_length"]
    if string_lengths.any():  # client identities or partition keys precede some values
        value = _record_suffixes(records, _HEADER.size + string_lengths)
    else:
        value = pc.binary_slice(records, _HEADER.size, _BINARY_END)
    return pa.RecordBatch.from_arrays([decode_keys(keys), value, *fields], schema=SCAN_SCHEMA)


def _byte_ends(items: pa.BinaryArray) -> np.ndarray:
    """Bytes of items[0..i] for every i (int64), read from the array's offsets."""
    offsets = arrow_binary.offsets(items)
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


class _PutResults(Sequence[OpResult]):
    """The OK results of a columnar apply's range deletes and puts, built when first
    read: bulk writers (the data service) never read them, and per-put objects are most
    of a bulk apply."""

    def __init__(
        self,
        range_deletes: int,
        values: pa.BinaryArray,
        header: np.ndarray,
        client_identity: pa.StringArray,
        partition_key: pa.StringArray,
        now: int,
    ) -> None:
        self._range_deletes = range_deletes
        self._columns = (values, header, client_identity, partition_key, now)
        self._built: list[OpResult] | None = None

    def _results(self) -> list[OpResult]:
        if self._built is None:
            values, header, client_identity, partition_key, now = self._columns
            self._built = [_OK] * self._range_deletes + [
                OpResult(Status.OK, Record(v, i, m, c, now, None, ci, pk, False))
                for v, i, m, c, ci, pk in zip(
                    values.to_pylist(),
                    header["version_id"].tolist(),
                    header["modifications_count"].tolist(),
                    header["created_ms"].tolist(),
                    client_identity.to_pylist(),
                    partition_key.to_pylist(),
                )
            ]
        return self._built

    def __len__(self) -> int:
        return self._range_deletes + len(self._columns[1])

    @overload
    def __getitem__(self, index: int) -> OpResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[OpResult]: ...

    def __getitem__(self, index: int | slice) -> OpResult | list[OpResult]:
        return self._results()[index]

    def __iter__(self) -> Iterator[OpResult]:
        return iter(self._results())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return repr(self._results())


#: Entries of at least this many plain puts are applied column by column; below it the
#: fixed cost of the Arrow kernels exceeds the per-op loop's (the two meet near 100 ops here).
_COLUMNAR_MIN_OPS = 128
_KEY_CREATED = change_log.ChangeEvent.KEY_CREATED.value
_KEY_MODIFIED = change_log.ChangeEvent.KEY_MODIFIED.value


def _packed_binary(rows: np.ndarray) -> pa.BinaryArray:
    """Each element of a numpy record array as one binary value: its packed bytes."""
    width = rows.dtype.itemsize
    fixed = pa.Array.from_buffers(pa.binary(width), len(rows), [None, pa.py_buffer(rows)])
    return fixed.cast(pa.binary())


def _all_empty(lists: pa.ListArray) -> bool:
    return not pc.max(pc.list_value_length(lists)).as_py()


def _leading_range_deletes(batch: pa.RecordBatch) -> int | None:
    """How many range deletes lead `batch` when every op after them is a put without
    session, sequence or secondary index, and there are enough puts for the columnar
    apply (a DataFrame overwrite is such an entry: its range, then its rows); else None."""
    if batch.num_rows < _COLUMNAR_MIN_OPS:
        return None  # most entries: no kernel runs for them
    leading = pc.index(pc.not_equal(batch.column("op"), _DELETE_RANGE), True).as_py()
    if leading < 0 or batch.num_rows - leading < _COLUMNAR_MIN_OPS:
        return None
    puts = batch.slice(leading)
    plain = (
        pc.all(pc.equal(puts.column("op"), _PUT)).as_py()
        and puts.column("session_id").null_count == puts.num_rows
        and _all_empty(puts.column("sequence_key_delta"))
        and _all_empty(puts.column("secondary_indexes"))
    )
    return leading if plain else None


#: A columnar apply makes Python bytes of its keys and records this many at a time, as
#: the KV write consumes them: all at once, a large entry's would be held twice more.
_ITEMS_PER_SLICE = 16_384


def _items(keys: pa.BinaryArray, records: pa.BinaryArray) -> Iterator[tuple[bytes, bytes]]:
    """(key, record) pairs, made a slice at a time as the KV write consumes them."""
    for start in range(0, len(keys), _ITEMS_PER_SLICE):
        key_slice = keys.slice(start, _ITEMS_PER_SLICE).to_pylist()
        yield from zip(key_slice, records.slice(start, _ITEMS_PER_SLICE).to_pylist())


def _encoded_ranges(range_deletes: pa.RecordBatch) -> list[tuple[bytes, bytes]]:
    """The encoded [start, end) ranges of DELETE_RANGE rows, empty or inverted ones left
    out, as the loop leaves them out."""
    ranges = [
        key_range(start, end or "")
        for start, end in zip(
            range_deletes.column("key").to_pylist(), range_deletes.column("end_key").to_pylist()
        )
    ]
    return [(start, end) for start, end in ranges if start < end]


def _in_ranges(keys: pa.BinaryArray, ranges: Sequence[tuple[bytes, bytes]]) -> np.ndarray:
    """Whether each encoded key lies in one of the encoded [start, end) ranges."""
    inside = np.zeros(len(keys), bool)
    for start, end in ranges:
        within = pc.and_(pc.greater_equal(keys, start), pc.less(keys, end))
        inside |= within.to_numpy(zero_copy_only=False)
    return inside


def _stored_headers(stored: Sequence[bytes | None] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whether each key exists, its record header; zeros where it does not)."""
    records = pa.array(stored, pa.binary())
    exists = pc.is_valid(records).to_numpy(zero_copy_only=False)
    if not exists.any():
        return exists, np.zeros(len(stored), _RECORD_HEADER)
    records = records.fill_null(bytes(_HEADER.size))
    if pc.any(pc.less(pc.binary_length(records), _HEADER.size)).as_py():
        raise ValueError(f"a stored record is shorter than its {_HEADER.size}-byte header")
    return exists, _record_headers(records)


def _pack_position(position: LogPosition) -> bytes:
    return _POSITION.pack(position.term, position.offset, position.checksum)


def read_applied_position(kv: KvReader) -> LogPosition:
    raw = kv.get(APPLIED_KEY)
    return EMPTY_POSITION if raw is None else LogPosition(*_POSITION.unpack(raw))


def read_next_version_id(kv: KvReader) -> int:
    raw = kv.get(NEXT_VERSION_ID_KEY)
    return 0 if raw is None else _COUNTER.unpack(raw)[0]


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
            h = xxhash.xxh3_64(_COUNTER.pack(len(key)))
            h.update(key)
            h.update(raw)
            total = (total + h.intdigest()) & _U64
            count += 1
        return xxhash.xxh3_64_intdigest(_DIGEST.pack(total, count, self.next_version_id))


class ShardStateMachine(ShardReader):
    """Applies committed entries to a KvStore, each exactly once, in offset order.

    Create it after every (re)open of the KV, and after installing a snapshot into
    it: the applied position and the version counter are read from the KV here.
    """

    def __init__(self, kv: KvStore) -> None:
        super().__init__(kv)
        self._store = kv
        self._applied = read_applied_position(kv)
        self._next_version_id = read_next_version_id(kv)
        #: The next entry's apply, computed ahead of its commit (`prepare`).
        self._prepared: _Prepared | None = None
        #: While `prepare` runs: where the apply's KV write goes instead of the KV.
        self._capture: list[_Prepared] | None = None

    @property
    def applied_position(self) -> LogPosition:
        return self._applied

    @property
    def next_version_id(self) -> int:
        return self._next_version_id

    def apply(self, entries: Sequence[LogEntry]) -> list[EntryResult | None]:
        """Apply `entries` in order; None for each one already applied before.

        Re-applied entries happen only after a crash, when nobody waits for their
        results, so those are not reconstructed.
        """
        results: list[EntryResult | None] = []
        for entry in entries:
            applied = self._applied
            if entry.offset < applied.offset:
                results.append(None)
            elif entry.offset == applied.offset:
                if (entry.term, entry.checksum) != (applied.term, applied.checksum):
                    raise LogDivergenceError(
                        f"entry at offset {entry.offset} has term {entry.term} and checksum "
                        f"{entry.checksum:#x}, but the applied one had term {applied.term} and "
                        f"checksum {applied.checksum:#x}"
                    )
                results.append(None)
            elif entry.offset == applied.offset + 1:
                prepared = self._apply_prepared(entry)
                results.append(self._apply_entry(entry) if prepared is None else prepared)
            else:
                raise LogGapError(
                    f"cannot apply entry at offset {entry.offset}: last applied offset is "
                    f"{applied.offset}, so the next one must be {applied.offset + 1}"
                )
        return results

    def prepare(self, entry: LogEntry) -> bool:
        """Computes the apply of `entry`, the next entry to apply, without making it, so
        that applying it later only writes the KV batch computed now.

        A leader prepares the entry it waits on a quorum for: its loop is idle then, and
        the apply (milliseconds for 64 puts) leaves its clients' wait. The apply's
        outcome depends only on the KV and the entry, so `apply` uses the prepared one
        if the entry at that offset is the same (term, offset and chain checksum) and
        nothing was applied since; otherwise, or at the next apply of any entry, it is
        dropped. False, preparing nothing, for an entry that is not the next one, one of
        a staged write (a publish reads all its pieces), or one whose apply fails (the
        apply proper raises the error then). Preparing the prepared entry again (a
        retransmitted Append is written too) does nothing.
        """
        if self._prepared_for(entry) is not None:
            return True
        self._prepared = None
        if entry.offset != self._applied.offset + 1:
            return False
        captured: list[_Prepared] = []
        self._capture = captured
        try:
            result = self._apply_entry(entry)
            (prepared,) = captured  # every apply makes one KV write
        except Exception:  # noqa: BLE001 - the apply proper meets the same error
            return False
        finally:
            self._capture = None
        self._prepared = prepared._replace(result=result)
        return True

    def _prepared_for(self, entry: LogEntry) -> _Prepared | None:
        """The prepared apply, if it is of `entry` on the current state."""
        prepared = self._prepared
        if (
            prepared is None
            or prepared.base != self._applied
            or prepared.position != entry.position
        ):
            return None
        return prepared

    def _apply_prepared(self, entry: LogEntry) -> EntryResult | None:
        """Applies `entry` by writing its prepared KV batch, if it is the entry prepared
        on the current state; None otherwise. The prepared apply is used up either way."""
        prepared, self._prepared = self._prepared_for(entry), None
        if prepared is None:
            return None
        self._commit(prepared.write, prepared.position, prepared.next_version_id)
        return prepared.result

    def _commit(self, write: _KvWrite, position: LogPosition, next_version_id: int) -> None:
        """Makes an entry's KV write (the applied position among its puts) and moves the
        applied position and version counter with it; while `prepare` runs, only notes
        them."""
        if self._capture is not None:
            puts, deletes, ranges = write
            self._capture.append(
                _Prepared(
                    self._applied, position, (list(puts), deletes, ranges), next_version_id, None
                )
            )
            return
        self._store.write(*write)
        self._applied = position
        self._next_version_id = next_version_id

    def _apply_entry(self, entry: LogEntry) -> EntryResult:
        batch = decode_batch(entry.payload)
        now = batch_timestamp_ms(batch)
        position = entry.position
        stage = batch_staging(batch)
        if stage is not None and self._capture is not None:
            raise _NotPrepared(f"entry {entry.offset} is part of staged write {stage.name}")
        # A publish's pieces go in its own KV write, whatever the outcome.
        drop = None
        if stage is not None:
            if stage.kind is not StagingKind.PUBLISH:
                return self._apply_staging(entry, now, position, stage)
            drop = staging.name_range(stage.name)
        origin = batch_origin(batch)
        previous_serial = None
        if origin is not None:
            previous_serial = self._store.get(serial_key(origin.client_id))
            if previous_serial is not None:
                last, _, stored_results = decode_serial_record(previous_serial)
                if origin.serial <= last:
                    # A retry of a write that already took effect: consume the offset only.
                    self._consume_offset(position, drop)
                    original = decode_results(stored_results) if origin.serial == last else []
                    return EntryResult(entry.offset, original, duplicate=True)
        if stage is not None:
            pieces = staging.read_pieces(self._store, stage.name)
            if len(pieces) != stage.number:
                self._consume_offset(position, drop)
                return EntryResult(
                    entry.offset,
                    [],
                    refused=f"stage {stage.name} holds {len(pieces)} of its {stage.number} "
                    "pieces here: the write was discarded while it was being published",
                )
            metadata = dict(batch.schema.metadata or {})
            for key in stage.metadata():
                metadata.pop(key)
            batch = pa.concat_batches(
                [batch.replace_schema_metadata(None), *pieces]
            ).replace_schema_metadata(metadata)
            del pieces  # the publish holds its rows once, not twice, while it applies them
        leading_ranges = _leading_range_deletes(batch)
        if leading_ranges is not None:
            applied_columnar = self._apply_plain_puts(
                entry.offset, batch, leading_ranges, now, position, origin, previous_serial, drop
            )
            if applied_columnar is not None:
                return applied_columnar
        columns = batch.to_pydict()
        ops = columns["op"]
        unknown = set(ops) - _KNOWN_OPS
        if unknown:
            raise ValueError(f"entry at offset {entry.offset} holds unknown ops {sorted(unknown)}")
        keys = encode_key_list(batch.column("key"))

        # Stored state of every key a point op touches, read once; `changes` overlays
        # what earlier ops of this batch did (None: deleted).
        point_keys = list(dict.fromkeys(k for op, k in zip(ops, keys) if op != _DELETE_RANGE))
        stored = dict(zip(point_keys, self._store.multi_get(point_keys)))
        changes: dict[bytes, bytes | None] = {}
        # User key and record of each key put, for the change log.
        versions: dict[bytes, tuple[str, Record]] = {}
        ranges: list[tuple[bytes, bytes]] = []
        # Sessions, secondary indexes and sequences, under internal keys.
        internal = InternalOverlay(self._store)
        next_version_id = self._next_version_id
        results: list[OpResult] = []
        # Encoded head of each record put, by id(record), for `encode_results`.
        heads: dict[int, bytes] = {}

        def current_of(k: bytes) -> bytes | None:
            """A key no point op named (a sequence key, a session's ephemeral key)."""
            if k in changes:
                return changes[k]
            if k in stored:
                return stored[k]
            if any(start <= k < end for start, end in ranges):
                return None
            return self._store.get(k)

        rows = zip(
            ops,
            keys,
            columns["key"],
            columns["end_key"],
            columns["value"],
            columns["expected_version_id"],
            columns["session_id"],
            columns["client_identity"],
            columns["partition_key"],
            columns["sequence_key_delta"],
            columns["secondary_indexes"],
            columns["session_timeout_ms"],
        )
        for (
            op,
            key,
            plain_key,
            end_key,
            value,
            want,
            session_id,
            client_identity,
            partition_key,
            deltas,
            indexes,
            timeout_ms,
        ) in rows:
            if op == _DELETE_RANGE:
                end = encode_key(end_key) if end_key else USER_KEYS_END
                if key < end:
                    ranges.append((key, end))
                    for view in (stored, changes):
                        for k in view:
                            if key <= k < end:
                                view[k] = None
                    secondary_indexes.remove_range(internal, key, end)
                results.append(_OK)
                continue
            if op == _CREATE_SESSION:
                new_id = sessions.create_session(internal, timeout_ms or 0, client_identity or "")
                results.append(OpResult(Status.OK, session_id=new_id))
                continue
            if op == _CLOSE_SESSION:
                listed = sessions.close_session(internal, session_id)
                if listed is None:
                    results.append(_SESSION_DOES_NOT_EXIST)
                    continue
                for k in listed:
                    ephemeral = current_of(k)
                    if ephemeral is not None and _HEADER.unpack_from(ephemeral)[4] == session_id:
                        changes[k] = None
                        if _HEADER.unpack_from(ephemeral)[5] & _HAS_INDEXES:
                            secondary_indexes.remove(internal, k)
                results.append(_OK)
                continue

            assigned = None
            if op == _PUT and (session_id is not None or deltas):
                if session_id is not None and not sessions.session_exists(internal, session_id):
                    results.append(_SESSION_DOES_NOT_EXIST)
                    continue
                if deltas:
                    try:
                        assigned = sequences.assign(internal, plain_key, deltas)
                    except sequences.SequenceOverflowError:
                        results.append(_UNEXPECTED_VERSION_ID)
                        continue
                    key = encode_key(assigned)
            if assigned is None:
                current = changes[key] if key in changes else stored[key]
            else:
                current = current_of(key)
            # (version_id, modifications_count, created_ms, ...) or None when absent.
            header = None if current is None else _HEADER.unpack_from(current)
            was_indexed = header is not None and header[5] & _HAS_INDEXES
            if want is not None and want != (
                VERSION_ID_NOT_EXISTS if header is None else header[0]
            ):
                results.append(_UNEXPECTED_VERSION_ID)
            elif op == _PUT:
                record = Record(
                    value or b"",
                    next_version_id,
                    0 if header is None else header[1] + 1,
                    now if header is None else header[2],
                    now,
                    session_id,
                    client_identity,
                    partition_key,
                    bool(indexes),
                )
                next_version_id += 1
                # encode_record(record), keeping its head for the stored results
                head = heads[id(record)] = _encode_record_head(record)
                changes[key] = head + record.value
                versions[key] = (plain_key if assigned is None else assigned, record)
                if session_id is not None:
                    sessions.add_ephemeral_key(internal, session_id, key)
                if indexes or was_indexed:
                    pairs = [(i["index_name"], i["secondary_key"]) for i in indexes or ()]
                    secondary_indexes.replace(internal, key, pairs)
                results.append(OpResult(Status.OK, record, assigned))
            elif header is None:
                results.append(_KEY_NOT_FOUND)
            else:
                changes[key] = None
                if was_indexed:
                    secondary_indexes.remove(internal, key)
                results.append(_OK)

        puts = [(k, v) for k, v in changes.items() if v is not None]
        deletes = [k for k, v in changes.items() if v is None]
        internal_puts, internal_deletes = internal.writes()
        puts.extend(internal_puts)
        deletes.extend(internal_deletes)
        self._write_entry(
            entry.offset,
            now,
            position,
            next_version_id,
            (puts, deletes, ranges),
            change_log.entry_changes(changes, stored, ranges, versions),
            None if origin is None else (origin, encode_results(results, heads), previous_serial),
            drop,
        )
        return EntryResult(entry.offset, results)

    def _consume_offset(self, position: LogPosition, drop: tuple[bytes, bytes] | None) -> None:
        """Records `position` as applied, changing nothing else but dropping `drop`'s range."""
        self._commit(
            ([(APPLIED_KEY, _pack_position(position))], [], [drop] if drop else []),
            position,
            self._next_version_id,
        )

    def _apply_staging(
        self, entry: LogEntry, now: int, position: LogPosition, stage: Staging
    ) -> EntryResult:
        """Keeps a piece of a staged write, or drops a discarded write's pieces."""
        puts: list[tuple[bytes, bytes]] = []
        ranges: list[tuple[bytes, bytes]] = []
        if stage.kind is StagingKind.PIECE:
            record = staging.piece_record(now, entry.payload)
            puts.append((staging.piece_key(stage.name, stage.number), record))
        else:
            ranges.append(staging.name_range(stage.name))
        self._write_entry(
            entry.offset, now, position, self._next_version_id, (puts, [], ranges), None, None
        )
        return EntryResult(entry.offset, [])

    def _write_entry(
        self,
        offset: int,
        now: int,
        position: LogPosition,
        next_version_id: int,
        writes: tuple[Iterable[tuple[bytes, bytes]], list[bytes], list[tuple[bytes, bytes]]],
        change_batch: pa.RecordBatch | None,
        serial: tuple[ClientSerial, bytes, bytes | None] | None,
        drop: tuple[bytes, bytes] | None = None,
    ) -> None:
        """Writes an entry's changes (`writes`: puts, deletes, delete ranges) in one atomic
        batch with the applied position, version counter, change-log record and, for an
        exactly-once write (`serial`: origin, encoded results, previous serial record),
        the client's serial; `drop` is one more range to delete (published pieces)."""
        puts, deletes, ranges = writes
        if drop is not None:
            ranges = [*ranges, drop]
        more_puts = [
            (APPLIED_KEY, _pack_position(position)),
            (NEXT_VERSION_ID_KEY, _COUNTER.pack(next_version_id)),
        ]
        if serial is not None:
            origin, results, previous_serial = serial
            serial_puts, serial_deletes = serial_changes(
                self._store, origin.client_id, origin.serial, now, results, previous_serial
            )
            more_puts.extend(serial_puts)
            deletes.extend(serial_deletes)
        change_puts, change_deletes = change_log.record_changes(
            self._store, offset, now, change_batch
        )
        more_puts.extend(change_puts)
        deletes.extend(change_deletes)
        self._commit((itertools.chain(puts, more_puts), deletes, ranges), position, next_version_id)

    def _records_outside(
        self, keys: pa.BinaryArray, ranges: list[tuple[bytes, bytes]]
    ) -> list[bytes | None] | np.ndarray:
        """The stored record of each encoded key; None, without a lookup, for a key in one
        of `ranges`, which the entry deletes before its puts."""
        if not ranges:
            return self._store.multi_get(keys.to_pylist())
        inside = _in_ranges(keys, ranges)
        stored = np.full(len(keys), None, object)
        if not inside.all():
            stored[~inside] = self._store.multi_get(keys.filter(pa.array(~inside)).to_pylist())
        return stored

    def _apply_plain_puts(
        self,
        offset: int,
        entry_batch: pa.RecordBatch,
        leading_ranges: int,
        now: int,
        position: LogPosition,
        origin: ClientSerial | None,
        previous_serial: bytes | None,
        drop: tuple[bytes, bytes] | None,
    ) -> EntryResult | None:
        """The general loop's effect for an entry of `leading_ranges` range deletes, then
        plain puts, computed column by column (bulk writes and overwrites are such
        entries). None, having changed nothing, when an op needs the loop: a key named
        twice, an expected version not met, or a record replaced that has secondary
        index entries. A put inside a deleted range creates its key afresh, so it needs
        no lookup."""
        batch = entry_batch.slice(leading_ranges)
        n = batch.num_rows
        keys = encode_keys(batch.column("key"))
        if pc.count_distinct(keys).as_py() != n:
            return None
        ranges = _encoded_ranges(entry_batch.slice(0, leading_ranges))
        exists, old = _stored_headers(self._records_outside(keys, ranges))
        if (old["flags"] & _HAS_INDEXES).any():
            return None
        expected = batch.column("expected_version_id")
        if expected.null_count < n:
            conditional = pc.is_valid(expected).to_numpy(zero_copy_only=False)
            current = np.where(exists, old["version_id"], VERSION_ID_NOT_EXISTS)
            if (conditional & (expected.fill_null(0).to_numpy() != current)).any():
                return None
        client_identity = batch.column("client_identity").cast(pa.binary())
        partition_key = batch.column("partition_key").cast(pa.binary())
        value = batch.column("value").fill_null(b"")
        header = np.zeros(n, _RECORD_HEADER)
        header["version_id"] = np.arange(self._next_version_id, self._next_version_id + n)
        header["modifications_count"] = np.where(exists, old["modifications_count"] + 1, 0)
        header["created_ms"] = np.where(exists, old["created_ms"], now)
        header["modified_ms"] = now
        header["session_id"] = _NO_SESSION
        header["flags"] = _HAS_CLIENT_IDENTITY * pc.is_valid(client_identity).to_numpy(
            zero_copy_only=False
        ) | _HAS_PARTITION_KEY * pc.is_valid(partition_key).to_numpy(zero_copy_only=False)
        for column, strings in (
            ("client_identity_length", client_identity),
            ("partition_key_length", partition_key),
        ):
            header[column] = pc.binary_length(strings).fill_null(0).to_numpy()
        heads = pc.binary_join_element_wise(
            _packed_binary(header),
            client_identity.fill_null(b""),
            partition_key.fill_null(b""),
            b"",
        )
        records = pc.binary_join_element_wise(heads, value, b"")
        serial = None
        if origin is not None:  # results without values, as `encode_results` writes them
            result_header = np.zeros(n, _RESULT_HEADER)
            result_header["status"] = Status.OK
            result_header["flags"] = _RESULT_RECORD
            result_header["length"] = pc.binary_length(heads).to_numpy()
            results = (
                _COUNTER.pack(leading_ranges + n)
                + encode_results([_OK] * leading_ranges)[_COUNTER.size :]
                + arrow_binary.concatenated(
                    pc.binary_join_element_wise(_packed_binary(result_header), heads, b"")
                )
            )
            serial = (origin, results, previous_serial)
        del heads  # in the records and results now; a large entry's are hundreds of MB
        int64 = pa.int64()
        changes = pa.RecordBatch.from_arrays(
            [
                batch.column("key"),
                pa.array(np.full(n, Op.PUT, np.int8)),
                value,
                pa.array(header["version_id"], int64),
                pa.array(header["modifications_count"], int64),
                pa.array(header["created_ms"], int64),
                pa.array(header["modified_ms"], int64),
                pa.nulls(n, pa.string()),
                pa.array(np.where(exists, _KEY_MODIFIED, _KEY_CREATED).astype(np.int8)),
            ],
            schema=change_log.CHANGES_SCHEMA,
        )
        range_changes = change_log.entry_changes({}, {}, ranges, {})
        if range_changes is not None:
            changes = pa.concat_batches([range_changes, changes])
        internal = InternalOverlay(self._store)
        for start, end in ranges:
            secondary_indexes.remove_range(internal, start, end)
        internal_puts, internal_deletes = internal.writes()
        self._write_entry(
            offset,
            now,
            position,
            self._next_version_id + n,
            (itertools.chain(_items(keys, records), internal_puts), internal_deletes, ranges),
            changes,
            serial,
            drop,
        )
        return EntryResult(
            offset,
            _PutResults(
                leading_ranges,
                value,
                header,
                batch.column("client_identity"),
                batch.column("partition_key"),
                now,
            ),
        )
