"""quorumstore's data service (`quorumstore.data.v1.QuorumstoreData`): Arrow in bulk.

What DataFrames need and Oxia's record-at-a-time protocol does not offer:

- `ScanArrow` streams a shard's records as Arrow from ONE snapshot of its KV, so a scan
  never sees part of a write batch, and says which offset that snapshot is at
  (`scans.py`);
- `WriteArrow` turns a whole Arrow table into ONE replicated entry, optionally deleting
  a key range first in the same entry (an atomic replace), exactly once per
  (client id, serial) (`writes.py`);
- `StageArrow` keeps rows on a replica of the shard, unreplicated, until a `WriteArrow`
  on the leader publishes everything staged there under a write id as one entry (Spark
  jobs: nothing is visible until the job commits, and then a shard's part appears at
  once). Clients stage on every replica, so that a leader elected between staging and
  publishing holds the rows too (`staging.py`);
- `GetOffsets` / `ReadChanges` serve the change log (`changes.py`).

The servicer finds the replica a call needs (`hosts.py`) and delegates. Scans and
file work run on the service's own threads, off the node's event loop and off the
node's I/O pool (which does the WAL's fsyncs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import grpc
import pyarrow as pa

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.node.aborts import abort
from quorumstore.node.data.changes import change_chunks
from quorumstore.node.data.errors import Refused, invalid
from quorumstore.node.data.hosts import DataNode, find_host, leader_snapshot, permit, snapshot
from quorumstore.node.data.scans import index_chunks, scan_chunks, split
from quorumstore.node.data.staging import StagedRows
from quorumstore.node.data.validation import check_rows, key_ranges, read_rows
from quorumstore.node.data.writes import MAX_ENTRY_BYTES, PIECE_BYTES, ArrowWrites
from quorumstore.node.limits import RequestLimits, client_of
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.proto import quorumstore_data_pb2_grpc as pb_grpc
from quorumstore.protocol.types import LogPosition
from quorumstore.storage import change_log
from quorumstore.storage.kv import KvClosedError, KvSnapshot
from quorumstore.storage.reads import ShardReader
from quorumstore.wire.schemas import INDEX_SCAN_SCHEMA, SCAN_SCHEMA

#: Rows per scan chunk unless the request asks otherwise.
DEFAULT_SCAN_BATCH_ROWS = 65536
#: Rows per change chunk unless the request asks otherwise.
DEFAULT_CHANGE_CHUNK_ROWS = 65536

_T = TypeVar("_T")


class QuorumstoreDataServicer(pb_grpc.QuorumstoreDataServicer):
    """Serves `quorumstore.data.v1.QuorumstoreData` for the shards of one node.

    Reads (scans, changes, offsets) may be served by any replica that is asked to
    (`allow_follower`) or that has applied what is asked for (changes); staging by any
    replica; writes only by the shard's leader.

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
        request_limits: RequestLimits = RequestLimits(),
    ) -> None:
        self._node = node
        self._staged = StagedRows(staging_root, request_limits)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="qs-data")
        self._writes = ArrowWrites(node, self._staged, self._run, max_entry_bytes, piece_bytes)

    async def _run(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def close(self) -> None:
        """Waits for the scans and file work still running on the service's threads."""
        await asyncio.to_thread(self._pool.shutdown, wait=True)

    async def _stream(self, chunks: Iterator[_T], view: KvSnapshot) -> AsyncIterator[_T]:
        """Items of `chunks`, each produced on the service's threads; closes `view` at the end."""
        try:
            while (item := await self._run(next, chunks, None)) is not None:
                yield item
        except KvClosedError as e:
            raise Refused(
                grpc.StatusCode.UNAVAILABLE, f"the shard's store was closed mid-read: {e}"
            ) from None
        finally:
            view.close()

    # -------------------------------------------------------------- routing and reads

    async def ListShards(
        self, request: pb.ListShardsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListShardsResponse:
        try:
            permit(request.namespace)
        except Refused as e:
            await e.abort(context)
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
                raise invalid(f"max_rows must be positive, got {request.max_rows}")
            ranges = key_ranges(request.ranges) or [("", "")]
            host = find_host(
                self._node, request.namespace, request.shard, leader=not request.allow_follower
            )
            view = snapshot(host)
            try:
                pieces = await self._run(split, view, ranges, request.max_rows)
            finally:
                view.close()
        except Refused as e:
            await e.abort(context)
        return pb.SplitRangesResponse(
            ranges=[pb.KeyRange(min_inclusive=a, max_exclusive=b) for a, b in pieces]
        )

    async def ScanArrow(
        self, request: pb.ScanRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ArrowChunk]:
        try:
            if request.ranges and request.keys:
                raise invalid("a scan reads ranges or keys, not both")
            if request.batch_rows < 0:
                raise invalid(f"batch_rows must be >= 0, got {request.batch_rows}")
            index = request.secondary_index_name
            if index and (request.keys or len(request.ranges) > 1):
                raise invalid(f"a scan through index {index!r} reads one range of secondary keys")
            ranges = key_ranges(request.ranges)
            if not request.keys and not ranges:
                ranges = [("", "")]
            host = find_host(
                self._node, request.namespace, request.shard, leader=not request.allow_follower
            )
            view = (
                snapshot(host)
                if request.allow_follower
                else await leader_snapshot(host, f"{request.namespace}/{request.shard}")
            )
            offset = ShardReader(view).applied_position.offset
            batch_rows = request.batch_rows or DEFAULT_SCAN_BATCH_ROWS
            chunks = (
                index_chunks(view, index, *ranges[0], batch_rows)
                if index
                else scan_chunks(view, ranges, list(request.keys), batch_rows)
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
        except Refused as e:
            await e.abort(context)

    # -------------------------------------------------------------- writes

    async def StageArrow(
        self, request: pb.StageArrowRequest, context: grpc.aio.ServicerContext
    ) -> pb.StageArrowResponse:
        try:
            path = self._staged.check(
                request.write_id, request.namespace, request.shard, request.part, request.chunk
            )
            find_host(self._node, request.namespace, request.shard, leader=False)
            rows = read_rows(request.ipc, "the staged rows")
            check_rows(rows, unique_keys=False)
            if await self._run(self._staged.put, path, request.ipc, client_of(context)):
                await self._writes.discard_replicated(None)
        except Refused as e:
            await e.abort(context)
        return pb.StageArrowResponse(rows=rows.num_rows)

    async def DiscardStaged(
        self, request: pb.DiscardStagedRequest, context: grpc.aio.ServicerContext
    ) -> pb.DiscardStagedResponse:
        try:
            await self._run(self._staged.drop, request.write_id)
            await self._writes.discard_replicated([request.write_id])
        except Refused as e:
            await e.abort(context)
        return pb.DiscardStagedResponse()

    async def WriteArrow(
        self, request: pb.WriteArrowRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteArrowResponse:
        try:
            return await self._writes.write(request)
        except Refused as e:
            await e.abort(context)

    # -------------------------------------------------------------- changes

    async def GetOffsets(
        self, request: pb.GetOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetOffsetsResponse:
        try:
            host = find_host(
                self._node, request.namespace, request.shard, leader=not request.allow_follower
            )
            view = snapshot(host)
            try:
                applied: LogPosition = ShardReader(view).applied_position
                kept_after = change_log.changes_kept_after(view)
            finally:
                view.close()
        except Refused as e:
            await e.abort(context)
        return pb.GetOffsetsResponse(commit_offset=applied.offset, changes_kept_after=kept_after)

    async def ReadChanges(
        self, request: pb.ReadChangesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ArrowChunk]:
        try:
            start, end = request.start_offset_exclusive, request.end_offset_inclusive
            if request.max_rows < 0:
                raise invalid(f"max_rows must be >= 0, got {request.max_rows}")
            if end < start:
                raise invalid(
                    f"end_offset_inclusive {end} is before start_offset_exclusive {start}"
                )
            host = find_host(self._node, request.namespace, request.shard, leader=False)
            view = snapshot(host)
            applied = ShardReader(view).applied_position.offset
            kept_after = change_log.changes_kept_after(view)
            if applied < end:
                view.close()
                raise Refused(
                    grpc.StatusCode.UNAVAILABLE,
                    f"this replica of shard {request.namespace}/{request.shard} has applied up to "
                    f"offset {applied}, not yet {end}",
                    host.leader_hint(),
                )
            if start < kept_after:
                view.close()
                raise Refused(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"the changes of shard {request.namespace}/{request.shard} up to offset "
                    f"{kept_after} expired (retention {change_log.CHANGE_RETENTION_MS} ms); "
                    f"changes after offset {start} were asked for",
                )
            if request.skip_rows < 0:
                raise invalid(f"skip_rows must be >= 0, got {request.skip_rows}")
            chunks = change_chunks(
                view,
                start,
                end,
                request.max_rows or DEFAULT_CHANGE_CHUNK_ROWS,
                request.skip_rows,
            )
            async for ipc, last in self._stream(chunks, view):
                yield pb.ArrowChunk(ipc=ipc, commit_offset=last)
        except Refused as e:
            await e.abort(context)
