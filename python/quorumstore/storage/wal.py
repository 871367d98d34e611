"""Write-ahead log of one shard replica: the durable form of the replicated log.

The WAL implements `LogReader` for the engine and adds the mutations a replica needs:
`append` (buffered, no fsync), `sync` (the group-commit point), `truncate_after`
(drop a divergent suffix), `trim_before` (drop a prefix covered by a snapshot) and
`reset` (start over after installing a snapshot).

On-disk format
--------------
A WAL directory holds segment files and, once a prefix was dropped, a ``base`` file.

Segment ``<first offset, 20 digits>.wal`` (e.g. ``00000000000000000042.wal``) holds the
records of consecutive offsets starting at its name. Segments are contiguous: the first
starts at ``base.offset + 1`` and each following one right after the last offset of the
one before it. Each record is a fixed 36-byte little-endian header followed by the
payload (opaque here: the Arrow IPC bytes of one record batch, built by the caller)::

    magic     u32   RECORD_MAGIC (the bytes b"QWAL")
    length    u32   payload bytes
    term      i64
    offset    i64
    checksum  u64   chain checksum (`protocol.types.chain_checksum`)
    crc       u32   zlib CRC-32 of the 32 header bytes before it, then of the payload

A new segment is started once the active one holds `segment_bytes` or more (always
after a whole record).

``base`` (36 bytes, little-endian: magic u32 = b"BASE", flags u32, term i64, offset i64,
checksum u64, crc u32 of the 32 bytes before it) is the position just before the first
entry; no file means `EMPTY_POSITION`. It is replaced atomically: write ``base.tmp``,
fsync it, rename it over ``base``, fsync the directory. Flag 1 (resetting) marks a
`reset` whose segment deletions may not have reached the disk.

Durability
----------
`append` issues one ``os.write`` per segment it touches and no fsync; `sync` makes every
append since the previous one durable with a single ``fdatasync`` (plus a directory
fsync when a segment was created). Before a new segment is created the previous one is
fdatasync'ed (rare: once per `segment_bytes`), so only the last segment can end in a
torn record. `truncate_after`, `trim_before` and `reset` are durable before returning.
With ``sync=False`` no fsync is ever issued and `synced_head` follows `head`.

Recovery
--------
`Wal.open` completes an interrupted `reset` (flag set: delete every segment) or
`trim_before` (delete segments that lie wholly at or below the base), then scans the
segments in order, checking each record's CRC and that it chains from the one before
it (the first from the base). A bad record (short header, short payload, bad magic or
bad CRC) at the end of the last segment with no valid record after it is a torn write
of entries that were never synced: the file is truncated there (logged at INFO). Any
other bad record, a gap between segments, or a chain mismatch raises `WalError` naming
the file and byte position. Recovered data is fdatasync'ed before `open` returns, so
`synced_head` starts at `head`.

Index
-----
Per segment, compact arrays (`array('q')`/`array('Q')`) hold each record's byte
position, term and checksum; a second pair of arrays holds where each term starts, so
`last_position_in_term_at_most` is a binary search. Reads use ``os.pread``; the most
recent entries are also kept in memory because followers read the tail constantly.

Thread safety: none internally; one thread owns the WAL. The group commit can still
leave that thread: `prepare_sync` hands out a `SyncTicket` whose `run` (the fdatasync)
goes on a worker thread while the owner keeps appending, and `complete_sync` records
the result back on the owner.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
import time
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from operator import attrgetter
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Self

from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, chain_checksum

_log = logging.getLogger(__name__)

#: Record header: magic, payload length, term, offset, chain checksum, crc.
RECORD_HEADER = struct.Struct("<IIqqQI")
RECORD_MAGIC = int.from_bytes(b"QWAL", "little")
_HEADER_FIELDS = struct.Struct("<IIqqQ")  # the header bytes the crc covers
_CRC = struct.Struct("<I")
_MAGIC_BYTES = _CRC.pack(RECORD_MAGIC)
_MAX_PAYLOAD = 2**32 - 1

_BASE_RECORD = struct.Struct("<IIqqQI")
_BASE_FIELDS = struct.Struct("<IIqqQ")
_BASE_MAGIC = int.from_bytes(b"BASE", "little")
_BASE_RESETTING = 1
_BASE_FILE = "base"
_BASE_TMP = "base.tmp"

_SEGMENT_NAME = re.compile(r"^(\d{20})\.wal$")

_CACHE_MAX_ENTRIES = 4096
_CACHE_MAX_BYTES = 4 * 1024 * 1024

_OPEN_SEGMENT = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC


class WalError(Exception):
    """The WAL cannot do what was asked; the message says what failed and what to do."""


class _Unreadable(Exception):
    """A record that cannot be decoded (the reason is the message)."""


class _Record(NamedTuple):
    term: int
    offset: int
    checksum: int
    payload_start: int
    end: int


def _decode_record(data: bytes, pos: int) -> _Record:
    """The record at byte `pos` of `data`, CRC-checked; raises `_Unreadable` if it is not whole."""
    if len(data) - pos < RECORD_HEADER.size:
        raise _Unreadable("short header")
    magic, length, term, offset, checksum, crc = RECORD_HEADER.unpack_from(data, pos)
    if magic != RECORD_MAGIC:
        raise _Unreadable("bad magic")
    start = pos + RECORD_HEADER.size
    end = start + length
    if end > len(data):
        raise _Unreadable("short payload")
    view = memoryview(data)
    if zlib.crc32(view[start:end], zlib.crc32(view[pos : pos + _HEADER_FIELDS.size])) != crc:
        raise _Unreadable("bad crc")
    return _Record(term, offset, checksum, start, end)


def _encode_header(entry: LogEntry) -> bytes:
    fields = _HEADER_FIELDS.pack(
        RECORD_MAGIC, len(entry.payload), entry.term, entry.offset, entry.checksum
    )
    return fields + _CRC.pack(zlib.crc32(entry.payload, zlib.crc32(fields)))


def _any_record_after(data: bytes, pos: int) -> bool:
    """Whether a valid record starts anywhere after `pos`: tells a torn tail from damage."""
    candidate = data.find(_MAGIC_BYTES, pos + 1)
    while candidate != -1:
        try:
            _decode_record(data, candidate)
            return True
        except _Unreadable:
            candidate = data.find(_MAGIC_BYTES, candidate + 1)
    return False


def _fits(count: int, total: int, size: int, max_entries: int, max_bytes: int) -> bool:
    """Whether one more entry of `size` payload bytes fits a read; the first always does."""
    return count == 0 or (count < max_entries and total + size <= max_bytes)


def _write_all(fd: int, data: bytes) -> None:
    """One os.write in practice; loops only if the kernel accepts part of the buffer."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}.wal"


class _Segment:
    """One segment file and the index of its records (arrays, not an object per entry)."""

    __slots__ = ("checksums", "fd", "first_offset", "path", "positions", "size", "terms")

    def __init__(self, path: Path, first_offset: int, fd: int) -> None:
        self.path = path
        self.first_offset = first_offset
        self.fd = fd
        self.size = 0
        self.positions = array("q")
        self.terms = array("q")
        self.checksums = array("Q")

    @property
    def last_offset(self) -> int:
        return self.first_offset + len(self.positions) - 1

    def record_end(self, index: int) -> int:
        """Byte position just after record `index`."""
        return self.positions[index + 1] if index + 1 < len(self.positions) else self.size

    def position(self, index: int) -> LogPosition:
        return LogPosition(self.terms[index], self.first_offset + index, self.checksums[index])

    def close(self) -> None:
        """Close the file once: a failed deletion must not lead to closing a reused fd."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def truncate_index(self, count: int) -> None:
        """Forget every record from index `count` on (the file is cut by the caller)."""
        self.size = self.record_end(count - 1)
        del self.positions[count:]
        del self.terms[count:]
        del self.checksums[count:]


class _TailCache:
    """The most recent entries, a contiguous suffix of the log, within a count and byte budget."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._entries: deque[LogEntry] = deque()
        self._bytes = 0

    def add(self, entries: Sequence[LogEntry]) -> None:
        for entry in entries:
            self._entries.append(entry)
            self._bytes += len(entry.payload)
        while len(self._entries) > self._max_entries or (
            self._bytes > self._max_bytes and len(self._entries) > 1
        ):
            self._bytes -= len(self._entries.popleft().payload)

    def drop_after(self, offset: int) -> None:
        while self._entries and self._entries[-1].offset > offset:
            self._bytes -= len(self._entries.pop().payload)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def read(self, from_offset: int, max_entries: int, max_bytes: int) -> list[LogEntry] | None:
        """Entries from `from_offset` within the limits, or None if they are not all cached."""
        if not self._entries or from_offset < self._entries[0].offset:
            return None
        taken: list[LogEntry] = []
        total = 0
        for index in range(from_offset - self._entries[0].offset, len(self._entries)):
            entry = self._entries[index]
            if not _fits(len(taken), total, len(entry.payload), max_entries, max_bytes):
                break
            taken.append(entry)
            total += len(entry.payload)
        return taken


class Wal:
    """A replica's log on disk; see the module docstring for the format and guarantees.

    Create it with `Wal.open`.
    """

    def __init__(self, directory: Path, dir_fd: int, segment_bytes: int, sync: bool) -> None:
        self._directory = directory
        self._dir_fd: int | None = dir_fd
        self._segment_bytes = segment_bytes
        self._sync = sync
        self._segments: list[_Segment] = []
        self._base = EMPTY_POSITION
        self._head = EMPTY_POSITION
        self._synced_head = EMPTY_POSITION
        self._term_terms = array("q")  # term of each run of equal terms ...
        self._term_starts = array("q")  # ... and the offset where that run starts
        self._cache = _TailCache(_CACHE_MAX_ENTRIES, _CACHE_MAX_BYTES)
        self._dirty = False  # appended since the last sync
        self._dir_dirty = False  # a segment was created since the last directory fsync
        self._broken: str | None = None

    # --- lifecycle -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = 64 * 1024 * 1024,
        sync: bool = True,
    ) -> Wal:
        """Open (creating it if missing) the WAL in `directory` and recover its segments."""
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        path = Path(directory)
        _make_directory(path, sync)
        wal = cls(
            path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), segment_bytes, sync
        )
        try:
            wal._lock()
            wal._recover()
        except BaseException:
            wal.close()
            raise
        return wal

    def close(self) -> None:
        """Release the files and the directory lock. Does not sync: call `sync` first."""
        for segment in self._segments:
            segment.close()
        self._segments = []
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- LogReader -------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def base(self) -> LogPosition:
        return self._base

    @property
    def head(self) -> LogPosition:
        return self._head

    @property
    def synced_head(self) -> LogPosition:
        """The head as of the last completed `sync`: what a replica may acknowledge."""
        return self._synced_head

    def position_at(self, offset: int) -> LogPosition:
        """Position of the entry at `offset`, within [base.offset, head.offset]."""
        self._check_usable()
        if offset == self._head.offset:
            return self._head
        if offset == self._base.offset:
            return self._base
        if not self._base.offset < offset < self._head.offset:
            raise WalError(
                f"no position at offset {offset}: the log holds "
                f"[{self._base.offset}, {self._head.offset}]; ask only for offsets in that range"
            )
        segment = self._segment_for(offset)
        return segment.position(offset - segment.first_offset)

    def read(self, from_offset: int, max_entries: int, max_bytes: int) -> Sequence[LogEntry]:
        """Entries from `from_offset` on: at least one if any exist, else within the limits.

        `max_bytes` counts payload bytes. Raises WalError if `from_offset` was trimmed away.
        """
        self._check_usable()
        if from_offset <= self._base.offset:
            raise WalError(
                f"offset {from_offset} was trimmed away (the log starts after "
                f"{self._base.offset}); send a snapshot instead"
            )
        if from_offset > self._head.offset:
            return []
        cached = self._cache.read(from_offset, max_entries, max_bytes)
        if cached is not None:
            return cached
        return self._read_disk(from_offset, max_entries, max_bytes)

    def last_position_in_term_at_most(self, term: int, offset: int) -> LogPosition:
        """The last position p with p.term <= term and p.offset <= offset (or base). O(log n)."""
        self._check_usable()
        limit = min(offset, self._head.offset)
        later_run = bisect_right(self._term_terms, term)
        if later_run < len(self._term_starts):
            limit = min(limit, self._term_starts[later_run] - 1)
        if limit <= self._base.offset:
            return self._base
        return self.position_at(limit)

    # --- mutations -------------------------------------------------------------------

    def append(self, entries: Sequence[LogEntry]) -> None:
        """Append `entries` after the head: one os.write per segment touched, no fsync.

        Validates everything first, so a rejected call appends nothing.
        """
        self._check_usable()
        if not entries:
            return
        self._validate(entries)
        start = 0
        while start < len(entries):
            start = self._write_chunk(self._writable_segment(entries[start].offset), entries, start)
        self._cache.add(entries)

    def sync(self) -> None:
        """Group commit: make every append so far durable with one fdatasync."""
        ticket = self.prepare_sync()
        ticket.run()
        self.complete_sync(ticket)

    def prepare_sync(self) -> SyncTicket:
        """Starts a group commit that may run on another thread while appends go on.

        The ticket holds duplicates of the file descriptors to sync, so a segment roll or
        close on the owning thread cannot pull them away; it covers the head as of now.
        """
        self._check_usable()
        fds: list[int] = []
        if self._sync and self._dirty:
            fds.append(os.dup(self._segments[-1].fd))
            if self._dir_dirty:
                fds.append(os.dup(self._require_dir_fd()))
        self._dirty = False
        self._dir_dirty = False
        return SyncTicket(self._head, fds, str(self._segments[-1].path) if self._segments else "")

    def complete_sync(self, ticket: SyncTicket) -> None:
        """Records what `ticket` made durable (called on the owning thread)."""
        if ticket.error is not None:
            raise self._fail(f"fsync of {ticket.path}", ticket.error)
        synced = ticket.head if ticket.head.offset <= self._head.offset else self._head
        if synced.offset > self._synced_head.offset or self._synced_head.offset > self._head.offset:
            self._synced_head = synced

    def truncate_after(self, offset: int) -> None:
        """Durably remove every entry with offset > `offset` (a divergent suffix)."""
        self._check_usable()
        if not self._base.offset <= offset <= self._head.offset:
            raise WalError(
                f"cannot truncate after offset {offset}: the log holds "
                f"[{self._base.offset}, {self._head.offset}]; truncate to an offset in that range"
            )
        if offset == self._head.offset:
            return
        new_head = self.position_at(offset)
        kept = [s for s in self._segments if s.first_offset <= offset]
        doomed = self._segments[len(kept) :]
        try:
            # Later segments go first, so a crash leaves a contiguous (if longer) log.
            self._delete_segments(reversed(doomed))
            self._segments = kept
            self._fsync_dir()
            if kept:
                self._cut_segment(kept[-1], offset)
        except OSError as exc:
            raise self._fail(f"truncating the log after offset {offset}", exc) from exc
        while self._term_starts and self._term_starts[-1] > offset:
            self._term_starts.pop()
            self._term_terms.pop()
        self._cache.drop_after(offset)
        self._head = self._synced_head = new_head
        self._dirty = self._dir_dirty = False

    def first_offset_within(self, upto: int, max_bytes: int) -> int:
        """The lowest offset from which the records held through `upto` take at most
        `max_bytes` of segment space (headers included): just past the last of them when it
        alone is larger, and `upto + 1` when none is held (all lie below the base)."""
        self._check_usable()
        if upto <= self._base.offset:
            return upto + 1
        room = max_bytes
        for segment in reversed(self._segments):
            last = min(segment.last_offset, upto) - segment.first_offset
            if last < 0:
                continue
            end = segment.record_end(last)
            if end - segment.positions[0] > room:
                # The first record of the run that still fits: it starts at end - room or later.
                return segment.first_offset + bisect_left(
                    segment.positions, end - room, 0, last + 1
                )
            room -= end - segment.positions[0]
        return self._base.offset + 1

    def can_trim_before(self, offset: int) -> bool:
        """Whether `trim_before(offset)` would delete a segment (it keeps the active one)."""
        self._check_usable()
        return len(self._segments) > 1 and self._segments[0].last_offset < offset

    def trim_before(self, offset: int) -> None:
        """Durably delete whole segments whose entries all lie below `offset` (never the active).

        The base becomes the last deleted entry. Callers keep `offset` <= the commit offset.
        """
        self._check_usable()
        doomed: list[_Segment] = []
        for segment in self._segments[:-1]:
            if segment.last_offset >= offset:
                break
            doomed.append(segment)
        if not doomed:
            return
        new_base = doomed[-1].position(len(doomed[-1].positions) - 1)
        try:
            # The base goes first: open deletes segments left below it by a crash.
            self._write_base(new_base, 0)
            self._delete_segments(doomed)
            self._segments = self._segments[len(doomed) :]
            self._fsync_dir()
        except OSError as exc:
            raise self._fail(f"trimming the log before offset {offset}", exc) from exc
        self._base = new_base
        self._forget_terms_through(new_base.offset)

    def reset(self, base: LogPosition) -> None:
        """Durably drop every entry and start an empty log after `base` (an installed snapshot)."""
        self._check_usable()
        try:
            # The flag makes this atomic: open finishes the deletions if we crash midway.
            self._write_base(base, _BASE_RESETTING)
            self._delete_segments(self._segments)
            self._segments = []
            self._fsync_dir()
            self._write_base(base, 0)
        except OSError as exc:
            raise self._fail(f"resetting the log to {base}", exc) from exc
        self._base = self._head = self._synced_head = base
        self._term_terms = array("q")
        self._term_starts = array("q")
        self._cache.clear()
        self._dirty = self._dir_dirty = False

    # --- append internals ------------------------------------------------------------

    def _validate(self, entries: Sequence[LogEntry]) -> None:
        """Check offsets, terms and the checksum chain of `entries` against the head."""
        term, offset, checksum = self._head.term, self._head.offset, self._head.checksum
        for entry in entries:
            if entry.offset != offset + 1:
                raise WalError(
                    f"entry offset {entry.offset} does not follow offset {offset} "
                    f"(head {self._head.entry_id}); append consecutive entries after the head"
                )
            if entry.term < term:
                raise WalError(
                    f"entry {entry.entry_id} has a lower term than the entry before it "
                    f"(term {term}); terms in the log must not decrease"
                )
            expected = chain_checksum(checksum, entry.term, entry.offset, entry.payload)
            if entry.checksum != expected:
                raise WalError(
                    f"entry {entry.entry_id} has checksum {entry.checksum:#x}, expected "
                    f"{expected:#x} chained from {checksum:#x}; build entries with "
                    f"make_entry from the current head"
                )
            if len(entry.payload) > _MAX_PAYLOAD:
                raise WalError(
                    f"entry {entry.entry_id} has a {len(entry.payload)}-byte payload, over "
                    f"the {_MAX_PAYLOAD}-byte record limit; split the write batch"
                )
            term, offset, checksum = entry.term, entry.offset, entry.checksum

    def _writable_segment(self, first_offset: int) -> _Segment:
        """The active segment, or a new one starting at `first_offset` if it is full."""
        if self._segments and self._segments[-1].size < self._segment_bytes:
            return self._segments[-1]
        try:
            if self._segments:
                self._seal(self._segments[-1])
            path = self._directory / _segment_name(first_offset)
            fd = os.open(path, _OPEN_SEGMENT | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise self._fail(f"starting segment {_segment_name(first_offset)}", exc) from exc
        self._segments.append(_Segment(path, first_offset, fd))
        self._dir_dirty = True
        return self._segments[-1]

    def _seal(self, segment: _Segment) -> None:
        """Make a full segment durable before its successor exists: only the last can tear."""
        if self._sync:
            os.fdatasync(segment.fd)
            if self._dir_dirty:
                os.fsync(self._require_dir_fd())
                self._dir_dirty = False

    def _write_chunk(self, segment: _Segment, entries: Sequence[LogEntry], start: int) -> int:
        """Write entries from `start` while `segment` has room (one os.write); return the next."""
        parts: list[bytes] = []
        positions = array("q")
        position = segment.size
        stop = start
        while stop < len(entries) and position < self._segment_bytes:
            entry = entries[stop]
            header = _encode_header(entry)
            parts += (header, entry.payload)
            positions.append(position)
            position += len(header) + len(entry.payload)
            stop += 1
        try:
            _write_all(segment.fd, b"".join(parts))
        except OSError as exc:
            raise self._fail(f"writing to {segment.path}", exc) from exc
        segment.size = position
        segment.positions.extend(positions)
        for index in range(start, stop):
            entry = entries[index]
            segment.terms.append(entry.term)
            segment.checksums.append(entry.checksum)
            self._note_term(entry.term, entry.offset)
        last = entries[stop - 1]
        self._head = LogPosition(last.term, last.offset, last.checksum)
        self._dirty = True
        return stop

    def _note_term(self, term: int, offset: int) -> None:
        if not self._term_terms or self._term_terms[-1] != term:
            self._term_terms.append(term)
            self._term_starts.append(offset)

    def _forget_terms_through(self, offset: int) -> None:
        """Drop the term runs that end at or before `offset` (trimmed away)."""
        run = bisect_right(self._term_starts, offset + 1) - 1
        if run > 0:
            del self._term_terms[:run]
            del self._term_starts[:run]

    # --- read internals --------------------------------------------------------------

    def _segment_for(self, offset: int) -> _Segment:
        return self._segments[
            bisect_right(self._segments, offset, key=attrgetter("first_offset")) - 1
        ]

    def _read_disk(self, from_offset: int, max_entries: int, max_bytes: int) -> list[LogEntry]:
        """Read with one os.pread per segment touched, sized from the index."""
        taken: list[LogEntry] = []
        total = 0
        offset = from_offset
        while offset <= self._head.offset:
            segment = self._segment_for(offset)
            first = index = offset - segment.first_offset
            while index < len(segment.positions):
                size = segment.record_end(index) - segment.positions[index] - RECORD_HEADER.size
                if not _fits(len(taken) + index - first, total, size, max_entries, max_bytes):
                    break
                total += size
                index += 1
            if index == first:
                break
            taken += self._read_records(segment, first, index)
            offset = segment.first_offset + index
        return taken

    def _read_records(self, segment: _Segment, first: int, stop: int) -> list[LogEntry]:
        """Records [first, stop) of `segment`, CRC-checked against the file and the index."""
        start = segment.positions[first]
        length = segment.record_end(stop - 1) - start
        try:
            data = os.pread(segment.fd, length, start)
        except OSError as exc:
            raise WalError(f"reading {segment.path} failed: {exc}; check the disk") from exc
        if len(data) != length:
            raise WalError(
                f"{segment.path}: read {len(data)} of {length} bytes at byte {start}; the file "
                f"was cut behind the WAL's back: restore this replica from its peers"
            )
        entries = []
        pos = 0
        for index in range(first, stop):
            try:
                record = _decode_record(data, pos)
            except _Unreadable as bad:
                raise _corrupt(segment.path, start + pos, str(bad)) from None
            if (
                record.offset != segment.first_offset + index
                or record.checksum != segment.checksums[index]
            ):
                raise _corrupt(segment.path, start + pos, "record does not match the index")
            entries.append(
                LogEntry(
                    record.term,
                    record.offset,
                    record.checksum,
                    data[record.payload_start : record.end],
                )
            )
            pos = record.end
        return entries

    # --- file internals --------------------------------------------------------------

    def _require_dir_fd(self) -> int:
        if self._dir_fd is None:
            raise WalError(f"the WAL in {self._directory} is closed; open it again")
        return self._dir_fd

    def _check_usable(self) -> None:
        self._require_dir_fd()
        if self._broken is not None:
            raise WalError(self._broken)

    def _fail(self, action: str, exc: OSError) -> WalError:
        """Refuse further use: after a failed write or fsync, memory and disk may disagree."""
        self._broken = (
            f"{action} failed ({exc}); this WAL is unusable now: close it and open it again "
            f"to recover what is on disk"
        )
        return WalError(self._broken)

    def _lock(self) -> None:
        try:
            fcntl.flock(self._require_dir_fd(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WalError(
                f"the WAL in {self._directory} is already open (in this or another process); "
                f"close that one first"
            ) from None

    def _fsync_dir(self) -> None:
        if self._sync:
            os.fsync(self._require_dir_fd())

    def _delete_segments(self, segments: Iterable[_Segment]) -> None:
        """Close and unlink `segments`; the caller fsyncs the directory."""
        for segment in segments:
            segment.close()
            os.unlink(segment.path)

    def _cut_segment(self, segment: _Segment, offset: int) -> None:
        """Durably cut `segment` (the new last one) right after the entry at `offset`."""
        segment.truncate_index(offset - segment.first_offset + 1)
        os.ftruncate(segment.fd, segment.size)
        if self._sync:
            os.fdatasync(segment.fd)

    def _write_base(self, base: LogPosition, flags: int) -> None:
        """Atomically replace the base file: tmp file, fsync, rename, fsync the directory."""
        fields = _BASE_FIELDS.pack(_BASE_MAGIC, flags, base.term, base.offset, base.checksum)
        tmp = self._directory / _BASE_TMP
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, fields + _CRC.pack(zlib.crc32(fields)))
            if self._sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._directory / _BASE_FILE)
        self._fsync_dir()

    # --- recovery --------------------------------------------------------------------

    def _recover(self) -> None:
        """Rebuild the index from disk, finishing interrupted operations and cutting a torn tail."""
        (self._directory / _BASE_TMP).unlink(missing_ok=True)
        base, flags = self._read_base()
        files = self._segment_files()
        if flags & _BASE_RESETTING:
            _log.info("%s: finishing an interrupted reset to %s", self._directory, base)
            for _, path in files:
                os.unlink(path)
            self._fsync_dir()
            self._write_base(base, 0)
            files = []
        self._base = self._head = base
        files = self._drop_trimmed(files)
        for number, (first_offset, path) in enumerate(files):
            self._load_segment(path, first_offset, is_last=number == len(files) - 1)
        if self._segments and self._segments[-1].size == 0:
            empty = self._segments.pop()
            _log.info("%s: deleting empty last segment", empty.path)
            self._delete_segments([empty])
        if self._sync and self._segments:
            os.fdatasync(self._segments[-1].fd)
        self._fsync_dir()
        self._synced_head = self._head

    def _read_base(self) -> tuple[LogPosition, int]:
        path = self._directory / _BASE_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return EMPTY_POSITION, 0
        if len(data) != _BASE_RECORD.size:
            raise _corrupt(path, 0, f"base file is {len(data)} bytes, expected {_BASE_RECORD.size}")
        magic, flags, term, offset, checksum, crc = _BASE_RECORD.unpack(data)
        if magic != _BASE_MAGIC or zlib.crc32(data[: _BASE_FIELDS.size]) != crc:
            raise _corrupt(path, 0, "bad magic or crc in the base file")
        return LogPosition(term, offset, checksum), flags

    def _segment_files(self) -> list[tuple[int, Path]]:
        """(first offset, path) of every segment file, in log order."""
        files = []
        for name in os.listdir(self._directory):
            match = _SEGMENT_NAME.match(name)
            if match:
                files.append((int(match.group(1)), self._directory / name))
        return sorted(files)

    def _drop_trimmed(self, files: list[tuple[int, Path]]) -> list[tuple[int, Path]]:
        """Delete segments wholly at or below the base (left by a trim interrupted by a crash)."""
        keep = 0
        while keep + 1 < len(files) and files[keep + 1][0] <= self._base.offset + 1:
            keep += 1
        for _, path in files[:keep]:
            _log.info("%s: deleting segment below the base %s (interrupted trim)", path, self._base)
            os.unlink(path)
        return files[keep:]

    def _load_segment(self, path: Path, first_offset: int, *, is_last: bool) -> None:
        """Scan one segment into the index, chaining each record from the head so far."""
        if first_offset != self._head.offset + 1:
            raise WalError(
                f"{path}: starts at offset {first_offset} but the log before it ends at "
                f"{self._head.offset}; a segment file is missing or misnamed: restore this "
                f"replica from its peers"
            )
        segment = _Segment(path, first_offset, os.open(path, _OPEN_SEGMENT))
        self._segments.append(segment)
        with open(path, "rb") as file:
            data = file.read()
        pos = 0
        while pos < len(data):
            try:
                record = _decode_record(data, pos)
            except _Unreadable as bad:
                if not is_last or _any_record_after(data, pos):
                    raise _corrupt(path, pos, f"{bad}, with more data after it") from None
                _log.info(
                    "%s: torn record at byte %d (%s), cutting %d unsynced bytes",
                    path,
                    pos,
                    bad,
                    len(data) - pos,
                )
                os.ftruncate(segment.fd, pos)
                break
            self._check_chain(path, pos, record, data)
            segment.positions.append(pos)
            segment.terms.append(record.term)
            segment.checksums.append(record.checksum)
            self._note_term(record.term, record.offset)
            self._head = LogPosition(record.term, record.offset, record.checksum)
            pos = record.end
        segment.size = pos

    def _check_chain(self, path: Path, pos: int, record: _Record, data: bytes) -> None:
        head = self._head
        payload = memoryview(data)[record.payload_start : record.end]
        if record.offset != head.offset + 1:
            problem = f"offset {record.offset} does not follow {head.offset}"
        elif record.term < head.term:
            problem = f"term {record.term} is below the previous term {head.term}"
        elif record.checksum != chain_checksum(head.checksum, record.term, record.offset, payload):
            problem = f"checksum of entry {record.offset} does not chain from {head.checksum:#x}"
        else:
            return
        raise _corrupt(path, pos, problem)


class SyncTicket:
    """One group commit in flight: `run` does the fdatasyncs (on any thread)."""

    def __init__(self, head: LogPosition, fds: list[int], path: str) -> None:
        self.head = head
        self.path = path
        self.error: OSError | None = None
        #: How long `run`'s fdatasyncs took (0 until it ran).
        self.seconds = 0.0
        self._fds = fds

    def run(self) -> None:
        started = time.perf_counter()
        try:
            for fd in self._fds:
                os.fdatasync(fd)
        except OSError as exc:
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - started
            for fd in self._fds:
                os.close(fd)
            self._fds = []


def _corrupt(path: Path, pos: int, problem: str) -> WalError:
    return WalError(
        f"{path}: corrupt at byte {pos} ({problem}); the log is damaged, not just torn: "
        f"restore this replica from a snapshot or its peers"
    )


def _make_directory(path: Path, sync: bool) -> None:
    """Create `path` and its missing parents, durably when `sync` is on."""
    missing = []
    ancestor = path
    while not ancestor.exists():
        missing.append(ancestor)
        ancestor = ancestor.parent
    path.mkdir(parents=True, exist_ok=True)
    if sync:
        for created in missing:
            fd = os.open(created.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
