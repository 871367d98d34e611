"""Values shared by the replication engine, the coordinator and the storage layer.

Everything here is plain data: no I/O, no clocks. Entries are identified by
(term, offset); each entry also carries a *chain checksum* that
covers its own bytes and the checksum of the entry before it, so two logs that
hold the same checksum at an offset hold the same prefix up to that offset.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

#: Term of a replica that never took part in an election (-1: undefined).
NO_TERM = -1
#: Offset of the head of an empty log.
NO_OFFSET = -1
#: Chain checksum "before" the first entry.
EMPTY_CHECKSUM = 0

_ENTRY_HEADER = struct.Struct("<Qqq")


def chain_checksum(previous: int, term: int, offset: int, payload: bytes | memoryview) -> int:
    """Checksum of an entry, chained to the checksum of the entry before it."""
    h = xxhash.xxh3_64(_ENTRY_HEADER.pack(previous, term, offset))
    h.update(payload)
    return h.intdigest()


@dataclass(frozen=True, slots=True, order=True)
class EntryId:
    """Position of an entry: ordered by term first, then offset."""

    term: int
    offset: int

    def __str__(self) -> str:
        return f"({self.term}, {self.offset})"


EMPTY_ENTRY_ID = EntryId(NO_TERM, NO_OFFSET)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One WAL entry: one client write batch, Arrow IPC encoded, in `payload`."""

    term: int
    offset: int
    checksum: int
    payload: bytes

    @property
    def entry_id(self) -> EntryId:
        return EntryId(self.term, self.offset)

    @property
    def position(self) -> LogPosition:
        """Where this entry leaves a log whose head it is."""
        return LogPosition(self.term, self.offset, self.checksum)


@dataclass(frozen=True, slots=True)
class LogPosition:
    """An entry id with its chain checksum: what a log's head (or a snapshot) is."""

    term: int
    offset: int
    checksum: int

    @property
    def entry_id(self) -> EntryId:
        return EntryId(self.term, self.offset)


EMPTY_POSITION = LogPosition(NO_TERM, NO_OFFSET, EMPTY_CHECKSUM)


def make_entry(previous: LogPosition, term: int, payload: bytes) -> LogEntry:
    """The entry that follows `previous` in `term`."""
    offset = previous.offset + 1
    return LogEntry(term, offset, chain_checksum(previous.checksum, term, offset, payload), payload)


class LogReader(Protocol):
    """Read-only view of a replica's log that the engine consults synchronously.

    Like etcd-raft's `Storage`, this is the one thing the engine reads that it did not
    receive as a message: the WAL (or the simulator's in-memory log) implements it.
    `base` is the position just before `first_offset` (the last trimmed entry, or the
    snapshot the log was reset to; EMPTY_POSITION for a log that never lost a prefix).
    """

    @property
    def base(self) -> LogPosition: ...

    @property
    def head(self) -> LogPosition: ...

    def position_at(self, offset: int) -> LogPosition:
        """Position of the entry at `offset`, which must be within [base.offset, head.offset]."""
        ...

    def read(self, from_offset: int, max_entries: int, max_bytes: int) -> Sequence[LogEntry]:
        """Entries from `from_offset` on (at least one if any exist), within the limits."""
        ...

    def last_position_in_term_at_most(self, term: int, offset: int) -> LogPosition:
        """The last position p with p.term <= term and p.offset <= offset (or base)."""
        ...


class Role(enum.Enum):
    """Replica states (docs/protocol.md, "Terms and fencing")."""

    NOT_MEMBER = "NotMember"
    FENCED = "Fenced"
    FOLLOWER = "Follower"
    LEADER = "Leader"
