"""The change feed: `spark.readStream.format("quorumstore")`, one row per committed change.

Offsets are per-shard commit offsets, `{"<namespace>/<shard>": offset}`. A micro-batch
from offsets S to E reads, per shard, the change log entries in (S, E]
(`storage/change_log.py`): committed entries never change, so a batch read again after
a failure or a restart yields exactly the same rows, and Spark's checkpoint makes each
change appear once. E is a shard's applied offset on its leader (or on a follower
while the shard elects one), so everything up to E is committed; a replica that has
not applied E yet (a newly elected leader) is asked again until one has.

Rows have the batch read's schema (`datasource_read.output_schema`): `operation` is
put, delete or delete_range (then `range_end` is the range's exclusive end, empty when
unbounded), `commit_offset` the entry's offset, and `modified_timestamp` the entry's
time (for deletions too). Changes are kept `change_log.CHANGE_RETENTION_MS`; a stream
that falls further behind fails with OUT_OF_RANGE instead of skipping changes.

With the options `keyPrefix` and `keyStart`/`keyEnd` (a hierarchical range, as for batch
reads), only changes to such keys are delivered: their puts and deletes, and the range
deletes whose range holds such keys (with the range's own bounds, which may reach beyond
the followed keys). Keys are routed by hash, so every shard is still read.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from quorumstore.client.data_service import DataClient
from quorumstore.spark.datasource_keys import KeyRange, intersect, prefix_ranges
from quorumstore.spark.datasource_options import (
    QuorumstoreOptionError,
    SourceOptions,
    connect,
    parse_offsets,
)
from quorumstore.spark.datasource_read import RowShaper
from quorumstore.storage.write_batch import Op
from quorumstore.wire.keys import encode_keys, key_range

_OPERATIONS = pa.array(["put", "delete", "delete_range"])


@dataclass(frozen=True)
class ChangeKeys:
    """The keys a change feed follows: those starting with `prefix` within the
    hierarchical range [start, end) (an empty end: unbounded)."""

    prefix: str = ""
    start: str = ""
    end: str = ""

    @property
    def everything(self) -> bool:
        return not (self.prefix or self.start or self.end)

    @functools.cached_property
    def _ranges(self) -> list[KeyRange]:
        """The hierarchical ranges holding exactly the followed keys."""
        return intersect(prefix_ranges(self.prefix), [(self.start, self.end)])

    @functools.cached_property
    def _encoded_bounds(self) -> tuple[pa.Scalar, pa.Scalar]:
        low, high = key_range(self.start, self.end)
        return pa.scalar(low, pa.binary()), pa.scalar(high, pa.binary())

    def mask(self, batch: pa.RecordBatch) -> pa.Array:
        """Which change-log rows of `batch` touch followed keys: point changes of such
        keys, and range deletes whose hierarchical range holds one."""
        keys = batch.column("key")
        keep = pc.starts_with(keys, self.prefix)
        if self.start or self.end:
            encoded = encode_keys(keys)
            low, high = self._encoded_bounds
            keep = pc.and_(keep, pc.greater_equal(encoded, low))
            keep = pc.and_(keep, pc.less(encoded, high))
        is_range = pc.equal(batch.column("operation"), Op.DELETE_RANGE.value)
        if not pc.any(is_range).as_py():
            return keep
        # Range deletes are rare and few: only their rows are checked, in Python, against
        # the followed ranges; the batch's other rows are not taken out of Arrow.
        rows = pc.indices_nonzero(is_range)
        overlaps = np.zeros(len(batch), dtype=bool)
        overlaps[rows.to_numpy()] = [
            bool(intersect([(start, end or "")], self._ranges))
            for start, end in zip(
                keys.take(rows).to_pylist(),
                batch.column("range_end").take(rows).to_pylist(),
                strict=True,
            )
        ]
        return pc.or_(pc.and_not(keep, is_range), pa.array(overlaps))


@dataclass
class ChangePartition(InputPartition):
    """The changes of one shard's entries in (start, end]."""

    shard: int
    start: int
    end: int


class QuorumstoreChangeFeed(DataSourceStreamReader):
    """Streams committed changes of every shard of a namespace.

    Example::

        changes = (spark.readStream.format("quorumstore").option("address", address)
                   .option("startingOffsets", "earliest").load())
        query = (changes.writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.codec = options.read_codec()
        self.keys = ChangeKeys(options.key_prefix, options.key_start, options.key_end)
        with connect(options) as client:
            self._shards = [s.shard for s in client.shards()]
            if options.starting_offsets not in ("latest", "earliest"):
                starting = parse_offsets(options.starting_offsets)
                self._check_offsets(starting, "option startingOffsets")
                self._check_readable(client, starting)

    def _key(self, shard: int) -> str:
        return f"{self.options.namespace}/{shard}"

    def _check_offsets(self, offsets: dict[str, int], what: str) -> None:
        expected = {self._key(s) for s in self._shards}
        if set(offsets) != expected:
            raise QuorumstoreOptionError(
                "QUORUMSTORE_INVALID_OPTION",
                f"{what} must give an offset for exactly the shards {sorted(expected)}, got {sorted(offsets)}",
            )

    def _check_readable(self, client: DataClient, starting: dict[str, int]) -> None:
        """Each shard's start lies between its oldest kept change and its commit offset, as
        its leader says: below, the changes expired; above, the stream would wait for
        offsets that may never be written, silently delivering nothing until then."""
        for shard in self._shards:
            key = self._key(shard)
            offset, current = starting[key], client.offsets(shard)
            if offset > current.commit_offset:
                problem = f"is beyond its commit offset {current.commit_offset}"
            elif offset < current.changes_kept_after:
                problem = (
                    f"is before its oldest kept change: the changes up to offset "
                    f"{current.changes_kept_after} expired (notification retention)"
                )
            else:
                continue
            raise QuorumstoreOptionError(
                "QUORUMSTORE_INVALID_OPTION",
                f"option startingOffsets: {offset} for shard {key} {problem}; start between "
                f"{current.changes_kept_after} and {current.commit_offset}, or use "
                "'earliest' or 'latest'",
            )

    def _current(self, client: DataClient, earliest: bool) -> dict[str, int]:
        return {
            self._key(shard): offsets.changes_kept_after if earliest else offsets.commit_offset
            for shard, offsets in client.latest_offsets(self._shards).items()
        }

    def initialOffset(self) -> dict[str, int]:
        if self.options.starting_offsets in ("latest", "earliest"):
            with self.options.client() as client:
                return self._current(client, earliest=self.options.starting_offsets == "earliest")
        return parse_offsets(self.options.starting_offsets)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        with self.options.client() as client:
            latest = self._current(client, earliest=False)
        # A follower asked during an election may be behind what was read already.
        return {key: max(offset, start.get(key, -1)) for key, offset in latest.items()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[ChangePartition]:
        parts = []
        for shard in self._shards:
            key = self._key(shard)
            low, high = start.get(key, -1), end[key]
            if high > low:
                parts.append(ChangePartition(shard, low, high))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ChangePartition):
            raise TypeError(f"the change feed reads ChangePartitions, not {partition!r}")
        shaper = RowShaper(self.codec)
        with self.options.client() as client:
            for batch in client.changes(partition.shard, partition.start, partition.end):
                if not self.keys.everything:
                    batch = batch.filter(self.keys.mask(batch))
                if batch.num_rows == 0:
                    continue
                yield shaper.shape(
                    batch.set_column(
                        batch.schema.get_field_index("modified_ms"),
                        "modified_ms",
                        pc.coalesce(batch.column("modified_ms"), batch.column("timestamp_ms")),
                    ),
                    partition.shard,
                    batch.column("offset"),
                    _OPERATIONS.take(batch.column("operation")),
                    batch.column("range_end"),
                )

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the change log is kept by time, not by readers."""


class RefusedStreamReader(DataSourceStreamReader):
    """Raises a query's option error from its first call (see `QuorumstoreDataSource.streamReader`)."""

    def __init__(self, error: QuorumstoreOptionError) -> None:
        self._error = error

    def initialOffset(self) -> dict[str, int]:
        raise self._error

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        raise self._error

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        raise self._error

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self._error
