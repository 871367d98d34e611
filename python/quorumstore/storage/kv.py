"""Ordered byte-key stores behind one small interface: RocksDB on disk, a SortedDict in memory.

The state machine needs point reads, ordered scans, floor/ceiling seeks, atomic
multi-key writes and consistent read views; nothing else. `MemoryKv` additionally
models crashes for the deterministic simulator.

Scans on a live store are read in chunks that re-seek after the last key returned,
so a suspended scan pins nothing and never breaks on writes made meanwhile; they are
therefore not point-in-time (a write made while a scan is suspended may or may not
show up). Readers that need one consistent state take `snapshot()`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from itertools import islice, pairwise
from typing import Any, Protocol, cast

from rocksdict import (
    BlockBasedOptions,
    Cache,
    IngestExternalFileOptions,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    SstFileWriter,
    WriteBatch,
    WriteBufferManager,
)
from sortedcontainers import SortedDict

Item = tuple[bytes, bytes]
#: Keys and values of consecutive items, as two parallel lists (a columnar run).
Run = tuple[list[bytes], list[bytes]]

# Scans read runs of growing size: short scans stay cheap, long ones amortise re-seeks.
_FIRST_RUN = 16
_MAX_RUN = 1024
#: Bound on the bytes of a run (`scan`'s, and `scan_runs`' by default): a read of large
#: values (up to 16 MiB each) holds about this much at a time, not a run's count of them.
DEFAULT_RUN_BYTES = 32 << 20
#: Suffix of the file a RocksDB bulk load writes in the database's directory.
_LOAD_SUFFIX = ".load.sst"


class _AboveEveryKey:
    """The bound of an unbounded scan: ``key >= it`` is False for every bytes key."""

    def __le__(self, other: object) -> bool:
        return False


_AFTER_EVERY_KEY: Any = _AboveEveryKey()


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


class _ChunkedReader:
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


def _valid_ranges(delete_ranges: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    # An empty or inverted range deletes nothing (RocksDB would reject an inverted one).
    return [(start, end) for start, end in delete_ranges if start < end]


# --- RocksDB -----------------------------------------------------------------


class _RocksReader(_ChunkedReader):
    def _iterator(self, upper: bytes | None = None) -> RdictIter:
        """An iterator; a live store's stops at `upper`, which keeps a seek from walking
        the tombstones beyond it (the deleted serial index entries of every earlier
        write) to the next live key."""
        raise NotImplementedError

    def _run(
        self,
        after: bytes | None,
        start: bytes,
        end: bytes | None,
        reverse: bool,
        limit: int,
        max_bytes: int,
    ) -> Run:
        it = self._iterator(None if reverse else end)
        keys: list[bytes] = []
        values: list[bytes] = []
        size = 0
        if not reverse:
            it.seek(start if after is None else after)
            if after is not None and it.valid() and it.key() == after:
                it.next()
            # The hot loop of every bulk read: bound methods hoisted, no per-item tuples,
            # and no valid() call: an exhausted iterator's key() is None.
            key_of, value_of, step = it.key, it.value, it.next
            add_key, add_value = keys.append, values.append
            beyond = _AFTER_EVERY_KEY if end is None else end
            for _ in range(limit):
                key = key_of()
                if key is None or key >= beyond:
                    break
                value = value_of()
                add_key(key)
                add_value(value)
                size += len(key) + len(value)
                if size >= max_bytes:
                    break
                step()
        else:
            bound = end if after is None else after
            if bound is None:
                it.seek_to_last()
            else:
                it.seek_for_prev(bound)
                if it.valid() and it.key() == bound:
                    it.prev()
            while it.valid() and len(keys) < limit and size < max_bytes:
                key = it.key()
                if key < start:
                    break
                value = it.value()
                keys.append(key)
                values.append(value)
                size += len(key) + len(value)
                it.prev()
        it.status()
        return keys, values

    @staticmethod
    def _here(it: RdictIter) -> Item | None:
        if it.valid():
            return it.key(), it.value()
        it.status()
        return None

    def seek_ge(self, key: bytes) -> Item | None:
        it = self._iterator()
        it.seek(key)
        return self._here(it)

    def seek_gt(self, key: bytes) -> Item | None:
        it = self._iterator()
        it.seek(key)
        if it.valid() and it.key() == key:
            it.next()
        return self._here(it)

    def seek_le(self, key: bytes) -> Item | None:
        it = self._iterator()
        it.seek_for_prev(key)
        return self._here(it)

    def seek_lt(self, key: bytes) -> Item | None:
        it = self._iterator()
        it.seek_for_prev(key)
        if it.valid() and it.key() == key:
            it.prev()
        return self._here(it)


class _RocksSnapshot(_RocksReader):
    """A view backed by one RocksDB iterator, which pins the state it was created at.

    rocksdict 0.3's Snapshot applies the snapshot to point reads only (its iterators
    read the latest state), so every read here, point reads included, goes through
    the one pinned iterator.
    """

    def __init__(self, it: RdictIter, path: str) -> None:
        self._it: RdictIter | None = it
        self._path = path

    def _iterator(self, upper: bytes | None = None) -> RdictIter:
        # One pinned iterator serves every read of the snapshot, so it has no bound.
        if self._it is None:
            raise KvClosedError(f"snapshot of {self._path} is closed")
        return self._it

    def get(self, key: bytes) -> bytes | None:
        it = self._iterator()
        it.seek(key)
        if it.valid() and it.key() == key:
            return it.value()
        it.status()
        return None

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        return [self.get(key) for key in keys]

    def close(self) -> None:
        self._it = None


#: A node's default `KvMemory` budget.
DEFAULT_KV_MEMORY_BYTES = 512 * 1024 * 1024


class KvMemory:
    """One memory budget for every RocksDB of a process: a block cache of `budget_bytes`
    that the memtables are charged to as well.

    Each RocksDB on its own holds up to two 64 MiB memtables and a block cache of its own,
    so a node's memory grew with its shard count: 1.4 GiB resident after 480 MB of puts
    over 16 shards here. Under one budget, RocksDB flushes the largest memtables once
    they take half of it. A single write larger than the budget still goes whole into a
    memtable (it is flushed right after).
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 1:
            raise ValueError(f"the KV memory budget must be positive, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.cache = Cache(budget_bytes)
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
            budget_bytes // 2, False, self.cache
        )


#: Keys per rocksdict multi-get call (see `RocksKv.multi_get`).
_MULTI_GET_SLICE = 16_384


class RocksKv(_RocksReader):
    """RocksDB in raw bytes mode. Writes go to its WAL unsynced; `flush` syncs the WAL."""

    def __init__(self, path: str | os.PathLike[str], memory: KvMemory | None = None) -> None:
        self._path = os.fspath(path)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # Every put first looks its key up (its version), and new keys miss: bloom
        # filters in the memtable and the SST files answer most misses without a search.
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        if memory is not None:
            table.set_block_cache(memory.cache)
            options.set_write_buffer_manager(memory.write_buffers)
        options.set_block_based_table_factory(table)
        options.set_memtable_prefix_bloom_ratio(0.1)
        options.set_memtable_whole_key_filtering(True)
        self._options = options
        for stale in glob.glob(os.path.join(glob.escape(self._path), "*" + _LOAD_SUFFIX)):
            os.unlink(stale)  # a load that a crash interrupted
        self._db: Rdict | None = Rdict(self._path, options)
        # Open snapshots keep the database open, so close() must release them first.
        self._snapshots: weakref.WeakSet[_RocksSnapshot] = weakref.WeakSet()

    def _live(self) -> Rdict:
        if self._db is None:
            raise KvClosedError(f"RocksKv at {self._path} is closed")
        return self._db

    def _iterator(self, upper: bytes | None = None) -> RdictIter:
        if upper is None:
            return self._live().iter()
        options = ReadOptions()
        options.set_iterate_upper_bound(upper)
        return self._live().iter(options)

    def get(self, key: bytes) -> bytes | None:
        return self._live().get(key)

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        """Looks the keys up `_MULTI_GET_SLICE` at a time: rocksdict's multi-get holds
        hundreds of bytes per key while it runs (+728 MiB for 1.9M keys in one call here,
        +22 MiB in slices, which were faster too: 0.74 s against 1.30 s)."""
        db = self._live()
        found: list[bytes | None] = []
        for start in range(0, len(keys), _MULTI_GET_SLICE):
            # rocksdict's stub types a multi-get's keys as a list of any key type (and
            # lists are invariant) and its result as Any; in raw mode both are bytes.
            found += cast(
                list[bytes | None], db.get(cast(list[Any], keys[start : start + _MULTI_GET_SLICE]))
            )
        return found

    def write(
        self,
        puts: Iterable[Item],
        deletes: list[bytes],
        delete_ranges: list[tuple[bytes, bytes]],
    ) -> None:
        db = self._live()
        batch = WriteBatch(raw_mode=True)
        for start, end in _valid_ranges(delete_ranges):
            batch.delete_range(start, end)
        for key in deletes:
            batch.delete(key)
        for key, value in puts:
            batch.put(key, value)
        db.write(batch)

    def load_sorted(self, runs: Iterable[Run]) -> None:
        """Writes the items into one SST file beside the database and ingests it: no WAL,
        no memtable and no flush, about a third of the time of `write` (10^6 items of
        150 bytes: 0.2 s against 0.6 s here). Ingestion is atomic and durable."""
        db = self._live()
        fd, path = tempfile.mkstemp(suffix=_LOAD_SUFFIX, dir=self._path)
        os.close(fd)
        try:
            writer = SstFileWriter(options=self._options)
            writer.open(path)
            items = 0
            for keys, values in runs:
                try:
                    for key, value in zip(keys, values, strict=True):
                        writer[key] = value
                except Exception as e:  # rocksdict raises Exception itself
                    raise ValueError(f"cannot bulk load into {self._path}: {e}") from e
                items += len(keys)
            if items:
                writer.finish()
                options = IngestExternalFileOptions()
                options.set_move_files(True)  # linked into the database, not copied
                db.ingest_external_file([path], options)
        finally:
            with contextlib.suppress(FileNotFoundError):  # moved in by the ingestion
                os.unlink(path)

    def flush(self) -> None:
        self._live().flush_wal(True)

    def snapshot(self) -> KvSnapshot:
        view = _RocksSnapshot(self._live().iter(), self._path)
        self._snapshots.add(view)
        return view

    def close(self) -> None:
        if self._db is None:
            return
        for view in list(self._snapshots):
            view.close()
        db, self._db = self._db, None
        try:
            db.flush_wal(True)
        finally:  # release the files and the lock even when the flush fails (a full disk)
            db.close()


# --- In memory ---------------------------------------------------------------


class _SortedReader(_ChunkedReader):
    def __init__(self, data: SortedDict, name: str) -> None:
        self._data = data
        self._name = name
        self._closed = False

    def _sorted(self) -> SortedDict:
        if self._closed:
            raise KvClosedError(f"{self._name} is closed")
        return self._data

    def get(self, key: bytes) -> bytes | None:
        return self._sorted().get(key)

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        data = self._sorted()
        return [data.get(key) for key in keys]

    def _run(
        self,
        after: bytes | None,
        start: bytes,
        end: bytes | None,
        reverse: bool,
        limit: int,
        max_bytes: int,
    ) -> Run:
        data = self._sorted()
        if not reverse:
            low = start if after is None else after
            keys = data.irange(low, end, inclusive=(after is None, False))
        else:
            high = end if after is None else after
            keys = data.irange(start, high, inclusive=(True, False), reverse=True)
        found: list[bytes] = []
        values: list[bytes] = []
        size = 0
        for key in islice(keys, limit):
            value = data[key]
            found.append(key)
            values.append(value)
            size += len(key) + len(value)
            if size >= max_bytes:
                break
        return found, values

    def _at(self, index: int) -> Item | None:
        data = self._sorted()
        return data.peekitem(index) if 0 <= index < len(data) else None

    def seek_ge(self, key: bytes) -> Item | None:
        return self._at(self._sorted().bisect_left(key))

    def seek_gt(self, key: bytes) -> Item | None:
        return self._at(self._sorted().bisect_right(key))

    def seek_le(self, key: bytes) -> Item | None:
        return self._at(self._sorted().bisect_right(key) - 1)

    def seek_lt(self, key: bytes) -> Item | None:
        return self._at(self._sorted().bisect_left(key) - 1)


class _MemorySnapshot(_SortedReader):
    def close(self) -> None:
        self._closed = True


class MemoryKv(_SortedReader):
    """A SortedDict store for the simulator; `crash()` loses every write since the last flush.

    It keeps, per key changed since the last flush, the value it had then (None: absent),
    so flush is O(1) and a crash costs only the keys that changed.
    """

    def __init__(self) -> None:
        super().__init__(SortedDict(), "MemoryKv")
        self._undo: dict[bytes, bytes | None] = {}
        self._snapshots: weakref.WeakSet[_MemorySnapshot] = weakref.WeakSet()

    def _remember(self, key: bytes) -> None:
        if key not in self._undo:
            self._undo[key] = self._data.get(key)

    def write(
        self,
        puts: Iterable[Item],
        deletes: list[bytes],
        delete_ranges: list[tuple[bytes, bytes]],
    ) -> None:
        data = self._sorted()
        puts = list(puts)
        # Validate everything before changing anything: the write is all or nothing.
        keys = (
            [key for key, _ in puts] + deletes + [bound for pair in delete_ranges for bound in pair]
        )
        for item in keys + [value for _, value in puts]:
            if type(item) is not bytes:
                raise TypeError(f"MemoryKv stores bytes only, got {type(item).__name__}: {item!r}")
        for start, end in _valid_ranges(delete_ranges):
            for key in list(data.irange(start, end, inclusive=(True, False))):
                self._remember(key)
                del data[key]
        for key in deletes:
            if key in data:
                self._remember(key)
                del data[key]
        for key, value in puts:
            self._remember(key)
            data[key] = value

    def load_sorted(self, runs: Iterable[Run]) -> None:
        items: list[Item] = []
        for keys, values in runs:
            items.extend(zip(keys, values, strict=True))
        if any(a[0] >= b[0] for a, b in pairwise(items)):
            raise ValueError("cannot bulk load into MemoryKv: keys must ascend strictly")
        self.write(items, [], [])

    def flush(self) -> None:
        self._sorted()
        self._undo.clear()

    def snapshot(self) -> KvSnapshot:
        view = _MemorySnapshot(self._sorted().copy(), "MemoryKv snapshot")
        self._snapshots.add(view)
        return view

    def _close_snapshots(self) -> None:
        for view in list(self._snapshots):
            view.close()

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._close_snapshots()
            self._closed = True

    def crash(self) -> None:
        """Lose every write since the last flush, as a killed process or a power cut would.

        The store stays usable (it is "reopened"); its snapshots are gone with the process.
        """
        self._close_snapshots()
        for key, value in self._undo.items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value
        self._undo.clear()
        self._closed = False
