"""Streaming a shard's whole KV to a replica that is too far behind to catch up from the log.

A snapshot is a sequence of chunks, each a self-contained Arrow IPC stream of raw
(key, value) rows in key order, internal keys included. Every chunk's schema
metadata carries its index and whether it is the last one; the first chunk's also
carries the log position the KV is the application of. The installer refuses
chunks out of order and a stream that ends before its last chunk.

The installer writes the internal keys (the applied position among them) last, after
all user data (one bulk load): a crash in the middle of an install leaves a KV without an applied
position, which reads as "empty", never one that claims a position it does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow.ipc import NotIpcStream, ipc_bytes, read_ipc
from quorumstore.protocol.types import LogPosition
from quorumstore.storage.kv import Item, KvReader, KvStore, Run
from quorumstore.wire.keys import USER_KEYS_START

CHUNK_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
    ]
)
DEFAULT_CHUNK_BYTES = 4 << 20
#: Items per chunk at most: chunks are cut by bytes long before this many.
_CHUNK_ITEMS = 1 << 20
_USER_KEYS_START = pa.scalar(USER_KEYS_START, pa.binary())

_INDEX = b"chunk_index"
_LAST = b"last"
_TERM = b"term"
_OFFSET = b"offset"
_CHECKSUM = b"checksum"


def _encode_chunk(index: int, last: bool, run: Run, position: LogPosition | None) -> bytes:
    metadata = {_INDEX: str(index).encode(), _LAST: b"1" if last else b"0"}
    if position is not None:
        metadata[_TERM] = str(position.term).encode()
        metadata[_OFFSET] = str(position.offset).encode()
        metadata[_CHECKSUM] = str(position.checksum).encode()
    schema = CHUNK_SCHEMA.with_metadata(metadata)
    keys, values = (pa.array(column, pa.binary()) for column in run)
    return ipc_bytes(pa.RecordBatch.from_arrays([keys, values], schema=schema))


def iter_snapshot_chunks(
    view: KvReader, position: LogPosition, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[bytes]:
    """Chunks of everything in `view` (a consistent snapshot), which holds `position`;
    each ends with the item that brings it to `chunk_bytes`."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    runs = view.scan_runs(b"", None, _CHUNK_ITEMS, chunk_bytes)
    # One run is held back so that the last chunk can say it is the last.
    pending: Run = next(runs, ([], []))
    index = 0
    for run in runs:
        yield _encode_chunk(index, False, pending, position if index == 0 else None)
        index += 1
        pending = run
    yield _encode_chunk(index, True, pending, position if index == 0 else None)


def _decode_chunk(data: bytes, expected_index: int) -> tuple[pa.Table, dict[bytes, bytes]]:
    try:
        table = read_ipc(data)
    except NotIpcStream as e:
        raise ValueError(f"snapshot chunk {expected_index} is not an Arrow IPC stream: {e}") from e
    metadata = table.schema.metadata or {}
    if not table.schema.equals(CHUNK_SCHEMA) or _INDEX not in metadata or _LAST not in metadata:
        raise ValueError(
            f"snapshot chunk {expected_index} has an unexpected schema:\n{table.schema}"
        )
    index = int(metadata[_INDEX])
    if index != expected_index:
        raise ValueError(
            f"snapshot chunk {index} arrived where chunk {expected_index} was expected"
        )
    return table, metadata


def _items(table: pa.Table) -> Iterator[Item]:
    return zip(table.column("key").to_pylist(), table.column("value").to_pylist())


def _clear(kv: KvStore) -> None:
    last = next(iter(kv.scan(b"", None, reverse=True)), None)
    if last is not None:
        kv.write([], [], [(b"", last[0] + b"\x00")])


def install_snapshot(kv: KvStore, chunks: Iterable[bytes]) -> LogPosition:
    """Replace everything in `kv` with the snapshot in `chunks`; return its position.

    The KV is cleared only once the first chunk has been read and checked; the user data
    goes in as one bulk load (`KvStore.load_sorted`), which writes nothing unless every
    chunk arrived and checked out, and the KV is flushed at the end. Reopen the state
    machine on `kv` afterwards.
    """
    stream = iter(chunks)
    first = next(stream, None)
    if first is None:
        raise ValueError("snapshot stream holds no chunks")
    table, metadata = _decode_chunk(first, 0)
    try:
        position = LogPosition(
            int(metadata[_TERM]), int(metadata[_OFFSET]), int(metadata[_CHECKSUM])
        )
    except KeyError as e:
        raise ValueError(f"first snapshot chunk lacks its position field {e.args[0]!r}") from None

    _clear(kv)
    internal: list[Item] = []

    def user_runs() -> Iterator[Run]:
        for chunk in _tables(table, metadata, stream):
            is_internal = pc.less(chunk.column("key"), _USER_KEYS_START)
            internal.extend(_items(chunk.filter(is_internal)))
            user = chunk.filter(pc.invert(is_internal))
            yield user.column("key").to_pylist(), user.column("value").to_pylist()

    kv.load_sorted(user_runs())
    kv.write(internal, [], [])
    kv.flush()
    return position


def _tables(
    table: pa.Table, metadata: dict[bytes, bytes], stream: Iterator[bytes]
) -> Iterator[pa.Table]:
    """The first chunk's `table`, then each next chunk's, checked, up to the last one."""
    index = 0
    while True:
        yield table
        if metadata[_LAST] == b"1":
            break
        index += 1
        data = next(stream, None)
        if data is None:
            raise ValueError(
                f"snapshot stream ended after chunk {index - 1}, before its last chunk"
            )
        table, metadata = _decode_chunk(data, index)
    if next(stream, None) is not None:
        raise ValueError(f"snapshot stream continues after its last chunk {index}")
