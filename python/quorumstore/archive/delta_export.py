"""The committed KV state at an archived point written out as a Delta Lake table, one
Delta version per export: what `quorumstore export-delta` does.

The point is the one a restore takes (a time, offsets per shard, or the last archived
entries); each shard is rebuilt as a restore rebuilds it (`restore.rebuild_shard`) into
a temporary RocksDB, then scanned in Arrow batches into the table. The first export
creates the table, each later one overwrites it, so version n of the table is the
(n+1)th export and Delta's time travel walks the exported points. The commit's
`userMetadata` records the point (`POINT_METADATA`), which Spark's `DESCRIBE HISTORY`
and `deltalake`'s `history()` both show.

Every shard is rebuilt before the write starts: the exported offsets go into the
commit, and a damaged archive is refused before anything is written. That takes the
disk of the whole state once, in a temporary directory.

`deltalake` (Rust, no JVM) writes the table; it is part of the `spark` extra.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from quorumstore.archive.manifest import ArchiveError
from quorumstore.archive.restore import plan_point, rebuild_shard, store_errors
from quorumstore.archive.store import ArchiveStore
from quorumstore.protocol.messages import ShardKey
from quorumstore.storage.reads import ShardReader
from quorumstore.storage.rocks_kv import RocksKv

_TIMESTAMP = pa.timestamp("us", tz="UTC")
#: The table's columns: those of a DataFrame read (`spark.read.format("quorumstore")`,
#: value as binary) but the change feed's `operation` and `range_end`, plus the shard's
#: namespace. `commit_offset` is the offset the shard was exported at.
TABLE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("version_id", pa.int64(), nullable=False),
        pa.field("modifications_count", pa.int64(), nullable=False),
        pa.field("created_timestamp", _TIMESTAMP, nullable=False),
        pa.field("modified_timestamp", _TIMESTAMP, nullable=False),
        pa.field("namespace", pa.string(), nullable=False),
        pa.field("shard", pa.int64(), nullable=False),
        pa.field("commit_offset", pa.int64(), nullable=False),
    ]
)
#: Description of a table an export creates.
TABLE_DESCRIPTION = "quorumstore state exported from an archive, one version per exported point"
#: The commit-info key holding the point, a JSON object: `archive` (its URL),
#: `at` (the point in `--at`'s syntax, or null for the last archived entries) and
#: `offsets` ("namespace/shard" -> the offset exported, which as `--at` gives the same
#: state again).
POINT_METADATA = "userMetadata"
#: Rows per batch written (they hold at most `storage.kv.DEFAULT_RUN_BYTES` of records).
_BATCH_ROWS = 65536


@dataclass(frozen=True, slots=True)
class DeltaExport:
    """What one export wrote."""

    #: The table's version that holds it.
    version: int
    rows: int
    #: The offset each shard was exported at.
    offsets: dict[ShardKey, int]


def export_delta(
    store: ArchiveStore,
    table_uri: str,
    *,
    time_ms: int | None = None,
    offsets: Mapping[ShardKey, int] | None = None,
    storage_options: dict[str, str] | None = None,
    work_dir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> DeltaExport:
    """Writes the state at `time_ms`, at `offsets` (shard -> last offset; shards not
    named: their last archived entry) or at the last archived entries as a new version
    of the Delta table at `table_uri` (created if absent). `storage_options` go to
    deltalake's object store; `work_dir` holds the rebuilt shards (default: the system's
    temporary directory). ArchiveError says why when the archive or table refuse."""
    # The planning every restore does, refusing what a restore refuses.
    _, plans = plan_point(store, time_ms, dict(offsets or {}))
    _check_destination(table_uri, storage_options)
    with tempfile.TemporaryDirectory(prefix="quorumstore-export-", dir=work_dir) as tmp:
        kv_paths: dict[ShardKey, Path] = {}
        exported: dict[ShardKey, int] = {}
        for key, plan in plans.items():
            kv_paths[key] = Path(tmp) / key[0] / str(key[1])
            with store_errors(store):
                position = rebuild_shard(store, key, plan, kv_paths[key], progress)
            exported[key] = position.offset
        point = {
            "archive": _without_credentials(store.url),
            "at": _point_text(time_ms, offsets),
            "offsets": {_name(key): offset for key, offset in exported.items()},
        }
        scans = _Scans(kv_paths, exported, progress)
        batches = iter(scans)
        try:
            write_deltalake(
                table_uri,
                pa.RecordBatchReader.from_batches(TABLE_SCHEMA, batches),
                mode="overwrite",
                description=TABLE_DESCRIPTION,
                storage_options=storage_options,
                commit_properties=CommitProperties(
                    custom_metadata={POINT_METADATA: json.dumps(point)}
                ),
            )
            version = DeltaTable(table_uri, storage_options=storage_options).version()
        except (DeltaError, OSError) as e:
            raise ArchiveError(f"cannot write the Delta table at {table_uri}: {e}") from e
        finally:
            batches.close()  # a failed write leaves it suspended, with a KV open
    return DeltaExport(version, scans.rows, exported)


def _check_destination(table_uri: str, storage_options: dict[str, str] | None) -> None:
    """Refuses a destination an export would mix with what it did not write: anything
    but nothing, an empty directory, or a Delta table of TABLE_SCHEMA's columns."""
    try:
        fs, path = fsspec.core.url_to_fs(table_uri)
        if not fs.exists(path) or (fs.isdir(path) and not fs.ls(path)):
            return
        is_table = fs.isdir(path) and DeltaTable.is_deltatable(table_uri, storage_options)
        found = (
            pa.schema(DeltaTable(table_uri, storage_options=storage_options).schema().to_arrow())
            if is_table
            else None
        )
    except (ValueError, ImportError, OSError, DeltaError) as e:
        raise ArchiveError(f"cannot check the destination {table_uri}: {e}") from e
    if found is None:
        raise ArchiveError(
            f"{table_uri} is not a Delta table and not empty; export into a new or empty "
            "directory, or an earlier export's table"
        )
    if [(f.name, f.type) for f in found] != [(f.name, f.type) for f in TABLE_SCHEMA]:
        raise ArchiveError(
            f"{table_uri} is a Delta table of other columns ({', '.join(found.names)}), not "
            "one an export wrote; export into a new directory or an earlier export's table"
        )


class _Scans:
    """TABLE_SCHEMA batches of every shard's records, shard by shard in key order, each
    shard's rebuilt KV deleted once read; counts the rows."""

    def __init__(
        self,
        kv_paths: Mapping[ShardKey, Path],
        exported: Mapping[ShardKey, int],
        progress: Callable[[str], None],
    ) -> None:
        self._kv_paths = kv_paths
        self._exported = exported
        self._progress = progress
        self.rows = 0

    def __iter__(self) -> Generator[pa.RecordBatch, None, None]:
        for key, kv_path in self._kv_paths.items():
            offset = self._exported[key]
            kv = RocksKv(kv_path)
            count = 0
            try:
                for batch in ShardReader(kv).scan_arrow("", "", _BATCH_ROWS):
                    count += batch.num_rows
                    yield _shape(batch, key, offset)
            finally:
                kv.close()
            shutil.rmtree(kv_path)
            self.rows += count
            self._progress(f"shard {_name(key)}: {count} records written at offset {offset}")


def _shape(batch: pa.RecordBatch, key: ShardKey, offset: int) -> pa.RecordBatch:
    """A scan batch (`wire.schemas.SCAN_SCHEMA`) as TABLE_SCHEMA rows."""
    n = batch.num_rows
    columns = [
        batch.column("key"),
        batch.column("value"),
        batch.column("version_id"),
        batch.column("modifications_count"),
        _timestamps(batch.column("created_ms")),
        _timestamps(batch.column("modified_ms")),
        pa.repeat(pa.scalar(key[0], pa.string()), n),
        pa.repeat(pa.scalar(key[1], pa.int64()), n),
        pa.repeat(pa.scalar(offset, pa.int64()), n),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=TABLE_SCHEMA)


def _timestamps(ms: pa.Array) -> pa.Array:
    return pc.multiply(ms, 1000).cast(_TIMESTAMP)


def _point_text(time_ms: int | None, offsets: Mapping[ShardKey, int] | None) -> str | None:
    """The point in the syntax of `--at`; None for the last archived entries."""
    if time_ms is not None:
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        return (epoch + datetime.timedelta(milliseconds=time_ms)).isoformat()
    if offsets:
        return ",".join(f"{_name(key)}={offset}" for key, offset in sorted(offsets.items()))
    return None


def _without_credentials(url: str) -> str:
    """`url` without a user and password, which must not end up in the table's log."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _name(key: ShardKey) -> str:
    return f"{key[0]}/{key[1]}"
