"""An in-memory log with a disk's crash semantics (like etcd-raft's MemoryStorage).

Used by the deterministic simulator and by scenario tests.

Appended entries are volatile until `sync()`; `crash()` keeps only synced entries.
Truncation, reset and trimming are durable at once, as the real WAL makes them.
"""

from __future__ import annotations

from collections.abc import Sequence

from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition


class MemoryLog:
    def __init__(self) -> None:
        self._base = EMPTY_POSITION
        self._entries: list[LogEntry] = []
        self._durable = 0

    # --- LogReader ---------------------------------------------------------------

    @property
    def base(self) -> LogPosition:
        return self._base

    @property
    def head(self) -> LogPosition:
        if not self._entries:
            return self._base
        e = self._entries[-1]
        return LogPosition(e.term, e.offset, e.checksum)

    def position_at(self, offset: int) -> LogPosition:
        if offset == self._base.offset:
            return self._base
        index = offset - self._base.offset - 1
        if index < 0 or index >= len(self._entries):
            raise IndexError(f"offset {offset} outside ({self._base.offset}, {self.head.offset}]")
        e = self._entries[index]
        return LogPosition(e.term, e.offset, e.checksum)

    def entry(self, offset: int) -> LogEntry:
        return self._entries[offset - self._base.offset - 1]

    def read(self, from_offset: int, max_entries: int, max_bytes: int) -> Sequence[LogEntry]:
        if from_offset <= self._base.offset:
            raise IndexError(f"offset {from_offset} was trimmed (base {self._base.offset})")
        start = from_offset - self._base.offset - 1
        out: list[LogEntry] = []
        size = 0
        for e in self._entries[start : start + max_entries]:
            if out and size + len(e.payload) > max_bytes:
                break
            out.append(e)
            size += len(e.payload)
        return out

    def last_position_in_term_at_most(self, term: int, offset: int) -> LogPosition:
        last = min(offset, self.head.offset) - self._base.offset - 1
        for index in range(last, -1, -1):
            e = self._entries[index]
            if e.term <= term:
                return LogPosition(e.term, e.offset, e.checksum)
        return self._base

    # --- writes ------------------------------------------------------------------

    def append(self, entries: Sequence[LogEntry]) -> None:
        for e in entries:
            assert e.offset == self.head.offset + 1, (e.offset, self.head)
            self._entries.append(e)

    def truncate_after(self, offset: int) -> None:
        keep = offset - self._base.offset
        assert keep >= 0, (offset, self._base)
        del self._entries[keep:]
        self._durable = min(self._durable, keep)

    def reset(self, base: LogPosition) -> None:
        self._base = base
        self._entries = []
        self._durable = 0

    def trim_before(self, offset: int) -> None:
        """Drops entries below `offset`; the entry just before it becomes the base."""
        drop = offset - 1 - self._base.offset
        if drop <= 0 or drop > len(self._entries):
            return
        self._base = self.position_at(offset - 1)
        del self._entries[:drop]
        self._durable = max(0, self._durable - drop)

    def sync(self) -> LogPosition:
        self._durable = len(self._entries)
        return self.head

    def crash(self) -> None:
        del self._entries[self._durable :]
