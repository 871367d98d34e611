"""The write operations of `AsyncClient`: put, put_sequence, delete, delete_range
and put_many.

Puts and deletes of a shard queue on its write batcher (`batcher.py`) and travel as
one replicated write, exactly-once by default (`writes.py`); `put_many` queues
whole Arrow batches on the same lanes (`arrow.py`). Ephemeral puts take the
client's session on their shard (`sessions.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pyarrow as pa

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.client import arrow
from quorumstore.client.arguments import (
    SecondaryIndexes,
    check_expected_version,
    check_key,
    check_range,
    check_str,
    index_pairs,
    sequence_deltas,
    value_bytes,
)
from quorumstore.client.batcher import Batcher
from quorumstore.client.core import ClientCore
from quorumstore.client.errors import SessionDoesNotExist
from quorumstore.client.types import PutResult, Version
from quorumstore.client.writes import (
    DELETE,
    DELETE_RANGE,
    OP_OVERHEAD_BYTES,
    PUT,
    PutOptions,
    WriteOp,
)


class WriteApi(ClientCore):
    """`AsyncClient`'s writes."""

    def _write_batcher(self, shard: int) -> Batcher[WriteOp]:
        assert self._writer is not None
        return self._shard_batcher(self._write_batchers, self._writer.send, shard)

    def submit_put(
        self,
        key: str,
        value: bytes | str,
        expected_version_id: int | None = None,
        partition_key: str | None = None,
    ) -> asyncio.Future[Version]:
        """Queues a put and returns its future (what `put` awaits); loop thread only."""
        directory = self._ready()
        check_key(key)
        check_expected_version(expected_version_id)
        data = value_bytes(value)
        shard = self._route(directory, key, partition_key)
        return self._queue_put(shard, key, data, expected_version_id, partition_key, None)  # type: ignore[return-value]

    def _queue_put(
        self,
        shard: int,
        key: str,
        data: bytes,
        expected_version_id: int | None,
        partition_key: str | None,
        options: PutOptions | None,
    ) -> asyncio.Future[Version | PutResult]:
        future: asyncio.Future[Version | PutResult] = asyncio.get_running_loop().create_future()
        op = WriteOp(PUT, key, data, expected_version_id, partition_key, future, options)  # type: ignore[arg-type]
        size = len(key) + len(data) + OP_OVERHEAD_BYTES
        if options is not None:
            size += sum(len(name) + len(sk) for name, sk in options.secondary_indexes)
        self._write_batcher(shard).add(op, size)
        return future

    async def put(
        self,
        key: str,
        value: bytes | str,
        *,
        expected_version_id: int | None = None,
        partition_key: str | None = None,
        ephemeral: bool = False,
        secondary_indexes: SecondaryIndexes | None = None,
    ) -> Version:
        """Stores `value` under `key`; returns the record's new version.

        expected_version_id: write only if the record's current version id is this
          (EXPECTED_RECORD_DOES_NOT_EXIST: only if there is no record); otherwise
          raises UnexpectedVersionId.
        partition_key: route by this instead of the key, keeping the records that
          share it on one shard (it is stored with the record).
        ephemeral: the record lives only as long as this client's session on its
          shard: it is deleted when the client closes, or `session_timeout_ms`
          after the client stopped reaching the cluster.
        secondary_indexes: index name -> secondary key (or several), to find the
          record by with `get`, `list` and `range_scan`'s `use_index`. A put replaces
          the record's earlier index entries.
        """
        if not ephemeral and not secondary_indexes:
            return await self.submit_put(key, value, expected_version_id, partition_key)
        result = await self._put_with_options(
            key, value, expected_version_id, partition_key, ephemeral, secondary_indexes, ()
        )
        assert isinstance(result, Version)
        return result

    async def put_sequence(
        self,
        prefix_key: str,
        value: bytes | str,
        *,
        partition_key: str,
        sequence_keys_deltas: Sequence[int] = (1,),
        ephemeral: bool = False,
        secondary_indexes: SecondaryIndexes | None = None,
    ) -> PutResult:
        """Stores `value` under a new key of the sequence at `prefix_key`; returns the
        key the server assigned and the record's version.

        The key is `prefix_key` followed by one `-` and a 20-digit number per delta:
        each number is the sequence's last one plus its delta, so keys grow
        monotonically. A sequence lives on one shard, hence the `partition_key`.
        The first delta must be > 0. `ephemeral` and `secondary_indexes` as for `put`.
        """
        check_str(partition_key, "partition_key")
        deltas = sequence_deltas(sequence_keys_deltas)
        result = await self._put_with_options(
            prefix_key, value, None, partition_key, ephemeral, secondary_indexes, deltas
        )
        assert isinstance(result, PutResult)
        return result

    async def _put_with_options(
        self,
        key: str,
        value: bytes | str,
        expected_version_id: int | None,
        partition_key: str | None,
        ephemeral: bool,
        secondary_indexes: SecondaryIndexes | None,
        deltas: tuple[int, ...],
    ) -> Version | PutResult:
        """A put with PutOptions; an ephemeral one whose session was found expired
        (nothing was written) is put again once, under a new session."""
        directory = self._ready()
        check_key(key)
        check_expected_version(expected_version_id)
        data = value_bytes(value)
        pairs = index_pairs(secondary_indexes)
        shard = self._route(directory, key, partition_key)
        assert self._sessions is not None
        sessions = self._sessions
        for attempt in range(2):
            session_id = await sessions.session_id(shard) if ephemeral else None
            self._ready()
            identity = self.client_identifier if ephemeral else None
            options = PutOptions(session_id, identity, deltas, pairs)
            try:
                return await self._queue_put(
                    shard, key, data, expected_version_id, partition_key, options
                )
            except SessionDoesNotExist:
                if session_id is None or attempt == 1:
                    raise
                sessions.lost(shard, session_id)
        raise AssertionError("unreachable: the loop returns or raises")

    async def delete(
        self,
        key: str,
        *,
        expected_version_id: int | None = None,
        partition_key: str | None = None,
    ) -> bool:
        """Deletes the record; True if it existed, False if there was none.

        With `expected_version_id`, deletes only that version (else UnexpectedVersionId).
        """
        directory = self._ready()
        check_key(key)
        check_expected_version(expected_version_id)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        shard = self._route(directory, key, partition_key)
        op = WriteOp(DELETE, key, None, expected_version_id, None, future)  # type: ignore[arg-type]
        self._write_batcher(shard).add(op, len(key) + OP_OVERHEAD_BYTES)
        return await future

    async def delete_range(
        self,
        min_key_inclusive: str,
        max_key_exclusive: str,
        *,
        partition_key: str | None = None,
    ) -> None:
        """Deletes every record in [min, max) in hierarchical order ("" max: no bound).

        Runs on every shard, or only on the partition key's shard when one is given.
        """
        directory = self._ready()
        check_range(min_key_inclusive, max_key_exclusive)
        loop = asyncio.get_running_loop()
        futures = []
        for shard in self._shards(directory, partition_key):
            future: asyncio.Future[None] = loop.create_future()
            op = WriteOp(DELETE_RANGE, min_key_inclusive, max_key_exclusive, None, None, future)  # type: ignore[arg-type]
            size = len(min_key_inclusive) + len(max_key_exclusive) + OP_OVERHEAD_BYTES
            self._write_batcher(shard).add(op, size)
            futures.append(future)
        await asyncio.gather(*futures)

    async def put_many(self, data: arrow.PutManyData) -> int:
        """Stores many records at once, moving Arrow batches; returns how many.

        `data`: a pyarrow Table or RecordBatch with `key` (string) and `value`
        (binary) columns, a mapping of key to value, or a (keys, values) pair. Each
        shard's rows travel as Arrow IPC, up to 65,536 rows (about 8 MiB) per
        replicated write, exactly-once. Unconditional puts only; the records get no
        partition key.

        Each replicated write is atomic, not the whole call: when one raises (e.g.
        InvalidRequest for an oversized key), the others may have been stored. The
        puts are unconditional, so a second call with the input fixed is safe.
        """
        directory = self._ready()
        keys, values = arrow.columns(data)
        futures = [
            self._queue_bulk_write(shard, batch)
            for shard, rows in arrow.split_by_shard(keys, values, directory.map).items()
            for batch in arrow.row_batches(rows)
        ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return len(keys)

    def _queue_bulk_write(self, shard: int, rows: pa.RecordBatch) -> asyncio.Future[None]:
        """Queues one WriteArrow on the shard's write lanes; its future says how it went."""
        assert self._writer is not None
        writer = self._writer
        payload = ipc_bytes(rows)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def job(lane: int) -> None:
            try:
                await writer.write_arrow(shard, payload, lane)
            except Exception as e:  # noqa: BLE001 - reported through the future
                future.set_exception(e)
            else:
                future.set_result(None)

        self._write_batcher(shard).add_job(job)
        return future
