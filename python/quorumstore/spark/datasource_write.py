"""Writes: `df.write.format("quorumstore")` (staged, published at job commit) and the streaming sink.

Batch writes, append or overwrite:

1. Each task encodes its rows into (key, value), routes them by key hash and stages
   them on each shard's leader (`StageArrow`) under the job's write id and its own
   task attempt: nothing is visible yet. The attempt reports what it staged.
2. At job commit the driver first has every shard's leader check its part (staged
   rows present, limits, no key written twice), then publishes each shard's part as
   ONE replicated entry (`WriteArrow` of the staged rows), exactly once per
   (write id, shard). A retried or speculative task attempt staged under its own
   attempt id, and only the attempt Spark committed is published: nothing is written
   twice. Overwrite deletes the written key range in that same entry.
3. A failed job (a task failed for good, or the check of step 2 failed) publishes
   nothing; its staged rows are discarded.

So a shard shows either none or all of a job's rows for it. Shards are published one
after another, not atomically together: a reader during step 2 may see some shards
with the job's rows and others without, and a leader change between the check and
the publish of a shard (its staged rows stay on the old leader) fails the job with
the shards published so far named in the error.

Overwrite replaces the written key range: every key k with min <= k <= max, in Oxia's
hierarchical key order, where min and max are the smallest and largest keys written,
is deleted and the written rows put, in each shard's one entry. Keys outside that
range are kept; writing no rows deletes nothing.

The streaming sink writes each task's rows directly (no staging) with exactly-once
serials: client id ``spark-stream/<query id>/<partition>``, serial
``batch id << 20 | chunk``. Spark's query id survives restarts from the checkpoint, so
a micro-batch replayed after a failure or restart (same rows in the same partitions,
as Spark replays them) writes nothing twice, within the store's serial retention
(`storage/serials.SERIAL_TTL_MS`, 1 h).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from quorumstore.client.data_service import DataClient, DataClientError, WriteResult
from quorumstore.spark.datasource_options import QuorumstoreOptionError, SourceOptions, connect
from quorumstore.spark.datasource_values import (
    TYPED_FORMATS,
    SchemaError,
    ValueCodec,
    value_columns,
)
from quorumstore.wire.keys import decode_key, encode_keys
from quorumstore.wire.metadata import ClientSerial

#: A shard's staged or written chunk is cut at `chunkRows` rows or about this many
#: bytes, whichever comes first.
CHUNK_BYTES = 8 * 1024 * 1024
#: After a failed or aborted write, how long dropping its staged rows waits for the
#: nodes once one answered (after a publish, which dropped what it published, 0.1 s).
DISCARD_AFTER_FAILURE_S = 1.0
#: Stream serials: batch id << _CHUNK_BITS | chunk index within (batch, partition, shard).
_CHUNK_BITS = 20


class QuorumstoreWriteError(PySparkRuntimeError):
    """A write could not be completed; the message says what was and was not written."""

    def __init__(self, message: str) -> None:
        super().__init__(
            message=message, errorClass="QUORUMSTORE_WRITE_FAILED", messageParameters={}
        )


class RowEncoder:
    """Input rows -> (key, value) rows, per the write options; checked on the driver."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        names = schema.fieldNames()
        by_name = {f.name: f for f in schema.fields}
        if "key" not in by_name:
            raise QuorumstoreOptionError(
                "QUORUMSTORE_MISSING_COLUMN",
                f"the DataFrame has no column 'key' (a string) to write as the key; its columns are {names}",
            )
        if not isinstance(by_name["key"].dataType, StringType):
            raise QuorumstoreOptionError(
                "QUORUMSTORE_INVALID_SCHEMA",
                f"column 'key' must be a string, not {by_name['key'].dataType.simpleString()}",
            )
        fmt = options.value_format
        columns = value_columns(fmt, names, options.value_columns)
        missing = [c for c in columns if c not in by_name]
        if missing:
            raise QuorumstoreOptionError(
                "QUORUMSTORE_MISSING_COLUMN",
                f"the DataFrame has no column(s) {missing} to write as the value; its columns are {names}",
            )
        if "key" in columns:
            raise QuorumstoreOptionError(
                "QUORUMSTORE_INVALID_OPTION", "valueColumns must not name 'key'"
            )
        unused = [n for n in names if n != "key" and n not in columns]
        if unused and options.value_columns is None:
            raise QuorumstoreOptionError(
                "QUORUMSTORE_INVALID_SCHEMA",
                f"column(s) {unused} would not be written: select only key and {columns}, name the "
                "value's columns with valueColumns, or store several columns with valueFormat json or arrow",
            )
        if fmt not in TYPED_FORMATS:
            wanted = BinaryType if fmt == "binary" else StringType
            actual = by_name[columns[0]].dataType
            if not isinstance(actual, wanted):
                raise QuorumstoreOptionError(
                    "QUORUMSTORE_INVALID_SCHEMA",
                    f"valueFormat {fmt!r} writes a {wanted().simpleString()} column, but {columns[0]!r} is "
                    f"{actual.simpleString()}; cast it, or choose another valueFormat",
                )
        value_schema = StructType([by_name[c] for c in columns])
        try:
            self.codec = ValueCodec(fmt, value_schema if fmt in TYPED_FORMATS else None)
        except SchemaError as e:
            raise QuorumstoreOptionError("QUORUMSTORE_INVALID_SCHEMA", str(e)) from None
        self.columns = columns

    def rows(self, batch: pa.RecordBatch) -> pa.Table:
        keys = batch.column("key")
        if keys.null_count:
            raise QuorumstoreOptionError(
                "QUORUMSTORE_NULL_KEY",
                f"{keys.null_count} row(s) to write have a null key, and a record needs one: "
                "drop those rows (df.where('key IS NOT NULL')) or fill their keys",
            )
        values = self.codec.encode(batch.select(self.columns))
        if values.null_count:
            raise QuorumstoreOptionError(
                "QUORUMSTORE_NULL_VALUE",
                f"{values.null_count} row(s) to write have a null value ({self.columns}), "
                "which a record cannot hold: drop those rows, fill the value (coalesce), or "
                "store several columns with valueFormat json or arrow",
            )
        return pa.table({"key": keys.cast(pa.string()), "value": values})


class _ShardBuffers:
    """Rows routed to shards, cut into chunks of about `chunk_rows` rows / CHUNK_BYTES."""

    def __init__(self, chunk_rows: int) -> None:
        self._chunk_rows = chunk_rows
        self._tables: dict[int, list[pa.Table]] = {}
        self._rows: dict[int, int] = {}
        self._bytes: dict[int, int] = {}

    def add(self, shard: int, rows: pa.Table) -> pa.Table | None:
        """Buffers `rows`; returns the shard's chunk once it is full."""
        self._tables.setdefault(shard, []).append(rows)
        self._rows[shard] = self._rows.get(shard, 0) + rows.num_rows
        self._bytes[shard] = self._bytes.get(shard, 0) + rows.nbytes
        if self._rows[shard] >= self._chunk_rows or self._bytes[shard] >= CHUNK_BYTES:
            return self.take(shard)
        return None

    def take(self, shard: int) -> pa.Table:
        self._rows[shard] = self._bytes[shard] = 0
        return pa.concat_tables(self._tables.pop(shard))

    def shards(self) -> list[int]:
        return sorted(s for s, tables in self._tables.items() if tables)


@dataclass
class StagedWrite(WriterCommitMessage):
    """What one task attempt staged: shard -> (chunks, rows), and its key range (encoded)."""

    part: str
    shards: dict[int, tuple[int, int]] = field(default_factory=dict)
    min_key: bytes | None = None
    max_key: bytes | None = None


class QuorumstoreBatchWriter(DataSourceArrowWriter):
    """Stages rows in tasks and publishes them per shard at job commit (module docstring).

    Example::

        (df.select("key", "value").write.format("quorumstore")
           .option("address", address).mode("append").save())
    """

    def __init__(self, options: SourceOptions, encoder: RowEncoder, overwrite: bool) -> None:
        self.options = options
        self.encoder = encoder
        self.overwrite = overwrite
        # Made once, on the driver; every task attempt and the commit see the same id.
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedWrite:
        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        # taskAttemptId is unique in the application, unlike (partition, attemptNumber)
        # across stage attempts.
        message = StagedWrite(part=f"{context.partitionId()}-{context.taskAttemptId()}")
        buffers = _ShardBuffers(self.options.chunk_rows)
        with self.options.client() as client:

            def stage(shard: int, rows: pa.Table, on: DataClient = client) -> None:
                chunks, count = message.shards.get(shard, (0, 0))
                on.stage(shard, self.write_id, message.part, chunks, rows)
                message.shards[shard] = (chunks + 1, count + rows.num_rows)

            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                rows = self.encoder.rows(batch)
                low, high = pc.min_max(encode_keys(rows.column("key").combine_chunks())).values()
                message.min_key = min(x for x in (message.min_key, low.as_py()) if x is not None)
                message.max_key = max(x for x in (message.max_key, high.as_py()) if x is not None)
                for shard, part in client.route(rows).items():
                    chunk = buffers.add(shard, part)
                    if chunk is not None:
                        stage(shard, chunk)
            # The last chunks, often the only ones, go to all their shards at once.
            last = {shard: buffers.take(shard) for shard in buffers.shards()}
            staged = client.each_shard(
                list(last), lambda shard_client, shard: stage(shard, last[shard], shard_client)
            )
            for error in staged.values():
                if isinstance(error, DataClientError):
                    raise error
        return message

    def _replace_range(self, messages: Sequence[StagedWrite]) -> tuple[str, str] | None:
        lows = [m.min_key for m in messages if m.min_key is not None]
        highs = [m.max_key for m in messages if m.max_key is not None]
        if not self.overwrite or not lows:
            return None
        # k + "\0" is the next key after k in hierarchical order: [min, max] inclusive.
        return decode_key(min(lows)), decode_key(max(highs)) + "\x00"

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = [m for m in messages if isinstance(m, StagedWrite)]
        parts: dict[int, list[tuple[str, int, int]]] = {}
        for m in staged:
            for shard, (chunks, rows) in m.shards.items():
                parts.setdefault(shard, []).append((m.part, chunks, rows))
        replace = self._replace_range(staged)
        origin = ClientSerial(f"spark-write/{self.write_id}", 0)
        published: list[int] = []
        failed = True
        with connect(self.options) as client:
            targets = [s.shard for s in client.shards()] if replace else sorted(parts)
            try:
                # Every shard validates before any publishes; each round asks all the
                # shards at once, so a fault on one leader delays the round only once.
                for validate_only in (True, False):

                    def publish(
                        shard_client: DataClient, shard: int, validate_only: bool = validate_only
                    ) -> WriteResult:
                        return shard_client.publish(
                            shard,
                            self.write_id,
                            parts.get(shard, []),
                            origin=origin,
                            replace=replace,
                            unique_keys=True,
                            validate_only=validate_only,
                        )

                    results = client.each_shard(targets, publish)
                    errors = [r for r in results.values() if isinstance(r, DataClientError)]
                    if not validate_only:
                        published += [
                            s for s, r in results.items() if not isinstance(r, DataClientError)
                        ]
                    if errors:
                        raise errors[0]
                failed = False
            except DataClientError as e:
                done = (
                    f"shards {sorted(published)} were written, {sorted(set(targets) - set(published))} were not"
                    if published
                    else "nothing was written"
                )
                raise QuorumstoreWriteError(
                    f"write {self.write_id} failed at commit ({done}): {e}"
                ) from None
            finally:
                client.discard(self.write_id, wait_s=DISCARD_AFTER_FAILURE_S if failed else 0.1)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.options.client() as client:
            client.discard(self.write_id, wait_s=DISCARD_AFTER_FAILURE_S)


@dataclass
class StreamedWrite(WriterCommitMessage):
    rows: int = 0
    #: Chunks found written before (a replayed micro-batch).
    duplicate_chunks: int = 0


class QuorumstoreStreamWriter(DataSourceStreamArrowWriter):
    """The streaming sink: each micro-batch's rows written exactly once by batch id.

    Example::

        (events.select("key", "value").writeStream.format("quorumstore")
           .option("address", address).option("checkpointLocation", checkpoint).start())
    """

    def __init__(self, options: SourceOptions, encoder: RowEncoder) -> None:
        self.options = options
        self.encoder = encoder

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamedWrite:
        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        query_id = context.getLocalProperty("sql.streaming.queryId")
        if batch_id is None or query_id is None:
            raise RuntimeError("the streaming sink runs without Spark's batch id or query id")
        client_id = f"spark-stream/{query_id}/{context.partitionId()}"
        chunks: dict[int, int] = {}
        message = StreamedWrite()
        buffers = _ShardBuffers(self.options.chunk_rows)
        with self.options.client() as client:

            def send(shard: int, rows: pa.Table) -> None:
                index = chunks.get(shard, 0)
                if index >> _CHUNK_BITS:
                    raise RuntimeError(
                        f"micro-batch {batch_id} has over {1 << _CHUNK_BITS} chunks for shard {shard}"
                    )
                serial = (int(batch_id) << _CHUNK_BITS) | index
                result = client.write(shard, rows, origin=ClientSerial(client_id, serial))
                chunks[shard] = index + 1
                message.rows += rows.num_rows
                message.duplicate_chunks += result.duplicate

            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                for shard, part in client.route(self.encoder.rows(batch)).items():
                    chunk = buffers.add(shard, part)
                    if chunk is not None:
                        send(shard, chunk)
            for shard in buffers.shards():
                send(shard, buffers.take(shard))
        return message

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's rows were written, exactly once, when it finished."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: the replay of this batch skips what was written (same serials)."""


def check_stream_mode(overwrite: bool) -> None:
    if overwrite:
        raise QuorumstoreOptionError(
            "QUORUMSTORE_INVALID_OPTION",
            "the quorumstore sink supports the append output mode only, not complete or update",
        )
