"""quorumstore's data service (`quorumstore.data.v1.QuorumstoreData`): Arrow in bulk.

What DataFrames need and Oxia's record-at-a-time protocol does not offer:

- `ScanArrow` streams a shard's records as Arrow from ONE snapshot of its KV, so a scan
  never sees part of a write batch, and says which offset that snapshot is at;
- `WriteArrow` turns a whole Arrow table into ONE replicated entry, optionally deleting
  a key range first in the same entry (an atomic replace), exactly once per
  (client id, serial);
- `StageArrow` keeps rows on the leader, unreplicated, until a `WriteArrow` publishes
  everything staged under a write id as one entry (Spark jobs: nothing is visible
  until the job commits, and then a shard's part appears at once);
- a `WriteArrow` too large for one entry (`max_entry_bytes`) is replicated as pieces
  that one small entry then publishes (`storage/staging.py`), so it too appears at once;
- `GetOffsets` / `ReadChanges` serve the change log (`storage/change_log.py`).

Scans and file work run on the service's own threads, off the node's event loop and
off the node's I/O pool (which does the WAL's fsyncs).

Staged rows live in `<staging root>/<write id>/<namespace>/<shard>/<part>.<chunk>.arrow`.
They are not replicated: a leader change between staging and publishing makes the
publish fail (FAILED_PRECONDITION), and the caller's write fails as a whole. Staged
rows are dropped when published, by `DiscardStaged`, or after `STAGING_TTL_S`. So are
the replicated pieces of a large write that was never published (its caller died): the
leader drops them with a replicated entry.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow_ipc import NotIpcStream, ipc_bytes, read_ipc
from quorumstore.event_loops import abandon
from quorumstore.node.aborts import abort
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.proto import quorumstore_data_pb2_grpc as pb_grpc
from quorumstore.proto import replication_pb2
from quorumstore.protocol.replica import NotLeaderError
from quorumstore.protocol.types import LogPosition
from quorumstore.storage import change_log, staging
from quorumstore.storage.keys import compare_keys
from quorumstore.storage.kv import KvClosedError, KvReader, KvSnapshot, KvStore
from quorumstore.storage.serials import decode_serial_record, serial_key
from quorumstore.storage.state_machine import (
    INDEX_SCAN_SCHEMA,
    SCAN_SCHEMA,
    EntryResult,
    Record,
    ShardReader,
    byte_bounded_runs,
)
from quorumstore.storage.write_batch import (
    ClientSerial,
    Staging,
    StagingKind,
    WriteBatchBuilder,
    decode_batch,
    encode_batch,
    puts_batch,
)

#: Trailing metadata key carrying the leader's address on FAILED_PRECONDITION.
LEADER_HINT_METADATA_KEY = "leader-hint"
#: Rows per scan chunk unless the request asks otherwise.
DEFAULT_SCAN_BATCH_ROWS = 65536
#: Rows per change chunk unless the request asks otherwise.
DEFAULT_CHANGE_CHUNK_ROWS = 65536
#: Largest write batch one WriteArrow may turn into an entry. The entry travels in one
#: gRPC message to each follower (256 MiB limit, see node/transport.py).
MAX_ENTRY_BYTES = 192 * 1024 * 1024
#: A larger write is replicated in pieces of about this many bytes, then published.
PIECE_BYTES = 32 * 1024 * 1024
_PIECES_IN_FLIGHT = 4
#: Largest part of one write for one shard. Every replica applies it in one KV write,
#: holding it in memory many times over (a 500 MB part of 100-byte values peaked at
#: 7.8 GB of resident memory in a standalone node: bench/publish_bench.py).
MAX_WRITE_BYTES = 512 * 1024 * 1024
#: Same limits as Oxia's client API (node/client_api.py).
MAX_KEY_BYTES = 64 * 1024
MAX_VALUE_BYTES = 16 * 1024 * 1024
#: Staged rows nobody published or discarded are dropped after this long.
STAGING_TTL_S = 24 * 60 * 60
_SWEEP_INTERVAL_S = 600

#: Columns of the rows a write carries (inline or staged).
ROWS_SCHEMA = pa.schema(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary(), nullable=False)]
)
#: Columns of a ReadChanges chunk: the change log's, then the entry's offset and time.
CHANGE_ROWS_SCHEMA = change_log.CHANGES_SCHEMA.append(
    pa.field("offset", pa.int64(), nullable=False)
).append(pa.field("timestamp_ms", pa.int64(), nullable=False))

_WRITE_ID = re.compile(r"[0-9a-f]{32}")
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")

_T = TypeVar("_T")


class DataShardHost(Protocol):
    """One shard replica on this node, as the data service uses it (a `ShardHost`)."""

    @property
    def kv(self) -> KvStore: ...

    def is_leader(self) -> bool: ...

    def leader_hint(self) -> str | None: ...

    async def write(self, payload: bytes) -> EntryResult: ...


class DataNode(Protocol):
    """What the service needs of its node (a `Node`)."""

    def shard_host(self, namespace: str, shard: int) -> DataShardHost | None: ...

    def assignments(self) -> replication_pb2.ShardAssignmentsUpdate: ...

    def led_hosts(self) -> Sequence[DataShardHost]: ...

    def now_ms(self) -> int: ...


class _Refused(Exception):
    """A request refused with a gRPC status; `abort` turns it into the RPC's status."""

    def __init__(self, code: grpc.StatusCode, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.leader = leader

    async def abort(self, context: grpc.aio.ServicerContext) -> NoReturn:
        metadata = ((LEADER_HINT_METADATA_KEY, self.leader),) if self.leader else ()
        await abort(context, self.code, self.message, metadata)


def _invalid(message: str) -> _Refused:
    return _Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


# ------------------------------------------------------------------ Arrow helpers


def read_rows(data: bytes, what: str) -> pa.Table:
    """The ROWS_SCHEMA table in an IPC stream; `_Refused` (INVALID_ARGUMENT) if it is not one."""
    try:
        table = read_ipc(data)
    except NotIpcStream as e:
        raise _invalid(f"{what} is not an Arrow IPC stream: {e}") from None
    missing = [f.name for f in ROWS_SCHEMA if f.name not in table.column_names]
    if missing:
        raise _invalid(f"{what} has no column(s) {missing}; it has {table.column_names}")
    table = table.select(ROWS_SCHEMA.names)
    for field in ROWS_SCHEMA:
        column = table.column(field.name)
        if column.type != field.type:
            raise _invalid(f"{what}: column {field.name!r} is {column.type}, expected {field.type}")
        if column.null_count:
            raise _invalid(f"{what}: column {field.name!r} holds {column.null_count} null(s)")
    return table.cast(ROWS_SCHEMA)


def _check_rows(rows: pa.Table, unique_keys: bool) -> None:
    if rows.num_rows == 0:
        return
    keys, values = rows.column("key"), rows.column("value")
    key_bytes = pc.binary_length(keys.cast(pa.binary()))
    if pc.min(key_bytes).as_py() == 0:
        raise _invalid("a row has an empty key")
    longest_key = pc.max(key_bytes).as_py()
    if longest_key > MAX_KEY_BYTES:
        raise _invalid(f"a key is {longest_key} bytes, above the limit of {MAX_KEY_BYTES} bytes")
    longest_value = pc.max(pc.binary_length(values)).as_py()
    if longest_value > MAX_VALUE_BYTES:
        raise _invalid(
            f"a value is {longest_value} bytes, above the limit of {MAX_VALUE_BYTES} bytes"
        )
    if unique_keys:
        distinct = pc.count_distinct(keys).as_py()
        if distinct != rows.num_rows:
            raise _invalid(
                f"{rows.num_rows - distinct} row(s) repeat a key of another row; "
                "each key may be written once per write"
            )


def write_payload(
    rows: pa.Table,
    timestamp_ms: int,
    origin: ClientSerial | None,
    replace: tuple[str, str] | None,
) -> bytes:
    """ONE write batch: delete `replace` (if given), then put every row."""
    keys = rows.column("key").combine_chunks()
    values = rows.column("value").combine_chunks()
    puts = puts_batch(keys, values, timestamp_ms, origin)
    if replace is None:
        return puts
    builder = WriteBatchBuilder()
    builder.add_delete_range(*replace)
    deletes = decode_batch(builder.build(timestamp_ms, origin))
    return encode_batch(pa.concat_batches([deletes, decode_batch(puts)]))


def _check_range(min_inclusive: str, max_exclusive: str, what: str) -> None:
    if max_exclusive and compare_keys(min_inclusive, max_exclusive) > 0:
        raise _invalid(
            f"{what}: {min_inclusive!r} sorts after {max_exclusive!r} in hierarchical key order"
        )


def _ranges(request_ranges: Sequence[pb.KeyRange]) -> list[tuple[str, str]]:
    ranges = [(r.min_inclusive, r.max_exclusive) for r in request_ranges]
    for i, (low, high) in enumerate(ranges):
        _check_range(low, high, f"ranges[{i}]")
    return ranges


# ------------------------------------------------------------------ reads from one snapshot


def _records_of_keys(reader: ShardReader, keys: Sequence[str]) -> pa.RecordBatch:
    found = [
        (key, record) for key in dict.fromkeys(keys) if (record := reader.get(key)) is not None
    ]
    return pa.RecordBatch.from_arrays(_record_columns(found), schema=SCAN_SCHEMA)


def _index_chunks(
    view: KvReader, index_name: str, low: str, high: str, batch_rows: int
) -> Iterator[bytes]:
    """INDEX_SCAN_SCHEMA batches of the records index `index_name` finds in [low, high)."""
    entries = ShardReader(view).range_scan_by_index(index_name, low, high)
    while chunk := list(itertools.islice(entries, batch_rows)):
        columns = _record_columns([(primary, record) for primary, _, record in chunk])
        secondary = pa.array([secondary for _, secondary, _ in chunk], pa.string())
        yield ipc_bytes(pa.RecordBatch.from_arrays([*columns, secondary], schema=INDEX_SCAN_SCHEMA))


def _record_columns(found: Sequence[tuple[str, Record]]) -> list[pa.Array]:
    """SCAN_SCHEMA's columns of (key, record) pairs."""
    columns = [
        [key for key, _ in found],
        [r.value for _, r in found],
        [r.version_id for _, r in found],
        [r.modifications_count for _, r in found],
        [r.created_ms for _, r in found],
        [r.modified_ms for _, r in found],
    ]
    return [pa.array(c, f.type) for c, f in zip(columns, SCAN_SCHEMA)]


def _scan_chunks(
    view: KvReader, ranges: Sequence[tuple[str, str]], keys: Sequence[str], batch_rows: int
) -> Iterator[bytes]:
    reader = ShardReader(view)
    if keys:
        batch = _records_of_keys(reader, keys)
        if batch.num_rows:
            yield ipc_bytes(batch)
    for low, high in ranges:
        for batch in reader.scan_arrow(low, high, batch_rows):
            yield ipc_bytes(batch)


def _split(
    view: KvReader, ranges: Sequence[tuple[str, str]], max_rows: int
) -> list[tuple[str, str]]:
    """`ranges` cut so that each piece holds at most `max_rows` keys of the snapshot."""
    reader = ShardReader(view)
    if reader.next_version_id <= max_rows:
        return list(ranges)  # every live key was put once at least: no range can be larger
    out: list[tuple[str, str]] = []
    for low, high in ranges:
        start = low
        count = 0
        for key in reader.list_keys(low, high):
            if count == max_rows:
                out.append((start, key))
                start, count = key, 0
            count += 1
        out.append((start, high))
    return out


def _change_chunks(
    view: KvReader, start_exclusive: int, end_inclusive: int, max_rows: int, skip_rows: int = 0
) -> Iterator[tuple[bytes, int]]:
    """(IPC of CHANGE_ROWS_SCHEMA rows, offset up to which every entry has been sent
    whole). Entries are kept whole in a chunk of at most `max_rows` rows; only an entry
    with more rows than that is split. `skip_rows` rows of the first entry are left out
    (a stream resumed inside a split entry)."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    whole = start_exclusive
    for offset, timestamp_ms, changes in change_log.read_changes(
        view, start_exclusive, end_inclusive
    ):
        n = changes.num_rows
        entry = changes.append_column(
            CHANGE_ROWS_SCHEMA.field("offset"), pa.repeat(pa.scalar(offset, pa.int64()), n)
        ).append_column(
            CHANGE_ROWS_SCHEMA.field("timestamp_ms"),
            pa.repeat(pa.scalar(timestamp_ms, pa.int64()), n),
        )
        if skip_rows:
            if skip_rows >= n:
                raise _invalid(f"skip_rows {skip_rows} leaves nothing of entry {offset} ({n} rows)")
            entry, skip_rows = entry.slice(skip_rows), 0
        if pending and rows + entry.num_rows > max_rows:
            yield ipc_bytes(pa.concat_batches(pending)), whole
            pending, rows = [], 0
        while entry.num_rows > max_rows:
            yield ipc_bytes(entry.slice(0, max_rows)), offset - 1
            entry = entry.slice(max_rows)
        pending.append(entry)
        rows += entry.num_rows
        whole = offset
    if pending:
        yield ipc_bytes(pa.concat_batches(pending)), whole


# ------------------------------------------------------------------ staging


class _Staging:
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
            raise _invalid(f"write_id must be 32 lowercase hex digits, got {write_id!r}")
        if not _NAME.fullmatch(namespace):
            raise _invalid(f"namespace {namespace!r} cannot be staged for")
        return self.root / write_id / namespace / str(shard)

    @staticmethod
    def _file(directory: Path, part: str, chunk: int) -> Path:
        if not _NAME.fullmatch(part):
            raise _invalid(f"part must be 1-128 letters, digits, '-', '_' or '.', got {part!r}")
        if chunk < 0:
            raise _invalid(f"chunk must be >= 0, got {chunk}")
        return directory / f"{part}.{chunk}.arrow"

    def check(self, write_id: str, namespace: str, shard: int, part: str, chunk: int) -> Path:
        return self._file(self._dir(write_id, namespace, shard), part, chunk)

    def put(self, path: Path, data: bytes) -> bool:
        """Keeps `data` at `path`; returns whether the periodic `sweep` ran after it."""
        write_id = path.relative_to(self.root).parts[0]
        with self._lock:
            if write_id in self._discarded:
                raise _Refused(
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
                    raise _Refused(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"staged chunk {chunk} of part {part.part!r} of write {write_id} is not on "
                        f"this node (shard {namespace}/{shard}): the leader changed since it was "
                        "staged, or it was discarded; the write must be retried as a whole",
                    ) from None
                table = read_rows(data, f"staged chunk {path.name}")
                got += table.num_rows
                tables.append(table)
            if got != part.rows:
                raise _Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"part {part.part!r} of write {write_id} staged {got} rows on this node, "
                    f"but its writer reported {part.rows}",
                )
        return pa.concat_tables(tables) if tables else ROWS_SCHEMA.empty_table()

    def drop(self, write_id: str, namespace: str | None = None, shard: int | None = None) -> None:
        """Deletes a write's rows (all, or one shard's); later puts of that write are refused."""
        if namespace is None or shard is None:
            if not _WRITE_ID.fullmatch(write_id):
                raise _invalid(f"write_id must be 32 lowercase hex digits, got {write_id!r}")
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


# ------------------------------------------------------------------ the servicer


class QuorumstoreDataServicer(pb_grpc.QuorumstoreDataServicer):
    """Serves `quorumstore.data.v1.QuorumstoreData` for the shards of one node.

    Reads (scans, changes, offsets) may be served by any replica that is asked to
    (`allow_follower`) or that has applied what is asked for (changes); writes and
    staging only by the shard's leader.

    Example (what `Node.start` does)::

        servicer = QuorumstoreDataServicer(node, data_dir / "data-staging")
        quorumstore_data_pb2_grpc.add_QuorumstoreDataServicer_to_server(servicer, server)
    """

    def __init__(
        self,
        node: DataNode,
        staging_root: Path,
        *,
        threads: int = 2,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        self._node = node
        self._max_entry_bytes = max_entry_bytes
        self._piece_bytes = piece_bytes
        self._staging = _Staging(staging_root)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="qs-data")

    async def _run(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def close(self) -> None:
        """Waits for the scans and file work still running on the service's threads."""
        await asyncio.to_thread(self._pool.shutdown, wait=True)

    # -------------------------------------------------------------- hosts

    def _host(self, namespace: str, shard: int, *, leader: bool) -> DataShardHost:
        host = self._node.shard_host(namespace, shard)
        if host is None:
            known = any(
                ns.namespace == namespace and any(s.shard == shard for s in ns.shards)
                for ns in self._node.assignments().namespaces
            )
            if not known:
                raise _invalid(f"unknown shard {namespace}/{shard}")
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"shard {namespace}/{shard} has no replica on this node",
                self._table_leader(namespace, shard),
            )
        if leader and not host.is_leader():
            hint = host.leader_hint()
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node is not leader for shard {namespace}/{shard}"
                + (f"; leader hint: {hint}" if hint else ""),
                hint,
            )
        return host

    def _table_leader(self, namespace: str, shard: int) -> str | None:
        for ns in self._node.assignments().namespaces:
            for s in ns.shards:
                if ns.namespace == namespace and s.shard == shard:
                    return s.leader or None
        return None

    @staticmethod
    def _snapshot(host: DataShardHost) -> KvSnapshot:
        try:
            return host.kv.snapshot()
        except KvClosedError as e:
            raise _Refused(
                grpc.StatusCode.UNAVAILABLE, f"the shard's store is closed: {e}"
            ) from None

    async def _stream(self, chunks: Iterator[_T], view: KvSnapshot) -> AsyncIterator[_T]:
        """Items of `chunks`, each produced on the service's threads; closes `view` at the end."""
        try:
            while (item := await self._run(next, chunks, None)) is not None:
                yield item
        except KvClosedError as e:
            raise _Refused(
                grpc.StatusCode.UNAVAILABLE, f"the shard's store was closed mid-read: {e}"
            ) from None
        finally:
            view.close()

    # -------------------------------------------------------------- routing and reads

    async def ListShards(
        self, request: pb.ListShardsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListShardsResponse:
        table = self._node.assignments()
        for ns in table.namespaces:
            if ns.namespace == request.namespace:
                return pb.ListShardsResponse(
                    shards=[
                        pb.ShardInfo(
                            shard=s.shard,
                            min_hash_inclusive=s.hash_range.min_hash_inclusive,
                            max_hash_inclusive=s.hash_range.max_hash_inclusive,
                            term=s.term,
                            leader=s.leader,
                            followers=list(s.followers),
                        )
                        for s in ns.shards
                    ]
                )
        known = sorted(ns.namespace for ns in table.namespaces)
        if not known:
            await abort(
                context, grpc.StatusCode.UNAVAILABLE, "this node has no shard assignments yet"
            )
        await abort(
            context,
            grpc.StatusCode.NOT_FOUND,
            f"namespace {request.namespace!r} not found (this cluster has {known})",
        )

    async def SplitRanges(
        self, request: pb.SplitRangesRequest, context: grpc.aio.ServicerContext
    ) -> pb.SplitRangesResponse:
        try:
            if request.max_rows < 1:
                raise _invalid(f"max_rows must be positive, got {request.max_rows}")
            ranges = _ranges(request.ranges) or [("", "")]
            host = self._host(request.namespace, request.shard, leader=not request.allow_follower)
            view = self._snapshot(host)
            try:
                pieces = await self._run(_split, view, ranges, request.max_rows)
            finally:
                view.close()
        except _Refused as e:
            await e.abort(context)
        return pb.SplitRangesResponse(
            ranges=[pb.KeyRange(min_inclusive=a, max_exclusive=b) for a, b in pieces]
        )

    async def ScanArrow(
        self, request: pb.ScanRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ArrowChunk]:
        try:
            if request.ranges and request.keys:
                raise _invalid("a scan reads ranges or keys, not both")
            if request.batch_rows < 0:
                raise _invalid(f"batch_rows must be >= 0, got {request.batch_rows}")
            index = request.secondary_index_name
            if index and (request.keys or len(request.ranges) > 1):
                raise _invalid(f"a scan through index {index!r} reads one range of secondary keys")
            ranges = _ranges(request.ranges)
            if not request.keys and not ranges:
                ranges = [("", "")]
            host = self._host(request.namespace, request.shard, leader=not request.allow_follower)
            view = self._snapshot(host)
            offset = ShardReader(view).applied_position.offset
            batch_rows = request.batch_rows or DEFAULT_SCAN_BATCH_ROWS
            chunks = (
                _index_chunks(view, index, *ranges[0], batch_rows)
                if index
                else _scan_chunks(view, ranges, list(request.keys), batch_rows)
            )
            sent = False
            async for ipc in self._stream(chunks, view):
                sent = True
                yield pb.ArrowChunk(ipc=ipc, commit_offset=offset)
            if not sent:  # the client still learns the snapshot's offset (and the schema)
                empty = pa.RecordBatch.from_pylist(
                    [], schema=INDEX_SCAN_SCHEMA if index else SCAN_SCHEMA
                )
                yield pb.ArrowChunk(ipc=ipc_bytes(empty), commit_offset=offset)
        except _Refused as e:
            await e.abort(context)

    # -------------------------------------------------------------- writes

    async def StageArrow(
        self, request: pb.StageArrowRequest, context: grpc.aio.ServicerContext
    ) -> pb.StageArrowResponse:
        try:
            path = self._staging.check(
                request.write_id, request.namespace, request.shard, request.part, request.chunk
            )
            self._host(request.namespace, request.shard, leader=True)
            rows = read_rows(request.ipc, "the staged rows")
            _check_rows(rows, unique_keys=False)
            if await self._run(self._staging.put, path, request.ipc):
                await self._discard_replicated(None)
        except _Refused as e:
            await e.abort(context)
        return pb.StageArrowResponse(rows=rows.num_rows)

    async def DiscardStaged(
        self, request: pb.DiscardStagedRequest, context: grpc.aio.ServicerContext
    ) -> pb.DiscardStagedResponse:
        try:
            await self._run(self._staging.drop, request.write_id)
            await self._discard_replicated([request.write_id])
        except _Refused as e:
            await e.abort(context)
        return pb.DiscardStagedResponse()

    async def WriteArrow(
        self, request: pb.WriteArrowRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteArrowResponse:
        try:
            return await self._write(request)
        except _Refused as e:
            await e.abort(context)

    async def _write(self, request: pb.WriteArrowRequest) -> pb.WriteArrowResponse:
        ns, shard = request.namespace, request.shard
        origin = None
        if request.has_serial:
            if not request.client_id or request.serial < 0:
                raise _invalid("an exactly-once write needs a client_id and a serial >= 0")
            origin = ClientSerial(request.client_id, request.serial)
        replace = None
        if request.replace:
            replace = (request.replace_min_inclusive, request.replace_max_exclusive)
            _check_range(*replace, "the replaced range")
        which = request.WhichOneof("rows")
        if which is None:
            raise _invalid("the request carries no rows (ipc or staged)")
        host = self._host(ns, shard, leader=True)
        if origin is not None and self._already_applied(host.kv, origin):
            # Published before: its staged rows may be gone already, so answer without them.
            if which == "staged" and not request.validate_only:
                await self._run(self._staging.drop, request.staged.write_id, ns, shard)
            return pb.WriteArrowResponse(offset=-1, duplicate=True)
        if which == "ipc":
            rows = read_rows(request.ipc, "the rows")
        else:
            rows = await self._run(
                self._staging.rows, request.staged.write_id, ns, shard, request.staged.parts
            )
        _check_rows(rows, request.unique_keys)
        payload = None
        if rows.nbytes <= self._max_entry_bytes:
            payload = await self._run(write_payload, rows, self._node.now_ms(), origin, replace)
            if len(payload) > self._max_entry_bytes:
                payload = None
        if payload is None and rows.nbytes > MAX_WRITE_BYTES:
            raise _invalid(
                f"the write holds {rows.nbytes} bytes for shard {ns}/{shard}, above the limit "
                f"of {MAX_WRITE_BYTES} bytes for one shard's part of one write; split it "
                "into smaller writes, or spread its keys over more shards"
            )
        row_count = rows.num_rows
        if request.validate_only:
            return pb.WriteArrowResponse(offset=-1, rows=row_count)
        try:
            if payload is None:
                write_id = request.staged.write_id if which == "staged" else uuid.uuid4().hex
                payload = await self._replicate_pieces(host, write_id, rows, origin, replace)
            # The payload or the replicated pieces carry the rows now: the apply of a
            # large part must not find them held here as well.
            del rows
            result = await host.write(payload)
        except NotLeaderError as e:
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION, f"shard {ns}/{shard}: {e}", e.leader_hint
            ) from None
        if result.refused is not None:
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"shard {ns}/{shard}: {result.refused}; the write must be retried as a whole",
            )
        if which == "staged":
            await self._run(self._staging.drop, request.staged.write_id, ns, shard)
        return pb.WriteArrowResponse(
            offset=result.offset, duplicate=result.duplicate, rows=row_count
        )

    async def _replicate_pieces(
        self,
        host: DataShardHost,
        write_id: str,
        rows: pa.Table,
        origin: ClientSerial | None,
        replace: tuple[str, str] | None,
    ) -> bytes:
        """Replicates `rows` as pieces of about `piece_bytes` and returns the payload of
        the ONE entry that publishes them (storage/staging.py): a reader sees none of the
        rows, then all of them."""
        stage = f"{write_id}/{uuid.uuid4().hex}"
        keys = rows.column("key").combine_chunks()
        values = rows.column("value").combine_chunks()
        bounds = list(byte_bounded_runs(keys, values, self._piece_bytes))
        in_flight: list[asyncio.Future[EntryResult]] = []
        try:
            for number, (start, stop) in enumerate(bounds):
                payload = await self._run(
                    puts_batch,
                    keys[start:stop],
                    values[start:stop],
                    self._node.now_ms(),
                    None,
                    Staging(StagingKind.PIECE, stage, number),
                )
                if len(in_flight) == _PIECES_IN_FLIGHT:
                    await in_flight.pop(0)
                in_flight.append(asyncio.ensure_future(host.write(payload)))
            for piece in in_flight:
                await piece
        finally:
            for piece in in_flight:
                abandon(piece)
        publish = WriteBatchBuilder()
        if replace is not None:
            publish.add_delete_range(*replace)
        return publish.build(
            self._node.now_ms(), origin, Staging(StagingKind.PUBLISH, stage, len(bounds))
        )

    async def _discard_replicated(self, write_ids: Sequence[str] | None) -> None:
        """Has every shard led here drop the pieces it keeps of `write_ids` (None: of
        writes whose pieces are older than STAGING_TTL_S). A shard whose leadership
        moves on meanwhile is left to its next leader's sweep."""
        for host in self._node.led_hosts():
            if write_ids is None:
                horizon = self._node.now_ms() - STAGING_TTL_S * 1000
                found = staging.writes_staged_before(host.kv, horizon)
            else:
                found = [w for w in write_ids if staging.has_pieces(host.kv, w)]
            for write_id in found:
                discard = Staging(StagingKind.DISCARD, write_id)
                try:
                    await host.write(WriteBatchBuilder().build(self._node.now_ms(), None, discard))
                except NotLeaderError:
                    break

    @staticmethod
    def _already_applied(kv: KvReader, origin: ClientSerial) -> bool:
        raw = kv.get(serial_key(origin.client_id))
        return raw is not None and origin.serial <= decode_serial_record(raw)[0]

    # -------------------------------------------------------------- changes

    async def GetOffsets(
        self, request: pb.GetOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetOffsetsResponse:
        try:
            host = self._host(request.namespace, request.shard, leader=not request.allow_follower)
            view = self._snapshot(host)
            try:
                applied: LogPosition = ShardReader(view).applied_position
                kept_after = change_log.changes_kept_after(view)
            finally:
                view.close()
        except _Refused as e:
            await e.abort(context)
        return pb.GetOffsetsResponse(commit_offset=applied.offset, changes_kept_after=kept_after)

    async def ReadChanges(
        self, request: pb.ReadChangesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ArrowChunk]:
        try:
            start, end = request.start_offset_exclusive, request.end_offset_inclusive
            if request.max_rows < 0:
                raise _invalid(f"max_rows must be >= 0, got {request.max_rows}")
            if end < start:
                raise _invalid(
                    f"end_offset_inclusive {end} is before start_offset_exclusive {start}"
                )
            host = self._host(request.namespace, request.shard, leader=False)
            view = self._snapshot(host)
            applied = ShardReader(view).applied_position.offset
            kept_after = change_log.changes_kept_after(view)
            if applied < end:
                view.close()
                raise _Refused(
                    grpc.StatusCode.UNAVAILABLE,
                    f"this replica of shard {request.namespace}/{request.shard} has applied up to "
                    f"offset {applied}, not yet {end}",
                    host.leader_hint(),
                )
            if start < kept_after:
                view.close()
                raise _Refused(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"the changes of shard {request.namespace}/{request.shard} up to offset "
                    f"{kept_after} expired (retention {change_log.CHANGE_RETENTION_MS} ms); "
                    f"changes after offset {start} were asked for",
                )
            if request.skip_rows < 0:
                raise _invalid(f"skip_rows must be >= 0, got {request.skip_rows}")
            chunks = _change_chunks(
                view,
                start,
                end,
                request.max_rows or DEFAULT_CHANGE_CHUNK_ROWS,
                request.skip_rows,
            )
            async for ipc, last in self._stream(chunks, view):
                yield pb.ArrowChunk(ipc=ipc, commit_offset=last)
        except _Refused as e:
            await e.abort(context)
