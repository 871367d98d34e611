"""The engine's view of a replica's log: the durable log plus changes not yet handed out.

Between two `Ready`s the engine may truncate, reset (snapshot) and append; those changes
live here until `take()` hands them to the driver, like etcd-raft's `unstable` log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from quorumstore.protocol.types import LogEntry, LogPosition, LogReader


@dataclass(slots=True)
class LogChanges:
    """Changes for the driver, applied in this order: truncate, reset, append."""

    truncate_after: int | None = None
    reset_to: LogPosition | None = None
    entries: list[LogEntry] = field(default_factory=list)


class LogView:
    def __init__(self, reader: LogReader):
        self._reader = reader
        self._truncate_after: int | None = None
        self._reset_to: LogPosition | None = None
        self._entries: list[LogEntry] = []

    # --- changes -------------------------------------------------------------------

    def append(self, entry: LogEntry) -> None:
        assert entry.offset == self.head.offset + 1, (entry.offset, self.head)
        self._entries.append(entry)

    def truncate_after(self, offset: int) -> None:
        """Drops every entry after `offset` (which must be >= base.offset)."""
        if self._entries and self._entries[0].offset <= offset:
            del self._entries[offset - self._entries[0].offset + 1 :]
            return
        self._entries.clear()
        if offset < self._stored_head().offset:
            self._truncate_after = offset

    def reset(self, position: LogPosition) -> None:
        """Replaces the whole log with an empty one whose base is `position`."""
        self._entries.clear()
        self._truncate_after = None
        self._reset_to = position

    def take(self) -> LogChanges:
        changes = LogChanges(self._truncate_after, self._reset_to, self._entries)
        self._truncate_after = None
        self._reset_to = None
        self._entries = []
        return changes

    # --- reads ---------------------------------------------------------------------

    def _stored_head(self) -> LogPosition:
        if self._reset_to is not None:
            return self._reset_to
        if self._truncate_after is not None:
            return self._reader.position_at(self._truncate_after)
        return self._reader.head

    @property
    def head(self) -> LogPosition:
        if self._entries:
            e = self._entries[-1]
            return LogPosition(e.term, e.offset, e.checksum)
        return self._stored_head()

    @property
    def base(self) -> LogPosition:
        return self._reset_to if self._reset_to is not None else self._reader.base

    def position_at(self, offset: int) -> LogPosition:
        if self._entries and offset >= self._entries[0].offset:
            e = self._entries[offset - self._entries[0].offset]
            return LogPosition(e.term, e.offset, e.checksum)
        if self._reset_to is not None:
            if offset != self._reset_to.offset:
                raise IndexError(f"offset {offset} is not in the log (reset to {self._reset_to})")
            return self._reset_to
        return self._reader.position_at(offset)

    def holds(self, position: LogPosition) -> bool:
        """Whether the log holds `position` (same chain checksum there, so the same prefix
        up to it); every log holds the empty prefix."""
        if position.offset < 0:
            return True
        if not self.base.offset <= position.offset <= self.head.offset:
            return False
        return self.position_at(position.offset).checksum == position.checksum

    def read(self, from_offset: int, max_entries: int, max_bytes: int) -> Sequence[LogEntry]:
        stored_head = self._stored_head().offset
        out: list[LogEntry] = []
        if from_offset <= stored_head and self._reset_to is None:
            out.extend(self._reader.read(from_offset, max_entries, max_bytes))
            out = [e for e in out if e.offset <= stored_head]
            from_offset = out[-1].offset + 1 if out else from_offset
        if self._entries and len(out) < max_entries and from_offset >= self._entries[0].offset:
            size = sum(len(e.payload) for e in out)
            for e in self._entries[from_offset - self._entries[0].offset :]:
                if out and (len(out) >= max_entries or size + len(e.payload) > max_bytes):
                    break
                out.append(e)
                size += len(e.payload)
        return out

    def last_position_in_term_at_most(self, term: int, offset: int) -> LogPosition:
        for e in reversed(self._entries):
            if e.offset <= offset and e.term <= term:
                return LogPosition(e.term, e.offset, e.checksum)
        if self._reset_to is not None:
            return self._reset_to
        offset = min(offset, self._stored_head().offset)
        return self._reader.last_position_in_term_at_most(term, offset)
