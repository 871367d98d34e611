"""Where the WAL finds its entries: per segment, the byte position, term and checksum
of each record in compact arrays (`array('q')`/`array('Q')`, not an object per entry);
the runs of equal terms, so the last position of a term is a binary search; and the
most recent entries in memory, since followers read the tail constantly."""

from __future__ import annotations

import os
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from quorumstore.protocol.types import LogEntry, LogPosition
from quorumstore.storage.wal_format import Unreadable, WalError, corrupt, decode_record

_OPEN_SEGMENT = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC


def fits(count: int, total: int, size: int, max_entries: int, max_bytes: int) -> bool:
    """Whether one more entry of `size` payload bytes fits a read; the first always does."""
    return count == 0 or (count < max_entries and total + size <= max_bytes)


class Segment:
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

    @classmethod
    def open(cls, path: Path, first_offset: int, *, create: bool = False) -> Segment:
        """The segment file at `path`, opened for appends; `create` makes a new file."""
        flags = _OPEN_SEGMENT | os.O_CREAT | os.O_EXCL if create else _OPEN_SEGMENT
        return cls(path, first_offset, os.open(path, flags, 0o644))

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

    def read_records(self, first: int, stop: int) -> list[LogEntry]:
        """Records [first, stop) with one os.pread, CRC-checked against the file and the index."""
        start = self.positions[first]
        length = self.record_end(stop - 1) - start
        try:
            data = os.pread(self.fd, length, start)
        except OSError as exc:
            raise WalError(f"reading {self.path} failed: {exc}; check the disk") from exc
        if len(data) != length:
            raise WalError(
                f"{self.path}: read {len(data)} of {length} bytes at byte {start}; the file "
                f"was cut behind the WAL's back: restore this replica from its peers"
            )
        entries = []
        pos = 0
        for index in range(first, stop):
            try:
                record = decode_record(data, pos)
            except Unreadable as bad:
                raise corrupt(self.path, start + pos, str(bad)) from None
            if (
                record.offset != self.first_offset + index
                or record.checksum != self.checksums[index]
            ):
                raise corrupt(self.path, start + pos, "record does not match the index")
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


class TermRuns:
    """The offset where each run of equal terms starts, in log order."""

    def __init__(self) -> None:
        self._terms = array("q")  # term of each run of equal terms ...
        self._starts = array("q")  # ... and the offset where that run starts

    def note(self, term: int, offset: int) -> None:
        """Records that the entry at `offset` (the next one) has `term`."""
        if not self._terms or self._terms[-1] != term:
            self._terms.append(term)
            self._starts.append(offset)

    def last_offset_within(self, term: int) -> int | None:
        """The offset before the first entry of a term above `term` (None: no such entry)."""
        later_run = bisect_right(self._terms, term)
        return self._starts[later_run] - 1 if later_run < len(self._starts) else None

    def drop_after(self, offset: int) -> None:
        """Drop the runs that start after `offset` (truncated away)."""
        while self._starts and self._starts[-1] > offset:
            self._starts.pop()
            self._terms.pop()

    def forget_through(self, offset: int) -> None:
        """Drop the runs that end at or before `offset` (trimmed away)."""
        run = bisect_right(self._starts, offset + 1) - 1
        if run > 0:
            del self._terms[:run]
            del self._starts[:run]


class TailCache:
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
            if not fits(len(taken), total, len(entry.payload), max_entries, max_bytes):
                break
            taken.append(entry)
            total += len(entry.payload)
        return taken
