"""Batch reads: `spark.read.format("quorumstore")`, one consistent snapshot per partition.

Planning (on the driver) makes one input partition per shard, several for a shard
larger than `maxRowsPerPartition` (cut by key range, `SplitRanges`), none for shards
the pushed filters exclude. Each task reads its partition with ONE `ScanArrow`, which
the node serves from one KV snapshot: a partition never sees part of a write batch,
and its `commit_offset` column says which offset the snapshot was at. Different
partitions may be read at different offsets.

Batch reads and the change feed (`datasource_stream.py`) share one schema, because
Spark asks a data source for its schema before it says whether it reads a batch or a
stream: a batch read is the set of puts that makes the current state (`operation` is
"put", `range_end` is null).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from quorumstore.client.data_service import DataClientError
from quorumstore.spark.datasource_keys import KeyFilter, KeyRange
from quorumstore.spark.datasource_options import QuorumstoreOptionError, SourceOptions, connect
from quorumstore.spark.datasource_values import ValueCodec, arrow_schema
from quorumstore.wire.keys import compare_keys

_META_FIELDS = [
    StructField("version_id", LongType()),
    StructField("modifications_count", LongType()),
    StructField("created_timestamp", TimestampType()),
    StructField("modified_timestamp", TimestampType()),
    StructField("shard", LongType()),
    StructField("commit_offset", LongType()),
    StructField("operation", StringType()),
    StructField("range_end", StringType()),
]
_TIMESTAMP = pa.timestamp("us", tz="UTC")
#: Rows per Arrow batch handed to Spark. Spark turns a Python source's batches into rows
#: at a cost that grows with batch size past ~16k rows: 10^6 rows of this schema took
#: 0.87-0.93 s in batches of 4,096-16,384 rows and 1.39-1.54 s in batches of 65,536
#: (local[2], no store behind the source). Smaller batches also hold less memory.
SPARK_BATCH_ROWS = 8192


def output_schema(codec: ValueCodec) -> StructType:
    """key, the value column(s), then the record's version and where it was read."""
    reserved = {"key"} | {f.name for f in _META_FIELDS}
    clash = sorted(f.name for f in codec.fields if f.name.lower() in reserved)
    if clash:
        raise QuorumstoreOptionError(
            "QUORUMSTORE_INVALID_SCHEMA",
            f"option valueSchema: column(s) {clash} clash with quorumstore's own columns {sorted(reserved)}",
        )
    return StructType([StructField("key", StringType()), *codec.fields, *_META_FIELDS])


def _timestamps(ms: pa.Array) -> pa.Array:
    return pc.multiply(ms, 1000).cast(_TIMESTAMP)


class RowShaper:
    """Turns the data service's batches into rows of `output_schema`."""

    def __init__(self, codec: ValueCodec) -> None:
        self.codec = codec
        self.schema = arrow_schema(output_schema(codec))

    def shape(
        self,
        batch: pa.RecordBatch,
        shard: int,
        commit_offsets: pa.Array,
        operations: pa.Array,
        range_ends: pa.Array,
    ) -> pa.RecordBatch:
        """`batch` has key, value, version_id, modifications_count, created_ms, modified_ms."""
        n = batch.num_rows
        columns = [
            batch.column("key"),
            *self.codec.decode(batch.column("value")),
            batch.column("version_id"),
            batch.column("modifications_count"),
            _timestamps(batch.column("created_ms")),
            _timestamps(batch.column("modified_ms")),
            pa.repeat(pa.scalar(shard, pa.int64()), n),
            commit_offsets,
            operations,
            range_ends,
        ]
        return pa.RecordBatch.from_arrays(
            [c.cast(f.type) for c, f in zip(columns, self.schema)], schema=self.schema
        )


@dataclass
class ScanPartition(InputPartition):
    """Records of one shard in some hierarchical key ranges, or of some keys."""

    shard: int
    ranges: list[KeyRange]
    keys: list[str]


class QuorumstoreScan(DataSourceReader):
    """Reads committed records; key (and shard) filters prune shards and key ranges.

    Filter pushdown needs `spark.sql.python.filterPushdown.enabled=true` (Spark refuses
    a reader that implements pushFilters otherwise); `quorumstore.spark.datasource.register` sets it.
    Pushed key filters are evaluated exactly here, so Spark does not evaluate them again;
    `df.explain("formatted")` lists them under PushedFilters.

    Example::

        df = (spark.read.format("quorumstore").option("address", address).load()
              .where("key LIKE 'user/%' AND key >= 'user/100'"))
        df.explain("formatted")        # PushedFilters: [..., StringStartsWith(key,user/), ...]
        df.rdd.getNumPartitions()      # one per shard
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.codec = options.read_codec()
        expected = output_schema(self.codec)
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in expected.fields
        ]:
            raise QuorumstoreOptionError(
                "QUORUMSTORE_INVALID_SCHEMA",
                f"the schema given with .schema() is {schema.simpleString()}, but quorumstore reads "
                f"{expected.simpleString()}; describe typed values with the options valueFormat and "
                "valueSchema instead",
            )
        self.filter = KeyFilter()
        if options.key_prefix:
            self.filter.restrict_prefix(options.key_prefix)

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self.filter.push(f):
                yield f

    def _in_option_range(self, key: str) -> bool:
        low, high = self.options.key_start, self.options.key_end
        return compare_keys(low, key) <= 0 and (not high or compare_keys(key, high) < 0)

    def partitions(self) -> list[ScanPartition]:
        with connect(self.options) as client:
            shards = [s.shard for s in client.shards()]
            if self.filter.shards is not None:
                shards = [s for s in shards if s in self.filter.shards]
            if self.filter.keys is not None:
                by_shard: dict[int, list[str]] = {}
                for key in sorted(self.filter.keys):
                    if self.filter.matches(key) and self._in_option_range(key):
                        by_shard.setdefault(client.shard_of(key), []).append(key)
                return [ScanPartition(s, [], by_shard[s]) for s in shards if s in by_shard]
            ranges = self.filter.ranges([(self.options.key_start, self.options.key_end)])
            if not ranges:
                return []
            follower = self.options.read_from == "follower"
            splits = client.each_shard(
                shards,
                lambda shard_client, shard: shard_client.split_ranges(
                    shard, ranges, self.options.max_rows_per_partition, allow_follower=follower
                ),
            )
            out = []
            for shard, pieces in splits.items():
                if isinstance(pieces, DataClientError):
                    raise pieces
                if pieces == ranges:
                    out.append(ScanPartition(shard, ranges, []))
                else:
                    out.extend(ScanPartition(shard, [piece], []) for piece in pieces)
            return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ScanPartition):
            return  # Spark reads one placeholder partition when planning found none to read
        shaper = RowShaper(self.codec)
        client = self.options.client()
        try:
            scan = client.scan(
                partition.shard,
                partition.ranges,
                partition.keys,
                allow_follower=self.options.read_from == "follower",
                batch_rows=SPARK_BATCH_ROWS,
            )
            for batch, commit_offset in scan:
                mask = self.filter.mask(batch.column("key"))
                if mask is not None:
                    batch = batch.filter(mask)
                n = batch.num_rows
                if n == 0:
                    continue
                yield shaper.shape(
                    batch,
                    partition.shard,
                    pa.repeat(pa.scalar(commit_offset, pa.int64()), n),
                    pa.repeat(pa.scalar("put"), n),
                    pa.nulls(n, pa.string()),
                )
        finally:
            client.close()
