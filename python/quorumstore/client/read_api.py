"""The read operations of `AsyncClient`: get, list, range_scan and scan.

Exact-match gets of a shard queue on its read batcher (`batcher.py`) and travel as
one `Read` (`reads.py`); the other reads ask every shard (or the partition key's)
and merge the answers in hierarchical key order, or in index order through a
secondary index (`scans.py`, and `arrow.py` for Arrow tables).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator

import pyarrow as pa

from quorumstore.arrow.ipc import read_ipc
from quorumstore.client import arrow
from quorumstore.client.arguments import check_index, check_key, check_range, check_str
from quorumstore.client.batcher import Batcher
from quorumstore.client.core import ClientCore
from quorumstore.client.errors import KeyNotFound
from quorumstore.client.reads import GetOp, IndexMatch
from quorumstore.client.scans import (
    index_sort_key,
    merge_sorted,
    record_sort_key,
    shard_keys,
    shard_records,
    to_records,
)
from quorumstore.client.types import ComparisonType, Record
from quorumstore.client.writes import OP_OVERHEAD_BYTES
from quorumstore.proto import quorumstore_data_pb2 as data_pb
from quorumstore.wire.keys import encode_key, index_order


class ReadApi(ClientCore):
    """`AsyncClient`'s reads."""

    def _read_batcher(self, shard: int) -> Batcher[GetOp]:
        assert self._reader is not None
        return self._shard_batcher(self._read_batchers, self._reader.send, shard)

    def submit_get(
        self,
        key: str,
        partition_key: str | None = None,
        include_value: bool = True,
    ) -> asyncio.Future[Record]:
        """Queues an exact-match get and returns its future; loop thread only."""
        directory = self._ready()
        check_key(key)
        future: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        shard = self._route(directory, key, partition_key)
        op = GetOp(key, ComparisonType.EQUAL, include_value, future)
        self._read_batcher(shard).add(op, len(key) + OP_OVERHEAD_BYTES)
        return future

    async def get(
        self,
        key: str,
        *,
        partition_key: str | None = None,
        comparison: ComparisonType = ComparisonType.EQUAL,
        include_value: bool = True,
        use_index: str | None = None,
    ) -> Record:
        """The record of `key` as (key, value, version); raises KeyNotFound if none.

        comparison: FLOOR, CEILING, LOWER or HIGHER find the nearest key in
          hierarchical order instead (across all shards unless `partition_key` is
          given); the record's key says which one was found.
        include_value: False returns the version only (value None).
        use_index: `key` is a secondary key of this index; the record found through
          it is returned (its own key is the primary key). With several records
          under one secondary key, the one with the lowest primary key.
        """
        if comparison == ComparisonType.EQUAL and use_index is None:
            return await self.submit_get(key, partition_key, include_value)
        directory = self._ready()
        check_str(key, "key")
        check_index(use_index)
        loop = asyncio.get_running_loop()
        futures = []
        for shard in self._shards(directory, partition_key):
            future: asyncio.Future[Record | IndexMatch] = loop.create_future()
            get = GetOp(key, int(comparison), include_value, future, use_index)  # type: ignore[arg-type]
            self._read_batcher(shard).add(get, len(key) + OP_OVERHEAD_BYTES)
            futures.append(future)
        # Each shard's nearest match, ordered as the comparison looks: by key, or
        # through an index by secondary key, then primary key.
        found: dict[bytes, Record] = {}
        for outcome in await asyncio.gather(*futures, return_exceptions=True):
            if isinstance(outcome, IndexMatch):
                found[index_order(outcome.secondary_key, outcome.record.key)] = outcome.record
            elif isinstance(outcome, Record):
                found[encode_key(outcome.key)] = outcome
            elif not isinstance(outcome, KeyNotFound):
                raise outcome
        if not found:
            raise KeyNotFound(key)
        lower = comparison in (ComparisonType.FLOOR, ComparisonType.LOWER)
        return found[max(found) if lower else min(found)]

    async def list(
        self,
        min_key_inclusive: str,
        max_key_exclusive: str,
        *,
        partition_key: str | None = None,
        use_index: str | None = None,
    ) -> builtins.list[str]:
        """The keys in [min, max) in hierarchical order ("" max: no bound).

        use_index: [min, max) is a range of this index's secondary keys; returns the
          primary keys of the records found, in hierarchical order (a record indexed
          under several secondary keys in range is listed once for each).
        """
        directory = self._ready()
        check_range(min_key_inclusive, max_key_exclusive)
        check_index(use_index)
        assert self._caller is not None
        caller = self._caller
        parts = await asyncio.gather(
            *(
                shard_keys(caller, shard, min_key_inclusive, max_key_exclusive, use_index)
                for shard in self._shards(directory, partition_key)
            )
        )
        if len(parts) == 1 and use_index is None:
            return parts[0]
        return sorted((k for part in parts for k in part), key=encode_key)

    async def range_scan(
        self,
        min_key_inclusive: str,
        max_key_exclusive: str,
        *,
        partition_key: str | None = None,
        use_index: str | None = None,
    ) -> AsyncIterator[Record]:
        """The records in [min, max) in hierarchical order, streamed as they arrive.

        `async for key, value, version in client.range_scan("/a/", "/a/~")`.

        use_index: [min, max) is a range of this index's secondary keys; the records
          come in index order (by secondary key, then primary key).
        """
        async for chunk in self.range_scan_chunks(
            min_key_inclusive, max_key_exclusive, partition_key=partition_key, use_index=use_index
        ):
            for record in chunk:
                yield record

    async def range_scan_chunks(
        self,
        min_key_inclusive: str,
        max_key_exclusive: str,
        *,
        partition_key: str | None = None,
        use_index: str | None = None,
    ) -> AsyncIterator[builtins.list[Record]]:
        """`range_scan` in chunks of records (fewer hand-offs for large scans)."""
        directory = self._ready()
        check_range(min_key_inclusive, max_key_exclusive)
        check_index(use_index)
        assert self._caller is not None
        caller = self._caller
        streams = [
            shard_records(caller, shard, min_key_inclusive, max_key_exclusive, use_index)
            for shard in self._shards(directory, partition_key)
        ]
        sort_key = record_sort_key if use_index is None else index_sort_key
        merged = streams[0] if len(streams) == 1 else merge_sorted(streams, sort_key)
        try:
            async for chunk in merged:
                yield to_records(chunk)
        finally:
            await merged.aclose()  # type: ignore[attr-defined]

    async def scan(
        self,
        min_key_inclusive: str,
        max_key_exclusive: str,
        *,
        partition_key: str | None = None,
        use_index: str | None = None,
    ) -> pa.Table:
        """The records in [min, max) as one pyarrow Table, in hierarchical key order.

        Columns: key, value, version_id, modifications_count, created_ms, modified_ms
        (`quorumstore.client.SCAN_SCHEMA`). Each shard's rows come from one snapshot
        of it, as Arrow batches.

        use_index: [min, max) is a range of this index's secondary keys; the table
          has the records found through it, in index order (secondary key, then
          primary key), and a `secondary_key` column after the others
          (`quorumstore.client.INDEX_SCAN_SCHEMA`).
        """
        directory = self._ready()
        check_range(min_key_inclusive, max_key_exclusive)
        check_index(use_index)
        assert self._caller is not None
        caller = self._caller
        stub = caller.channels.data_stub
        request_range = data_pb.KeyRange(
            min_inclusive=min_key_inclusive, max_exclusive=max_key_exclusive
        )

        async def shard_table(shard: int) -> pa.Table:
            request = data_pb.ScanRequest(
                namespace=self.namespace,
                shard=shard,
                ranges=[request_range],
                secondary_index_name=use_index or "",
            )

            async def attempt(leader: str, timeout_s: float) -> pa.Table:
                # No per-attempt timeout: a large scan may take longer than one.
                parts = [read_ipc(c.ipc) async for c in stub(leader).ScanArrow(request)]
                return pa.concat_tables(parts)

            return await caller.call(shard, attempt, "scan")

        tables = await asyncio.gather(
            *(shard_table(s) for s in self._shards(directory, partition_key))
        )
        return arrow.merge_tables(tables, by_index=use_index is not None)
