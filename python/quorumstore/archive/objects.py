"""The archive's object encodings. No I/O: bytes in, bytes out.

A **segment** is one Arrow IPC stream of committed entries as the WAL holds them (term,
offset, chain checksum, payload) plus each entry's time: the leader's clock stamped in
its write batch, raised to the time before it where it is lower (a no-op carries none,
a new leader's clock may lag), so times never decrease along a shard's log and a point
in time cuts it at one offset.

A **snapshot** is the stream `storage/snapshot.py` sends to a follower, its chunks each
framed by an 8-byte length, so that one object holds it and a reader can tell a whole
one from a cut one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO

import pyarrow as pa

from quorumstore.archive.manifest import ArchiveError
from quorumstore.arrow.ipc import NotIpcStream, ipc_bytes, read_ipc
from quorumstore.protocol.types import LogEntry, LogPosition, chain_checksum
from quorumstore.storage.write_batch import TIMESTAMP_KEY

SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("term", pa.int64(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("checksum", pa.uint64(), nullable=False),
        pa.field("time_ms", pa.int64(), nullable=False),
        pa.field("payload", pa.large_binary(), nullable=False),
    ]
)
_FRAME = struct.Struct("<Q")


def entry_times(entries: Sequence[LogEntry], floor_ms: int) -> list[int]:
    """Each entry's time, never below the one before (the first: `floor_ms`)."""
    times = []
    last = floor_ms
    for entry in entries:
        last = max(last, _stamp(entry.payload))
        times.append(last)
    return times


def _stamp(payload: bytes) -> int:
    """The write batch's timestamp, read from its schema alone; 0 for an entry that is
    no write batch (the apply refuses those too)."""
    try:
        metadata = pa.ipc.open_stream(pa.py_buffer(payload)).schema.metadata or {}
        return int(metadata.get(TIMESTAMP_KEY, b"0"))
    except (pa.ArrowException, OSError, ValueError):
        return 0


def encode_segment(entries: Sequence[LogEntry], times: Sequence[int]) -> bytes:
    return ipc_bytes(
        pa.RecordBatch.from_arrays(
            [
                pa.array([e.term for e in entries], pa.int64()),
                pa.array([e.offset for e in entries], pa.int64()),
                pa.array([e.checksum for e in entries], pa.uint64()),
                pa.array(times, pa.int64()),
                pa.array([e.payload for e in entries], pa.large_binary()),
            ],
            schema=SEGMENT_SCHEMA,
        )
    )


def decode_segment(data: bytes, name: str) -> tuple[list[LogEntry], list[int]]:
    """The entries of segment `name` and their times."""
    try:
        table = read_ipc(data)
    except NotIpcStream as e:
        raise ArchiveError(f"archived segment {name} is damaged: {e}") from e
    if not table.schema.equals(SEGMENT_SCHEMA):
        raise ArchiveError(f"archived segment {name} has an unexpected schema:\n{table.schema}")
    columns = [table.column(n).to_pylist() for n in ("term", "offset", "checksum", "payload")]
    entries = [LogEntry(*row) for row in zip(*columns)]
    return entries, table.column("time_ms").to_pylist()


def check_chain(previous: LogPosition, entries: Sequence[LogEntry], name: str) -> LogPosition:
    """The position of the last of `entries`, which must follow `previous` entry by entry
    (offsets and chain checksums): a segment of another history, or a damaged one, is
    refused rather than restored."""
    for entry in entries:
        expected = chain_checksum(previous.checksum, entry.term, entry.offset, entry.payload)
        if entry.offset != previous.offset + 1 or entry.checksum != expected:
            raise ArchiveError(
                f"archived segment {name}: entry {entry.offset} does not follow {previous} "
                "(another history, or a damaged object)"
            )
        previous = LogPosition(entry.term, entry.offset, entry.checksum)
    return previous


def frame_chunks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Snapshot chunks, each after its length."""
    for chunk in chunks:
        yield _FRAME.pack(len(chunk))
        yield chunk


def read_framed_chunks(stream: BinaryIO, name: str) -> Iterator[bytes]:
    """The chunks `frame_chunks` framed; ArchiveError if the object ends inside one."""
    while True:
        header = stream.read(_FRAME.size)
        if not header:
            return
        if len(header) < _FRAME.size:
            raise ArchiveError(f"archived snapshot {name} ends inside a chunk's length")
        (size,) = _FRAME.unpack(header)
        chunk = stream.read(size)
        if len(chunk) < size:
            raise ArchiveError(f"archived snapshot {name} ends inside a chunk")
        yield chunk
