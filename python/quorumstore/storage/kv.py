"""The interface of the ordered byte-key stores (RocksDB on disk in `rocks_kv`, a
SortedDict in memory in `memory_kv`) and the chunked scan they share.

The state machine needs point reads, ordered scans, floor/ceiling seeks, atomic
multi-key writes and consistent read views; nothing else. `MemoryKv` additionally
models crashes for the deterministic simulator.

Scans on a live store are read in chunks that re-seek after the last key returned,
so a suspended scan pins nothing and never breaks on writes made meanwhile; they are
therefore not point-in-time (a write made while a scan is suspended may or may not
show up). Readers that need one consistent state take `snapshot()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

Item = tuple[bytes, bytes]
#: Keys and values of consecutive items, as two parallel lists (a columnar run).
Run = tuple[list[bytes], list[bytes]]
#: One atomic write's puts, deletes and delete ranges (`KvStore.write`'s arguments).
KvWrite = tuple[Iterable[Item], list[bytes], list[tuple[bytes, bytes]]]

# Scans read runs of growing size: short scans stay cheap, long ones amortise re-seeks.
_FIRST_RUN = 16
_MAX_RUN = 1024
#: Bound on the bytes of a run (`scan`'s, and `scan_runs`' by default): a read of large
#: values (up to 16 MiB each) holds about this much at a time, not a run's count of them.
DEFAULT_RUN_BYTES = 32 << 20


class KvClosedError(RuntimeError):
    """A store or snapshot was used after `close()`."""


class KvReader(Protocol):
    """Read methods shared by stores and their snapshots. Bounds are [start, end)."""

    def get(self, key: bytes) -> bytes | None: ...

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]: ...

    def scan(self, start: bytes, end: bytes | None, reverse: bool = False) -> Iterator[Item]:
        """Items with start <= key < end (end None: unbounded), ascending or descending."""
        ...

    def scan_runs(
        self, start: bytes, end: bytes | None, run_items: int, run_bytes: int = DEFAULT_RUN_BYTES
    ) -> Iterator[Run]:
        """`scan`'s ascending items as runs, keys and values apart: bulk readers (Arrow
        batches) then never touch single items in Python. A run holds at most `run_items`
        items, and ends with the item that brings its keys and values to `run_bytes`."""
        ...

    def seek_le(self, key: bytes) -> Item | None: ...

    def seek_ge(self, key: bytes) -> Item | None: ...

    def seek_lt(self, key: bytes) -> Item | None: ...

    def seek_gt(self, key: bytes) -> Item | None: ...


class KvSnapshot(KvReader, Protocol):
    """A consistent read view; `close()` releases what it pins."""

    def close(self) -> None: ...


class KvStore(KvReader, Protocol):
    def write(
        self,
        puts: Iterable[Item],
        deletes: list[bytes],
        delete_ranges: list[tuple[bytes, bytes]],
    ) -> None:
        """Apply all changes atomically: delete_ranges first, then deletes, then puts
        (consumed once, so a large write's items can be made as they are written)."""
        ...

    def load_sorted(self, runs: Iterable[Run]) -> None:
        """Put the items of `runs`, whose keys ascend strictly across all runs, into a range
        that holds nothing, as one atomic write: a bulk load (a snapshot install). Runs are
        consumed once, as they come; if reading them raises, nothing is written."""
        ...

    def flush(self) -> None:
        """Make every write so far durable (survive a crash or power loss)."""
        ...

    def snapshot(self) -> KvSnapshot: ...

    def close(self) -> None:
        """Flush, release the store and close its open snapshots."""
        ...


class ChunkedReader:
    """`scan` on top of `_run`, which each engine implements."""

    def _run(
        self,
        after: bytes | None,
        start: bytes,
        end: bytes | None,
        reverse: bool,
        limit: int,
        max_bytes: int,
    ) -> Run:
        """Up to `limit` items of [start, end) in scan order, strictly past `after` if given,
        ending early with the item that brings the run's keys and values to `max_bytes`."""
        raise NotImplementedError

    def scan(self, start: bytes, end: bytes | None, reverse: bool = False) -> Iterator[Item]:
        after: bytes | None = None
        limit = _FIRST_RUN
        while True:
            keys, values = self._run(after, start, end, reverse, limit, DEFAULT_RUN_BYTES)
            yield from zip(keys, values)
            if _last_run(keys, values, limit, DEFAULT_RUN_BYTES):
                return
            after = keys[-1]
            limit = min(2 * limit, _MAX_RUN)

    def scan_runs(
        self, start: bytes, end: bytes | None, run_items: int, run_bytes: int = DEFAULT_RUN_BYTES
    ) -> Iterator[Run]:
        if run_items < 1 or run_bytes < 1:
            raise ValueError(
                f"run_items and run_bytes must be positive, got {run_items} and {run_bytes}"
            )
        after: bytes | None = None
        while True:
            keys, values = self._run(after, start, end, False, run_items, run_bytes)
            if keys:
                yield keys, values
            if _last_run(keys, values, run_items, run_bytes):
                return
            after = keys[-1]


def _last_run(keys: list[bytes], values: list[bytes], limit: int, max_bytes: int) -> bool:
    """Whether `_run` stopped at the end of the range: short of `limit` items, and not
    cut by `max_bytes` (summed only for a short run, mostly a scan's last)."""
    return len(keys) < limit and sum(map(len, keys)) + sum(map(len, values)) < max_bytes


def valid_ranges(delete_ranges: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The ranges that delete something: an empty or inverted one deletes nothing
    (RocksDB would reject an inverted one)."""
    return [(start, end) for start, end in delete_ranges if start < end]
