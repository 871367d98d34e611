"""How much WAL a shard replica keeps once its entries are applied, and when it trims.

The KV holds everything the applied entries did, so their WAL is only needed by
followers a little behind. Trimming drops whole segments; the KV is flushed first so
that what the trimmed entries did survives a crash.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from quorumstore.storage.wal import Wal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WalRetention:
    """How much WAL a replica keeps once its entries are applied and the KV flushed.

    Of the entries through ``min(applied, commit, synced)``, the last `keep_entries` are
    kept, and fewer when they take more than `keep_bytes`; the rest is dropped, whole
    segments at a time. A follower that falls further behind than what is kept catches
    up by snapshot instead of from the log. The byte bound matters for bulk writes: a
    DataFrame write replicates its rows as entries of up to 32 MiB, and 10,000 of those
    would keep hundreds of GiB, all of it also in the KV.
    """

    #: Entries kept below the trim point, for followers a little behind.
    keep_entries: int = 10_000
    #: At most this many bytes of those entries are kept.
    keep_bytes: int = 512 * 1024 * 1024
    #: Seconds between checks; each trim first flushes the KV (one fsync).
    check_interval_s: float = 10.0
    #: Size at which the WAL starts a new segment (the unit of trimming).
    segment_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if (
            self.keep_entries < 0
            or self.keep_bytes < 0
            or self.check_interval_s <= 0
            or self.segment_bytes < 1
        ):
            raise ValueError(
                f"WAL retention needs keep_entries >= 0, keep_bytes >= 0, check_interval_s > 0 "
                f"and segment_bytes >= 1, got {self}"
            )


class WalTrimmer:
    """The trims of one replica's WAL: at most one at a time, a check per interval."""

    def __init__(self, wal: Wal, retention: WalRetention, name: str) -> None:
        self._wal = wal
        self._retention = retention
        self._name = name
        self._next_check = time.monotonic() + retention.check_interval_s
        self._in_flight = False

    def start(self, done: int) -> int | None:
        """The offset to trim before, once the KV is flushed, if a check is due and a
        segment can go (`done`: the entries applied, committed and synced); None if not.
        A trim started must be ended with `end`."""
        now = time.monotonic()
        if self._in_flight or now < self._next_check:
            return None
        self._next_check = now + self._retention.check_interval_s
        upto = max(
            done - self._retention.keep_entries,
            self._wal.first_offset_within(done, self._retention.keep_bytes) - 1,
        )
        if not self._wal.can_trim_before(upto + 1):
            return None
        self._in_flight = True
        return upto + 1

    def end(self, offset: int | None) -> None:
        """Ends the trim in flight: trims before `offset` (None: the KV flush failed, or
        the KV it flushed is gone)."""
        self._in_flight = False
        if offset is not None and offset > self._wal.base.offset + 1:
            # A snapshot install may have moved the base past it.
            self._wal.trim_before(offset)
            log.debug("%s: WAL trimmed before offset %d", self._name, offset)
