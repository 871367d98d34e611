"""Opening a WAL directory: its index rebuilt from the files, interrupted operations
finished and a torn tail cut.

Recovery completes an interrupted `reset` (base flag set: delete every segment) or
`trim_before` (delete segments that lie wholly at or below the base), then scans the
segments in order, checking each record's CRC and that it chains from the one before
it (the first from the base). A bad record (short header, short payload, bad magic or
bad CRC) at the end of the last segment with no valid record after it is a torn write
of entries that were never synced: the file is truncated there (logged at INFO). Any
other bad record, a gap between segments, or a chain mismatch raises `WalError` naming
the file and byte position. Recovered data is fdatasync'ed before recovery returns.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

from quorumstore.protocol.types import EMPTY_POSITION, LogPosition, chain_checksum
from quorumstore.storage.wal_format import (
    BASE_RESETTING,
    BASE_TMP,
    Record,
    Unreadable,
    WalError,
    any_record_after,
    corrupt,
    decode_record,
    read_base,
    segment_files,
    write_base_file,
)
from quorumstore.storage.wal_index import Segment, TermRuns

_log = logging.getLogger(__name__)


class RecoveredLog(NamedTuple):
    """What a WAL directory holds, indexed; its last segment's file is open for appends."""

    base: LogPosition
    head: LogPosition
    segments: list[Segment]
    terms: TermRuns


def recover(directory: Path, dir_fd: int, sync: bool) -> RecoveredLog:
    """Rebuild the index of the WAL in `directory` (whose descriptor is `dir_fd`) from disk.

    The caller closes the returned segments if it fails later; on an error here, the
    segments opened so far are closed.
    """
    recovery = _Recovery(directory, dir_fd, sync)
    try:
        recovery.run()
    except BaseException:
        for segment in recovery.segments:
            segment.close()
        raise
    return RecoveredLog(recovery.base, recovery.head, recovery.segments, recovery.terms)


class _Recovery:
    def __init__(self, directory: Path, dir_fd: int, sync: bool) -> None:
        self._directory = directory
        self._dir_fd = dir_fd
        self._sync = sync
        self.base = self.head = EMPTY_POSITION
        self.segments: list[Segment] = []
        self.terms = TermRuns()

    def run(self) -> None:
        (self._directory / BASE_TMP).unlink(missing_ok=True)
        self.base, flags = read_base(self._directory)
        files = segment_files(self._directory)
        if flags & BASE_RESETTING:
            _log.info("%s: finishing an interrupted reset to %s", self._directory, self.base)
            for _, path in files:
                os.unlink(path)
            self._fsync_dir()
            write_base_file(self._directory, self.base, 0, self._sync)
            self._fsync_dir()
            files = []
        self.head = self.base
        files = self._drop_trimmed(files)
        for number, (first_offset, path) in enumerate(files):
            self._load_segment(path, first_offset, is_last=number == len(files) - 1)
        if self.segments and self.segments[-1].size == 0:
            empty = self.segments.pop()
            _log.info("%s: deleting empty last segment", empty.path)
            empty.close()
            os.unlink(empty.path)
        if self._sync and self.segments:
            os.fdatasync(self.segments[-1].fd)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        if self._sync:
            os.fsync(self._dir_fd)

    def _drop_trimmed(self, files: list[tuple[int, Path]]) -> list[tuple[int, Path]]:
        """Delete segments wholly at or below the base (left by a trim interrupted by a crash)."""
        keep = 0
        while keep + 1 < len(files) and files[keep + 1][0] <= self.base.offset + 1:
            keep += 1
        for _, path in files[:keep]:
            _log.info("%s: deleting segment below the base %s (interrupted trim)", path, self.base)
            os.unlink(path)
        return files[keep:]

    def _load_segment(self, path: Path, first_offset: int, *, is_last: bool) -> None:
        """Scan one segment into the index, chaining each record from the head so far."""
        if first_offset != self.head.offset + 1:
            raise WalError(
                f"{path}: starts at offset {first_offset} but the log before it ends at "
                f"{self.head.offset}; a segment file is missing or misnamed: restore this "
                f"replica from its peers"
            )
        segment = Segment.open(path, first_offset)
        self.segments.append(segment)
        with open(path, "rb") as file:
            data = file.read()
        pos = 0
        while pos < len(data):
            try:
                record = decode_record(data, pos)
            except Unreadable as bad:
                if not is_last or any_record_after(data, pos):
                    raise corrupt(path, pos, f"{bad}, with more data after it") from None
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
            self.terms.note(record.term, record.offset)
            self.head = LogPosition(record.term, record.offset, record.checksum)
            pos = record.end
        segment.size = pos

    def _check_chain(self, path: Path, pos: int, record: Record, data: bytes) -> None:
        head = self.head
        payload = memoryview(data)[record.payload_start : record.end]
        if record.offset != head.offset + 1:
            problem = f"offset {record.offset} does not follow {head.offset}"
        elif record.term < head.term:
            problem = f"term {record.term} is below the previous term {head.term}"
        elif record.checksum != chain_checksum(head.checksum, record.term, record.offset, payload):
            problem = f"checksum of entry {record.offset} does not chain from {head.checksum:#x}"
        else:
            return
        raise corrupt(path, pos, problem)
