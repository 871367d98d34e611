"""The change log of one KV snapshot as Arrow IPC chunks, cut at entry boundaries."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.node.data.errors import invalid
from quorumstore.storage import change_log
from quorumstore.storage.kv import KvReader

#: Columns of a ReadChanges chunk: the change log's, then the entry's offset and time.
CHANGE_ROWS_SCHEMA = change_log.CHANGES_SCHEMA.append(
    pa.field("offset", pa.int64(), nullable=False)
).append(pa.field("timestamp_ms", pa.int64(), nullable=False))


def change_chunks(
    view: KvReader, start_exclusive: int, end_inclusive: int, max_rows: int, skip_rows: int = 0
) -> Iterator[tuple[bytes, int]]:
    """(IPC of CHANGE_ROWS_SCHEMA rows, offset up to which every entry has been sent
    whole). Entries are kept whole in a chunk of at most `max_rows` rows; only an entry
    with more rows than that is split. `skip_rows` rows of the first entry are left out
    (a stream resumed inside a split entry)."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    whole = start_exclusive
    for offset, timestamp_ms, changes in change_log.read_changes(
        view, start_exclusive, end_inclusive
    ):
        n = changes.num_rows
        entry = changes.append_column(
            CHANGE_ROWS_SCHEMA.field("offset"), pa.repeat(pa.scalar(offset, pa.int64()), n)
        ).append_column(
            CHANGE_ROWS_SCHEMA.field("timestamp_ms"),
            pa.repeat(pa.scalar(timestamp_ms, pa.int64()), n),
        )
        if skip_rows:
            if skip_rows >= n:
                raise invalid(f"skip_rows {skip_rows} leaves nothing of entry {offset} ({n} rows)")
            entry, skip_rows = entry.slice(skip_rows), 0
        if pending and rows + entry.num_rows > max_rows:
            yield ipc_bytes(pa.concat_batches(pending)), whole
            pending, rows = [], 0
        while entry.num_rows > max_rows:
            yield ipc_bytes(entry.slice(0, max_rows)), offset - 1
            entry = entry.slice(max_rows)
        pending.append(entry)
        rows += entry.num_rows
        whole = offset
    if pending:
        yield ipc_bytes(pa.concat_batches(pending)), whole
