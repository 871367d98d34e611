"""Write-ahead log of one shard replica: the durable form of the replicated log.

The WAL implements `LogReader` for the engine and adds the mutations a replica needs:
`append` (buffered, no fsync), `sync` (the group-commit point), `truncate_after`
(drop a divergent suffix), `trim_before` (drop a prefix covered by a snapshot) and
`reset` (start over after installing a snapshot).

The bytes on disk are `wal_format`'s; `Wal.open` recovers them with `wal_recovery`.

Durability
----------
`append` issues one ``os.write`` per segment it touches and no fsync; `sync` makes every
append since the previous one durable with a single ``fdatasync`` (plus a directory
fsync when a segment was created). Before a new segment is created the previous one is
fdatasync'ed (rare: once per `segment_bytes`), so only the last segment can end in a
torn record. `truncate_after`, `trim_before` and `reset` are durable before returning.
With ``sync=False`` no fsync is ever issued and `synced_head` follows `head`.

The index of segments, term runs and the cached tail is `wal_index`'s; reads use
``os.pread``.

Thread safety: none internally; one thread owns the WAL. The group commit can still
leave that thread: `prepare_sync` hands out a `SyncTicket` whose `run` (the fdatasync)
goes on a worker thread while the owner keeps appending, and `complete_sync` records
the result back on the owner.
"""

from __future__ import annotations

import fcntl
import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from operator import attrgetter
from pathlib import Path
from types import TracebackType
from typing import Self

from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, chain_checksum
from quorumstore.storage.wal_format import (
    BASE_RESETTING,
    MAX_PAYLOAD,
    RECORD_HEADER,
    WalError,
    encode_header,
    segment_name,
    write_all,
    write_base_file,
)
from quorumstore.storage.wal_index import Segment, TailCache, TermRuns, fits
from quorumstore.storage.wal_recovery import recover
from quorumstore.storage.wal_sync import SyncTicket

_CACHE_MAX_ENTRIES = 4096
_CACHE_MAX_BYTES = 4 * 1024 * 1024


class Wal:
    """A replica's log on disk; see the module docstring for the format and guarantees.

    Create it with `Wal.open`.
    """

    def __init__(self, directory: Path, dir_fd: int, segment_bytes: int, sync: bool) -> None:
        self._directory = directory
        self._dir_fd: int | None = dir_fd
        self._segment_bytes = segment_bytes
        self._sync = sync
        self._segments: list[Segment] = []
        self._base = EMPTY_POSITION
        self._head = EMPTY_POSITION
        self._synced_head = EMPTY_POSITION
        self._terms = TermRuns()
        self._cache = TailCache(_CACHE_MAX_ENTRIES, _CACHE_MAX_BYTES)
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
            recovered = recover(path, wal._require_dir_fd(), sync)
            wal._base, wal._head, wal._segments, wal._terms = recovered
            wal._synced_head = wal._head
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
        term_end = self._terms.last_offset_within(term)
        if term_end is not None:
            limit = min(limit, term_end)
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
        self._terms.drop_after(offset)
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
        doomed: list[Segment] = []
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
        self._terms.forget_through(new_base.offset)

    def reset(self, base: LogPosition) -> None:
        """Durably drop every entry and start an empty log after `base` (an installed snapshot)."""
        self._check_usable()
        try:
            # The flag makes this atomic: open finishes the deletions if we crash midway.
            self._write_base(base, BASE_RESETTING)
            self._delete_segments(self._segments)
            self._segments = []
            self._fsync_dir()
            self._write_base(base, 0)
        except OSError as exc:
            raise self._fail(f"resetting the log to {base}", exc) from exc
        self._base = self._head = self._synced_head = base
        self._terms = TermRuns()
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
            if len(entry.payload) > MAX_PAYLOAD:
                raise WalError(
                    f"entry {entry.entry_id} has a {len(entry.payload)}-byte payload, over "
                    f"the {MAX_PAYLOAD}-byte record limit; split the write batch"
                )
            term, offset, checksum = entry.term, entry.offset, entry.checksum

    def _writable_segment(self, first_offset: int) -> Segment:
        """The active segment, or a new one starting at `first_offset` if it is full."""
        if self._segments and self._segments[-1].size < self._segment_bytes:
            return self._segments[-1]
        try:
            if self._segments:
                self._seal(self._segments[-1])
            segment = Segment.open(
                self._directory / segment_name(first_offset), first_offset, create=True
            )
        except OSError as exc:
            raise self._fail(f"starting segment {segment_name(first_offset)}", exc) from exc
        self._segments.append(segment)
        self._dir_dirty = True
        return self._segments[-1]

    def _seal(self, segment: Segment) -> None:
        """Make a full segment durable before its successor exists: only the last can tear."""
        if self._sync:
            os.fdatasync(segment.fd)
            if self._dir_dirty:
                os.fsync(self._require_dir_fd())
                self._dir_dirty = False

    def _write_chunk(self, segment: Segment, entries: Sequence[LogEntry], start: int) -> int:
        """Write entries from `start` while `segment` has room (one os.write); return the next."""
        parts: list[bytes] = []
        positions = array("q")
        position = segment.size
        stop = start
        while stop < len(entries) and position < self._segment_bytes:
            entry = entries[stop]
            header = encode_header(entry)
            parts += (header, entry.payload)
            positions.append(position)
            position += len(header) + len(entry.payload)
            stop += 1
        try:
            write_all(segment.fd, b"".join(parts))
        except OSError as exc:
            raise self._fail(f"writing to {segment.path}", exc) from exc
        segment.size = position
        segment.positions.extend(positions)
        for index in range(start, stop):
            entry = entries[index]
            segment.terms.append(entry.term)
            segment.checksums.append(entry.checksum)
            self._terms.note(entry.term, entry.offset)
        last = entries[stop - 1]
        self._head = LogPosition(last.term, last.offset, last.checksum)
        self._dirty = True
        return stop

    # --- read internals --------------------------------------------------------------

    def _segment_for(self, offset: int) -> Segment:
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
                if not fits(len(taken) + index - first, total, size, max_entries, max_bytes):
                    break
                total += size
                index += 1
            if index == first:
                break
            taken += segment.read_records(first, index)
            offset = segment.first_offset + index
        return taken

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

    def _delete_segments(self, segments: Iterable[Segment]) -> None:
        """Close and unlink `segments`; the caller fsyncs the directory."""
        for segment in segments:
            segment.close()
            os.unlink(segment.path)

    def _cut_segment(self, segment: Segment, offset: int) -> None:
        """Durably cut `segment` (the new last one) right after the entry at `offset`."""
        segment.truncate_index(offset - segment.first_offset + 1)
        os.ftruncate(segment.fd, segment.size)
        if self._sync:
            os.fdatasync(segment.fd)

    def _write_base(self, base: LogPosition, flags: int) -> None:
        """Atomically replace the base file: tmp file, fsync, rename, fsync the directory."""
        write_base_file(self._directory, base, flags, self._sync)
        self._fsync_dir()


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
