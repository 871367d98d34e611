"""Rows staged on a shard's leader, unreplicated, until a write publishes them.

Staged rows live in `<staging root>/<write id>/<namespace>/<shard>/<part>.<chunk>.arrow`.
They are not replicated: a leader change between staging and publishing makes the
publish fail (FAILED_PRECONDITION), and the caller's write fails as a whole. Staged
rows are dropped when published, by `DiscardStaged`, or after `STAGING_TTL_S`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pyarrow as pa

from quorumstore.node.data.errors import Refused, invalid
from quorumstore.node.data.validation import read_rows
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.wire.schemas import ROWS_SCHEMA

#: Staged rows nobody published or discarded are dropped after this long.
STAGING_TTL_S = 24 * 60 * 60
_SWEEP_INTERVAL_S = 600

_WRITE_ID = re.compile(r"[0-9a-f]{32}")
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


class StagedRows:
    """Rows kept on this node until published (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._last_sweep = 0.0
        # Discarded write ids -> when. A task attempt of a failed or finished job may
        # still be running (Spark does not wait for zombies), and its later chunks must
        # not bring the write's directory back; the lock orders such a put with the drop.
        self._discarded: dict[str, float] = {}
        self._lock = threading.Lock()

    def _dir(self, write_id: str, namespace: str, shard: int) -> Path:
        if not _WRITE_ID.fullmatch(write_id):
            raise invalid(f"write_id must be 32 lowercase hex digits, got {write_id!r}")
        if not _NAME.fullmatch(namespace):
            raise invalid(f"namespace {namespace!r} cannot be staged for")
        return self.root / write_id / namespace / str(shard)

    @staticmethod
    def _file(directory: Path, part: str, chunk: int) -> Path:
        if not _NAME.fullmatch(part):
            raise invalid(f"part must be 1-128 letters, digits, '-', '_' or '.', got {part!r}")
        if chunk < 0:
            raise invalid(f"chunk must be >= 0, got {chunk}")
        return directory / f"{part}.{chunk}.arrow"

    def check(self, write_id: str, namespace: str, shard: int, part: str, chunk: int) -> Path:
        return self._file(self._dir(write_id, namespace, shard), part, chunk)

    def put(self, path: Path, data: bytes) -> bool:
        """Keeps `data` at `path`; returns whether the periodic `sweep` ran after it."""
        write_id = path.relative_to(self.root).parts[0]
        with self._lock:
            if write_id in self._discarded:
                raise Refused(
                    grpc.StatusCode.ABORTED,
                    f"write {write_id} was already published or discarded (its job ended); "
                    "this task attempt's rows are not needed",
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return self.sweep()

    def rows(
        self, write_id: str, namespace: str, shard: int, parts: Sequence[pb.StagedPart]
    ) -> pa.Table:
        directory = self._dir(write_id, namespace, shard)
        tables = []
        for part in parts:
            got = 0
            for chunk in range(part.chunks):
                path = self._file(directory, part.part, chunk)
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    raise Refused(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"staged chunk {chunk} of part {part.part!r} of write {write_id} is not on "
                        f"this node (shard {namespace}/{shard}): the leader changed since it was "
                        "staged, or it was discarded; the write must be retried as a whole",
                    ) from None
                table = read_rows(data, f"staged chunk {path.name}")
                got += table.num_rows
                tables.append(table)
            if got != part.rows:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"part {part.part!r} of write {write_id} staged {got} rows on this node, "
                    f"but its writer reported {part.rows}",
                )
        return pa.concat_tables(tables) if tables else ROWS_SCHEMA.empty_table()

    def drop(self, write_id: str, namespace: str | None = None, shard: int | None = None) -> None:
        """Deletes a write's rows (all, or one shard's); later puts of that write are refused."""
        if namespace is None or shard is None:
            if not _WRITE_ID.fullmatch(write_id):
                raise invalid(f"write_id must be 32 lowercase hex digits, got {write_id!r}")
            directory = self.root / write_id
        else:
            directory = self._dir(write_id, namespace, shard)
        with self._lock:
            self._discarded[write_id] = time.time()
            shutil.rmtree(directory, ignore_errors=True)

    def sweep(self) -> bool:
        """Drops staged rows older than STAGING_TTL_S, at most every _SWEEP_INTERVAL_S;
        returns whether it ran (so the caller sweeps the replicated pieces too)."""
        now = time.time()
        if now - self._last_sweep < _SWEEP_INTERVAL_S:
            return False
        self._last_sweep = now
        with self._lock:
            self._discarded = {
                w: at for w, at in self._discarded.items() if now - at <= STAGING_TTL_S
            }
        for entry in self.root.iterdir():
            try:
                if now - entry.stat().st_mtime > STAGING_TTL_S:
                    shutil.rmtree(entry, ignore_errors=True)
            except FileNotFoundError:
                pass
        return True
