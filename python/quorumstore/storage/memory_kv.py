"""The KV in memory: a SortedDict behind the same interface as RocksDB, with crashes
modelled for the deterministic simulator."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from itertools import islice, pairwise

from sortedcontainers import SortedDict

from quorumstore.storage.kv import (
    ChunkedReader,
    Item,
    KvClosedError,
    KvSnapshot,
    Run,
    valid_ranges,
)


class _SortedReader(ChunkedReader):
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
        for start, end in valid_ranges(delete_ranges):
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
