"""The columnar apply: an entry of range deletes, then many plain puts (a bulk write,
a DataFrame overwrite), applied column by column with Arrow and numpy kernels.

Its effect is exactly the per-op loop's (`apply`) for the entries it takes; for any
op that needs the loop it declines, having changed nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow import binary
from quorumstore.storage import change_log, secondary_indexes
from quorumstore.storage.kv import KvReader, KvWrite
from quorumstore.storage.overlay import InternalOverlay
from quorumstore.storage.records import (
    HAS_CLIENT_IDENTITY,
    HAS_INDEXES,
    HAS_PARTITION_KEY,
    HEADER,
    HEADER_DTYPE,
    NO_SESSION,
    Record,
    record_headers,
)
from quorumstore.storage.results import (
    COUNTER,
    OK,
    RESULT_DTYPE,
    RESULT_RECORD,
    OpResult,
    Status,
    encode_results,
)
from quorumstore.storage.write_batch import VERSION_ID_NOT_EXISTS, Op
from quorumstore.wire.keys import encode_keys, key_range

_PUT, _DELETE_RANGE = Op.PUT.value, Op.DELETE_RANGE.value


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
            self._built = [OK] * self._range_deletes + [
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


class ColumnarApply(NamedTuple):
    """A columnar apply's effect, for the state machine to write with its entry."""

    #: Puts, deletes and delete ranges of the user keys and their internal keys.
    write: KvWrite
    #: The entry's change-log batch.
    changes: pa.RecordBatch
    results: Sequence[OpResult]
    #: `encode_results` of `results`, when asked for (an exactly-once write).
    encoded_results: bytes | None
    next_version_id: int


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


def leading_range_deletes(batch: pa.RecordBatch) -> int | None:
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
        return exists, np.zeros(len(stored), HEADER_DTYPE)
    records = records.fill_null(bytes(HEADER.size))
    if pc.any(pc.less(pc.binary_length(records), HEADER.size)).as_py():
        raise ValueError(f"a stored record is shorter than its {HEADER.size}-byte header")
    return exists, record_headers(records)


def _records_outside(
    store: KvReader, keys: pa.BinaryArray, ranges: list[tuple[bytes, bytes]]
) -> list[bytes | None] | np.ndarray:
    """The stored record of each encoded key; None, without a lookup, for a key in one
    of `ranges`, which the entry deletes before its puts."""
    if not ranges:
        return store.multi_get(keys.to_pylist())
    inside = _in_ranges(keys, ranges)
    stored = np.full(len(keys), None, object)
    if not inside.all():
        stored[~inside] = store.multi_get(keys.filter(pa.array(~inside)).to_pylist())
    return stored


def apply_plain_puts(
    store: KvReader,
    entry_batch: pa.RecordBatch,
    leading_ranges: int,
    now: int,
    next_version_id: int,
    encode: bool,
) -> ColumnarApply | None:
    """The per-op loop's effect for an entry of `leading_ranges` range deletes, then
    plain puts (`leading_range_deletes`), computed column by column; with its results
    encoded if `encode`. None when an op needs the loop: a key named twice, an expected
    version not met, or a record replaced that has secondary index entries. A put
    inside a deleted range creates its key afresh, so it needs no lookup."""
    batch = entry_batch.slice(leading_ranges)
    n = batch.num_rows
    keys = encode_keys(batch.column("key"))
    if pc.count_distinct(keys).as_py() != n:
        return None
    ranges = _encoded_ranges(entry_batch.slice(0, leading_ranges))
    exists, old = _stored_headers(_records_outside(store, keys, ranges))
    if (old["flags"] & HAS_INDEXES).any():
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
    header = np.zeros(n, HEADER_DTYPE)
    header["version_id"] = np.arange(next_version_id, next_version_id + n)
    header["modifications_count"] = np.where(exists, old["modifications_count"] + 1, 0)
    header["created_ms"] = np.where(exists, old["created_ms"], now)
    header["modified_ms"] = now
    header["session_id"] = NO_SESSION
    header["flags"] = HAS_CLIENT_IDENTITY * pc.is_valid(client_identity).to_numpy(
        zero_copy_only=False
    ) | HAS_PARTITION_KEY * pc.is_valid(partition_key).to_numpy(zero_copy_only=False)
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
    encoded = None
    if encode:  # results without values, as `encode_results` writes them
        result_header = np.zeros(n, RESULT_DTYPE)
        result_header["status"] = Status.OK
        result_header["flags"] = RESULT_RECORD
        result_header["length"] = pc.binary_length(heads).to_numpy()
        encoded = (
            COUNTER.pack(leading_ranges + n)
            + encode_results([OK] * leading_ranges)[COUNTER.size :]
            + binary.concatenated(
                pc.binary_join_element_wise(_packed_binary(result_header), heads, b"")
            )
        )
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
    internal = InternalOverlay(store)
    for start, end in ranges:
        secondary_indexes.remove_range(internal, start, end)
    internal_puts, internal_deletes = internal.writes()
    results = _PutResults(
        leading_ranges,
        value,
        header,
        batch.column("client_identity"),
        batch.column("partition_key"),
        now,
    )
    return ColumnarApply(
        (itertools.chain(_items(keys, records), internal_puts), internal_deletes, ranges),
        changes,
        results,
        encoded,
        next_version_id + n,
    )
