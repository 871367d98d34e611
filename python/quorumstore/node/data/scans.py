"""Records of one KV snapshot as Arrow IPC chunks: by keys, by ranges, through an index,
and the cutting of ranges into pieces of bounded size."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pyarrow as pa

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.storage.kv import KvReader
from quorumstore.storage.reads import ShardReader
from quorumstore.storage.records import Record
from quorumstore.wire.schemas import INDEX_SCAN_SCHEMA, SCAN_SCHEMA


def _records_of_keys(reader: ShardReader, keys: Sequence[str]) -> pa.RecordBatch:
    found = [
        (key, record) for key in dict.fromkeys(keys) if (record := reader.get(key)) is not None
    ]
    return pa.RecordBatch.from_arrays(_record_columns(found), schema=SCAN_SCHEMA)


def index_chunks(
    view: KvReader, index_name: str, low: str, high: str, batch_rows: int
) -> Iterator[bytes]:
    """INDEX_SCAN_SCHEMA batches of the records index `index_name` finds in [low, high)."""
    entries = ShardReader(view).range_scan_by_index(index_name, low, high)
    while chunk := list(itertools.islice(entries, batch_rows)):
        columns = _record_columns([(primary, record) for primary, _, record in chunk])
        secondary = pa.array([secondary for _, secondary, _ in chunk], pa.string())
        yield ipc_bytes(pa.RecordBatch.from_arrays([*columns, secondary], schema=INDEX_SCAN_SCHEMA))


def _record_columns(found: Sequence[tuple[str, Record]]) -> list[pa.Array]:
    """SCAN_SCHEMA's columns of (key, record) pairs."""
    columns = [
        [key for key, _ in found],
        [r.value for _, r in found],
        [r.version_id for _, r in found],
        [r.modifications_count for _, r in found],
        [r.created_ms for _, r in found],
        [r.modified_ms for _, r in found],
    ]
    return [pa.array(c, f.type) for c, f in zip(columns, SCAN_SCHEMA)]


def scan_chunks(
    view: KvReader, ranges: Sequence[tuple[str, str]], keys: Sequence[str], batch_rows: int
) -> Iterator[bytes]:
    """SCAN_SCHEMA batches of the records of `keys`, then of each range."""
    reader = ShardReader(view)
    if keys:
        batch = _records_of_keys(reader, keys)
        if batch.num_rows:
            yield ipc_bytes(batch)
    for low, high in ranges:
        for batch in reader.scan_arrow(low, high, batch_rows):
            yield ipc_bytes(batch)


def split(
    view: KvReader, ranges: Sequence[tuple[str, str]], max_rows: int
) -> list[tuple[str, str]]:
    """`ranges` cut so that each piece holds at most `max_rows` keys of the snapshot."""
    reader = ShardReader(view)
    if reader.next_version_id <= max_rows:
        return list(ranges)  # every live key was put once at least: no range can be larger
    out: list[tuple[str, str]] = []
    for low, high in ranges:
        start = low
        count = 0
        for key in reader.list_keys(low, high):
            if count == max_rows:
                out.append((start, key))
                start, count = key, 0
            count += 1
        out.append((start, high))
    return out
