"""Internal keys as the ops of one entry see them: the store plus the entry's own changes.

Sessions, secondary indexes and sequences keep their state under internal keys that
the ops of one entry read and change in turn (two sessions created by one entry get
two ids). The overlay collects those changes so the state machine writes them in the
entry's single atomic KV write.
"""

from __future__ import annotations

from collections.abc import Iterator

from quorumstore.storage.kv import KvReader


class InternalOverlay:
    def __init__(self, kv: KvReader) -> None:
        self._kv = kv
        self._changes: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self._changes:
            return self._changes[key]
        return self._kv.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._changes[key] = value

    def delete(self, key: bytes) -> None:
        self._changes[key] = None

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Items in [start, end) in key order, this entry's changes included."""
        merged = {k: v for k, v in self._kv.scan(start, end) if k not in self._changes}
        merged.update(
            (k, v) for k, v in self._changes.items() if v is not None and start <= k < end
        )
        return iter(sorted(merged.items()))

    def writes(self) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
        """(puts, deletes) of everything changed."""
        puts = [(k, v) for k, v in self._changes.items() if v is not None]
        deletes = [k for k, v in self._changes.items() if v is None]
        return puts, deletes
