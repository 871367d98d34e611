"""DataFrame read benchmark: 10^6 committed rows from quorumstore vs the same rows from Parquet.

One run, one Spark session (local[2]), side by side:

1. a `quorumstore standalone` server (4 shards, no fsync; reads do not touch the WAL)
   is loaded with N rows (key `bench/%07d`, a 100-byte random value) through the data
   service, one exactly-once entry per shard chunk; the same rows go to a local
   Parquet file (pyarrow, snappy);
2. both are read once untimed (Python workers started, caches warm), then each
   measurement runs REPEATS times alternating the two sources, and the best time of
   each counts (the data service's own scan rate, without Spark, is printed too):
   - count:       ``df.count()``, as Spark plans it for each source (Parquet answers
                  from row-group metadata without decoding rows; a Python data source
                  always produces every row and column);
   - read + count: ``df.agg(count(key), count(value))``, which makes both sources
                  produce the key and value of every row.

Printed: rows/s of each source per measurement and the quorumstore/Parquet ratio
(the goal is >= 0.5 on "read + count"). A third source, the *Python data source floor*,
yields the same number of rows in quorumstore's schema, in batches of the size
quorumstore's reader yields, built once in each task, with no store behind it: what Spark's Python Data Source API alone costs for
these rows, i.e. the best any Python data source could do here.

Usage: python bench/dataframe_read_bench.py [--rows N] [--repeats R] [--address HOST:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))  # runs from a checkout, installed or not

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from quorumstore.client.data_service import DataClient
from quorumstore.spark.datasource_read import SPARK_BATCH_ROWS, RowShaper, output_schema
from quorumstore.spark.datasource_values import ValueCodec
from quorumstore.testing import standalone_server
from quorumstore.wire.metadata import ClientSerial
from quorumstore.wire.schemas import SCAN_SCHEMA

SHARDS = 4
VALUE_BYTES = 100
LOAD_CHUNK = 50_000


def make_rows(start: int, stop: int) -> pa.Table:
    keys = pa.array([f"bench/{i:07d}" for i in range(start, stop)], pa.string())
    values = pa.array([os.urandom(VALUE_BYTES) for _ in range(start, stop)], pa.binary())
    return pa.table({"key": keys, "value": values})


def load(address: str, rows: int, parquet_path: Path) -> float:
    """Writes the rows to quorumstore and to Parquet; returns the seconds quorumstore took."""
    spent = 0.0
    with (
        DataClient(address) as client,
        pq.ParquetWriter(parquet_path, make_rows(0, 0).schema) as parquet,
    ):
        for n, start in enumerate(range(0, rows, LOAD_CHUNK)):
            table = make_rows(start, min(start + LOAD_CHUNK, rows))
            parquet.write_table(table)
            began = time.perf_counter()
            for shard, part in client.route(table).items():
                client.write(shard, part, origin=ClientSerial("dataframe-read-bench", n))
            spent += time.perf_counter() - began
    return spent


def scan_all(address: str, rows: int) -> None:
    """Every row through the data service alone, shard after shard, as Spark's tasks read them."""
    with DataClient(address) as client:
        got = sum(b.num_rows for s in client.shards() for b, _ in client.scan(s.shard))
    assert got == rows, f"scanned {got} rows, not {rows}"


class _FloorReader(DataSourceReader):
    """Yields `rows` rows of quorumstore's read schema, in SHARDS partitions, from one
    prebuilt batch per task: Spark's own cost of a Python data source, and nothing else."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(SHARDS)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        n = SPARK_BATCH_ROWS
        stored = pa.record_batch(
            {
                "key": pa.array([f"bench/{i:07d}" for i in range(n)], pa.string()),
                "value": pa.array([os.urandom(VALUE_BYTES) for _ in range(n)], pa.binary()),
                **{c: pa.array(range(n), pa.int64()) for c in SCAN_SCHEMA.names[2:]},
            }
        )
        batch = RowShaper(ValueCodec.for_read("binary", None)).shape(
            stored,
            partition.value,
            pa.repeat(pa.scalar(1, pa.int64()), n),
            pa.repeat(pa.scalar("put"), n),
            pa.nulls(n, pa.string()),
        )
        share = self.rows // SHARDS + (partition.value < self.rows % SHARDS)
        for start in range(0, share, n):
            yield batch.slice(0, min(n, share - start))


class PythonSourceFloor(DataSource):
    """`spark.read.format("python_source_floor").option("rows", N)`: see _FloorReader."""

    @classmethod
    def name(cls) -> str:
        return "python_source_floor"

    def schema(self) -> StructType:
        return output_schema(ValueCodec.for_read("binary", None))

    def reader(self, schema: StructType) -> DataSourceReader:
        return _FloorReader(int(self.options["rows"]))


def best_of(repeats: int, runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best wall time of each run, the runs alternating so that drift hurts all alike."""
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            began = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - began)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--address", help="an already running, empty quorumstore (default: start one)"
    )
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    from quorumstore.spark.datasource import register

    work = Path(tempfile.mkdtemp(prefix="qs-df-bench-"))
    stack = contextlib.ExitStack()
    address = args.address or stack.enter_context(
        standalone_server(work / "server", SHARDS, fsync=False)
    )
    spark = None
    try:
        parquet_path = work / "rows.parquet"
        load_s = load(address, args.rows, parquet_path)
        print(
            f"loaded {args.rows} rows into {SHARDS} shards in {load_s:.1f} s ({args.rows / load_s:,.0f} rows/s); "
            f"Parquet file {parquet_path.stat().st_size / 1e6:.0f} MB",
            flush=True,
        )

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("dataframe-read-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark, address=address)
        spark.dataSource.register(PythonSourceFloor)
        sources = {
            "quorumstore": spark.read.format("quorumstore").load(),
            "parquet": spark.read.parquet(str(parquet_path)),
            "floor": spark.read.format("python_source_floor").option("rows", args.rows).load(),
        }
        for name, df in sources.items():
            assert df.count() == args.rows, f"{name} does not hold {args.rows} rows"

        counts = best_of(args.repeats, {name: df.count for name, df in sources.items()})

        def read_all(df: DataFrame) -> Callable[[], object]:
            return lambda: df.agg(F.count("key"), F.count("value")).collect()

        reads = best_of(args.repeats, {name: read_all(df) for name, df in sources.items()})
        scan = best_of(args.repeats, {"quorumstore": lambda: scan_all(address, args.rows)})
        partitions = sources["quorumstore"].rdd.getNumPartitions()
        print(
            f"\nrows: {args.rows}, quorumstore partitions: {partitions}, Spark local[2], "
            f"best of {args.repeats}; the data service alone (one client, no Spark) scans "
            f"{args.rows / scan['quorumstore']:,.0f} rows/s",
            flush=True,
        )
        for label, times in (("count", counts), ("read + count", reads)):
            qs, pq_, fl = (args.rows / times[name] for name in ("quorumstore", "parquet", "floor"))
            print(
                f"{label:>13}: quorumstore {qs:>12,.0f} rows/s ({times['quorumstore']:.2f} s)   "
                f"parquet {pq_:>12,.0f} rows/s ({times['parquet']:.2f} s)   ratio {qs / pq_:.2f}x   "
                f"| Python data source floor {fl:>12,.0f} rows/s ({times['floor']:.2f} s), "
                f"{fl / pq_:.2f}x parquet; quorumstore {qs / fl:.2f}x floor"
            )
        return 0
    finally:
        if spark is not None:
            spark.stop()
        stack.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
