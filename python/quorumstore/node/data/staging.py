"""Rows staged on a replica of a shard, unreplicated, until a write publishes them.

Staged rows live in `<staging root>/<write id>/<namespace>/<shard>/<part>.<chunk>.arrow`.
They are not replicated: clients stage each chunk on every replica, and a leader that
lacks a chunk at the publish (elected since, and missed by the staging) refuses it
(ABORTED), and the caller's write fails as a whole. Staged
rows are dropped when published, by `DiscardStaged`, or after `STAGING_TTL_S`.

Until then they count, by their size on disk, against the client that staged them
(`max_staged_bytes_per_client`) and against the node (`max_staged_bytes_total`;
docs/limits.md). Rows left staged by an earlier run of the node are not counted.
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
from quorumstore.node.limits import LimitExceeded, RequestLimits, Tally
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.wire.schemas import ROWS_SCHEMA

#: Staged rows nobody published or discarded are dropped after this long.
STAGING_TTL_S = 24 * 60 * 60
_SWEEP_INTERVAL_S = 600

_WRITE_ID = re.compile(r"[0-9a-f]{32}")
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
#: The one holder of `max_staged_bytes_total`: the node.
_NODE = ""


class StagedRows:
    """Rows kept on this node until published (see the module docstring)."""

    def __init__(self, root: Path, limits: RequestLimits = RequestLimits()) -> None:
        self.root = root
        self._last_sweep = 0.0
        # Discarded write ids -> when. A task attempt of a failed or finished job may
        # still be running (Spark does not wait for zombies), and its later chunks must
        # not bring the write's directory back; the lock orders such a put with the drop.
        self._discarded: dict[str, float] = {}
        self._lock = threading.Lock()
        # Under the lock, as puts run on the service's threads: each staged file's
        # client and size, by write id, and the bytes they hold of the limits.
        self._files: dict[str, dict[Path, tuple[str, int]]] = {}
        self._per_client = Tally(
            limits,
            "max_staged_bytes_per_client",
            lambda client, held: (
                f"client {client} would have {held} bytes of rows staged on this node with these"
            ),
        )
        self._total = Tally(
            limits,
            "max_staged_bytes_total",
            lambda _, held: f"this node would hold {held} bytes of staged rows with these",
        )

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

    def put(self, path: Path, data: bytes, client: str) -> bool:
        """Keeps `data` at `path`, counted against `client` (LimitExceeded past a limit);
        returns whether the periodic `sweep` ran after it."""
        write_id = path.relative_to(self.root).parts[0]
        with self._lock:
            if write_id in self._discarded:
                raise Refused(
                    grpc.StatusCode.ABORTED,
                    f"write {write_id} was already published or discarded (its job ended); "
                    "this task attempt's rows are not needed",
                )
            self._take(client, len(data))
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except BaseException:
                self._give_back(client, len(data))
                raise
            files = self._files.setdefault(write_id, {})
            replaced = files.get(path)  # the same chunk staged again: counted once
            files[path] = (client, len(data))
            if replaced is not None:
                self._give_back(*replaced)
        return self.sweep()

    def _take(self, client: str, size: int) -> None:
        self._per_client.take(client, size)
        try:
            self._total.take(_NODE, size)
        except LimitExceeded:
            self._per_client.give_back(client, size)
            raise

    def _give_back(self, client: str, size: int) -> None:
        self._per_client.give_back(client, size)
        self._total.give_back(_NODE, size)

    def _forget(self, write_id: str, directory: Path) -> None:
        """Gives back the files of `write_id` under `directory`, which is deleted."""
        files = self._files.get(write_id, {})
        for path in [p for p in files if p.is_relative_to(directory)]:
            self._give_back(*files.pop(path))
        if not files:
            self._files.pop(write_id, None)

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
                    raise Refused(  # ABORTED: no retry of the publish can find it
                        grpc.StatusCode.ABORTED,
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
            self._forget(write_id, directory)

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
                    with self._lock:
                        shutil.rmtree(entry, ignore_errors=True)
                        self._forget(entry.name, entry)
            except FileNotFoundError:
                pass
        return True
