"""`quorumstore export-delta` on the archive of a real two-shard `standalone`: each export
is one Delta version holding exactly the state the cluster served at its point, at the
last archived entries, at a time and at offsets; what it refuses; and Spark reading the
Parquet files of the latest version.

Tables are read with deltalake's own query engine (`QueryBuilder`), not
`DeltaTable.to_pyarrow_table()`: with deltalake 1.6.6 and pyarrow 26 the latter
aborted the interpreter at exit ("terminate called without an active exception") in
about 1 run of 20 here, which would fail the pytest run after its tests passed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from test_archive_restore import Standalone, _read_all, standalone

from cluster_harness import run_cli
from quorumstore import Client

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

_SHARDS = 2
_FIRST = [f"/delta/{i:03d}" for i in range(60)]
_ADDED = [f"/delta/new/{i:03d}" for i in range(20)]
_KEYS = _FIRST + _ADDED


def _wait_every_shard_archived(server: Standalone, timeout_s: float = 60) -> None:
    """Until the archive of every shard has caught up (`_wait_archived` watches default/0),
    in two status reads in a row that agree: a leader's report a moment old may not show
    its latest commits yet."""
    deadline = time.monotonic() + timeout_s
    previous: list[str] = []
    while True:
        rows = [r for r in server.status().splitlines() if r.startswith("default/")]
        lags = [re.search(r"(\d+) entries, [\d.]+ s", row) for row in rows]
        caught_up = len(rows) == _SHARDS and all(
            lag is not None and lag.group(1) == "0" and "failing" not in row
            for lag, row in zip(lags, rows)
        )
        if caught_up and rows == previous:
            return
        previous = rows if caught_up else []
        assert time.monotonic() < deadline, f"the archive did not catch up:\n{rows}"
        time.sleep(0.3)


@dataclass(frozen=True)
class Archived:
    """An archive, the states the cluster served at two points of it, and the table of
    the two exports made at those points."""

    url: str
    #: key -> value read after the first batch of puts (None: absent), then after the second.
    first: dict[str, bytes | None]
    second: dict[str, bytes | None]
    #: A time between the two batches.
    between: datetime
    #: key -> version_id of its last put.
    versions: dict[str, int]
    #: Exported at the last archived entries after each batch: versions 0 and 1.
    table: Path
    outputs: tuple[str, str]


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archived]:
    """A two-shard standalone's archive: 60 puts, then 20 overwrites, 20 new keys and 10
    deletes, each batch archived and then exported; snapshots every 30 entries, all kept."""
    root = tmp_path_factory.mktemp("delta-export")
    url, table = str(root / "archive"), root / "table"
    flags = ["--shards", str(_SHARDS), "--archive-url", url]
    flags += ["--archive-snapshot-entries", "30", "--archive-keep-snapshots", "100"]
    with standalone(root / "data", *flags) as server:
        _wait_every_shard_archived(server)  # the first snapshots: the archive reaches back to them
        with Client(server.address) as client:
            versions = {key: client.put(key, b"first " + key.encode()).version_id for key in _FIRST}
        _wait_every_shard_archived(server)
        first = _read_all(server.address, _KEYS)
        # Each linearizable read commits a no-op entry: archived before the export, the
        # export's offsets are the last entries written before `between`.
        _wait_every_shard_archived(server)
        first_output = _export(url, table)
        time.sleep(0.05)
        now = datetime.now(UTC)
        between = now.replace(microsecond=now.microsecond // 1000 * 1000)  # as --at keeps it
        time.sleep(0.05)
        with Client(server.address) as client:
            for key in _FIRST[40:] + _ADDED:
                versions[key] = client.put(key, b"second " + key.encode()).version_id
            for key in _FIRST[:10]:
                client.delete(key)
        _wait_every_shard_archived(server)
        second = _read_all(server.address, _KEYS)
        _wait_every_shard_archived(server)
        second_output = _export(url, table)
    assert sum(v is not None for v in first.values()) == 60
    assert sum(v is not None for v in second.values()) == 70
    yield Archived(url, first, second, between, versions, table, (first_output, second_output))


def _export(archive: str, table: Path, *at: str) -> str:
    result = run_cli("export-delta", "--archive-url", archive, "--table", str(table), *at)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _refused(archive: str, table: Path, *at: str) -> str:
    result = run_cli("export-delta", "--archive-url", archive, "--table", str(table), *at)
    assert result.returncode == 2, result.stdout + result.stderr
    return result.stderr


def _read(table: Path, version: int | None = None) -> pa.Table:
    delta = DeltaTable(table, version=version)
    return pa.table(QueryBuilder().register("t", delta).execute("SELECT * FROM t").read_all())


def _state(rows: pa.Table) -> dict[str, bytes]:
    return dict(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist()))


def _live(state: dict[str, bytes | None]) -> dict[str, bytes]:
    return {key: value for key, value in state.items() if value is not None}


def _point(table: Path, version: int) -> dict[str, Any]:
    """The point recorded in the commit of `version`."""
    (commit,) = [c for c in DeltaTable(table).history() if c["version"] == version]
    point: dict[str, Any] = json.loads(commit["userMetadata"])
    return point


# ------------------------------------------------------------------ tests


def test_each_export_is_a_version_that_time_travels(archived: Archived) -> None:
    """Exported after each batch: the latest version holds exactly what the cluster
    served then, version 0 what it served after the first batch, each record with its
    version, shard and the offset its shard was exported at."""
    first_output, second_output = archived.outputs
    assert "loaded" in first_output and "as version 0 of the Delta table" in first_output
    assert "records of 2 shards as version 1 of" in second_output
    table = archived.table
    assert DeltaTable(table).version() == 1
    assert _state(_read(table)) == _live(archived.second)
    v0 = _read(table, version=0)
    assert _state(v0) == _live(archived.first)
    assert {r["key"]: r["version_id"] for r in _read(table).to_pylist()} == {
        key: v for key, v in archived.versions.items() if key not in _FIRST[:10]
    }
    rows = v0.to_pylist()
    assert {r["namespace"] for r in rows} == {"default"}
    assert {r["shard"] for r in rows} == set(range(_SHARDS))  # 60 keys reach both shards
    for r in rows:
        assert r["created_timestamp"] == r["modified_timestamp"]
        assert abs(r["modified_timestamp"] - archived.between).total_seconds() < 60
    point0, point1 = _point(table, 0), _point(table, 1)
    assert point0["archive"] == archived.url and point0["at"] is None and point1["at"] is None
    assert {(r["shard"], r["commit_offset"]) for r in rows} == {
        (int(name.split("/")[1]), offset) for name, offset in point0["offsets"].items()
    }
    assert all(point1["offsets"][name] > point0["offsets"][name] for name in point0["offsets"])


def test_points_at_a_time_and_at_offsets(tmp_path: Path, archived: Archived) -> None:
    """`--at` as restore takes it: a time between the batches and the offsets version 0
    recorded both give the first state again; each export is recorded with its point."""
    table = tmp_path / "table"
    at_time = _export(archived.url, table, "--at", archived.between.isoformat())
    assert "as version 0 of" in at_time
    offsets = _point(archived.table, 0)["offsets"]
    at_offsets = ",".join(f"{name}={offset}" for name, offset in offsets.items())
    assert "as version 1 of" in _export(archived.url, table, "--at", at_offsets)
    assert "as version 2 of" in _export(archived.url, table)
    assert _state(_read(table, version=0)) == _live(archived.first)
    assert _state(_read(table, version=1)) == _live(archived.first)
    assert _state(_read(table)) == _live(archived.second)
    assert _point(table, 0)["at"] == archived.between.isoformat()
    assert _point(table, 0)["offsets"] == offsets
    assert _point(table, 1)["at"] == at_offsets
    assert _point(table, 2)["offsets"] == _point(archived.table, 1)["offsets"]


def test_what_an_export_refuses(tmp_path: Path, archived: Archived) -> None:
    """Each refusal is one line on stderr, exit status 2, and writes no version."""
    table = tmp_path / "table"
    empty = _refused(str(tmp_path / "nothing"), table)
    assert "nothing is archived" in empty
    _export(archived.url, table)
    assert "before the oldest kept snapshot" in _refused(
        archived.url, table, "--at", "2001-01-01T00:00:00Z"
    )
    assert "holds no shard default/5" in _refused(archived.url, table, "--at", "5=3")
    assert "past the last archived entry" in _refused(archived.url, table, "--at", "0=999999")
    assert "expected an ISO 8601 time" in _refused(archived.url, table, "--at", "yesterday")
    assert DeltaTable(table).version() == 0

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("not a table")
    assert "is not a Delta table and not empty" in _refused(archived.url, occupied)
    assert sorted(p.name for p in occupied.iterdir()) == ["notes.txt"]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert "is not a Delta table and not empty" in _refused(archived.url, a_file)

    other = tmp_path / "other"
    write_deltalake(other, pa.table({"id": pa.array([1, 2])}))
    assert "is a Delta table of other columns (id)" in _refused(archived.url, other)
    assert DeltaTable(other).version() == 0

    (tmp_path / "new-and-empty").mkdir()
    assert "as version 0 of" in _export(archived.url, tmp_path / "new-and-empty")


@pytest.mark.spark
def test_spark_reads_the_latest_version(archived: Archived) -> None:
    """Spark's own Parquet reader on the files of the latest version (delta-spark's jar,
    which `format("delta")` needs, cannot be fetched here): the same columns and rows.
    In an interpreter of its own, as every Spark test runs: its JVM outlives the session."""
    files = DeltaTable(archived.table).file_uris()
    result = subprocess.run(
        [sys.executable, "-c", _SPARK_READ, *files],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    read = json.loads(result.stdout.splitlines()[-1])
    assert [name for name, _ in read["dtypes"]] == _read(archived.table).column_names
    assert dict(read["dtypes"])["modified_timestamp"] == "timestamp"
    assert dict(read["dtypes"])["value"] == "binary"
    assert {key: value.encode() for key, value in read["rows"].items()} == _live(archived.second)


#: Reads the Parquet files named by its arguments in local Spark; prints their columns'
#: types and key -> value (as text) as JSON.
_SPARK_READ = """
import json, sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
frame = spark.read.parquet(*sys.argv[1:])
rows = {row["key"]: bytes(row["value"]).decode() for row in frame.collect()}
print(json.dumps({"dtypes": frame.dtypes, "rows": rows}))
spark.stop()
"""
