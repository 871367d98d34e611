"""`AsyncClient`: quorumstore's asyncio client over the Oxia protocol.

    async with AsyncClient("127.0.0.1:6648") as client:
        version = await client.put("/users/7", b"ada")
        key, value, version = await client.get("/users/7")

Every operation goes to its shard's batcher (`batcher.py`): concurrent puts and
deletes of a shard travel as one replicated write, concurrent gets as one `Read`,
with up to `max_inflight_batches` batches of each kind in flight per shard. Writes
are exactly-once by default (`writes.py`): a batch retried after a leader change is
applied once. The shard map follows the cluster (`discovery.py`), and requests are
retried across leader changes until `request_timeout_s` (`calls.py`).
"""

from __future__ import annotations

import asyncio
import builtins
import uuid
import weakref
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Self

import pyarrow as pa

from quorumstore.arrow_ipc import ipc_bytes, read_ipc
from quorumstore.client import arrow
from quorumstore.client.batcher import Batcher, BatchLimits
from quorumstore.client.calls import ShardCaller
from quorumstore.client.discovery import Channels, Directory
from quorumstore.client.errors import (
    ClientClosed,
    InvalidRequest,
    KeyNotFound,
    SessionDoesNotExist,
)
from quorumstore.client.notifications import Subscription
from quorumstore.client.reads import GetOp, IndexMatch, ReadSender
from quorumstore.client.scans import (
    index_sort_key,
    merge_sorted,
    record_sort_key,
    shard_keys,
    shard_records,
    to_records,
)
from quorumstore.client.sequences import SequenceSubscription
from quorumstore.client.sessions import ShardSessions, check_session_timeout
from quorumstore.client.types import (
    EXPECTED_RECORD_DOES_NOT_EXIST,
    ComparisonType,
    PutResult,
    Record,
    Version,
)
from quorumstore.client.writes import (
    DELETE,
    DELETE_RANGE,
    OP_OVERHEAD_BYTES,
    PUT,
    PutOptions,
    WriteOp,
    WriteSender,
)
from quorumstore.proto import quorumstore_data_pb2 as data_pb
from quorumstore.storage.keys import encode_key
from quorumstore.storage.secondary_indexes import index_order

DEFAULT_NAMESPACE = "default"
#: Oxia clients' default session timeout.
DEFAULT_SESSION_TIMEOUT_MS = 30_000
#: Version ids are int64 on the wire.
_MAX_VERSION_ID = 2**63 - 1
#: Sequence-key deltas are uint64 on the wire.
_MAX_DELTA = 2**64 - 1
#: What `secondary_indexes=` takes: index name -> one secondary key or several.
SecondaryIndexes = Mapping[str, str | Iterable[str]]


def _value_bytes(value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a value must be bytes or str, got {type(value).__name__}")


def _check_key(key: str, what: str = "key") -> None:
    _check_str(key, what)
    if not key:
        raise InvalidRequest(f"{what} is empty")


def _check_str(value: str, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")


def _check_range(min_key_inclusive: str, max_key_exclusive: str) -> None:
    _check_str(min_key_inclusive, "min_key_inclusive")
    _check_str(max_key_exclusive, "max_key_exclusive")


def _check_expected_version(expected_version_id: int | None) -> None:
    """Refused when queued: encoding it would fail the whole batch it shares with others."""
    if expected_version_id is None:
        return
    if isinstance(expected_version_id, bool) or not isinstance(expected_version_id, int):
        raise TypeError(
            f"expected_version_id must be an int, got {type(expected_version_id).__name__}"
        )
    if not EXPECTED_RECORD_DOES_NOT_EXIST <= expected_version_id <= _MAX_VERSION_ID:
        raise InvalidRequest(
            f"expected_version_id is {expected_version_id}; it must be a version id "
            f"(0 to {_MAX_VERSION_ID}) or EXPECTED_RECORD_DOES_NOT_EXIST (-1)"
        )


def _check_index(use_index: str | None) -> None:
    if use_index is not None:
        _check_key(use_index, "use_index")


def _index_pairs(secondary_indexes: SecondaryIndexes | None) -> tuple[tuple[str, str], ...]:
    """(index name, secondary key) pairs of a put, checked before it is queued."""
    if not secondary_indexes:
        return ()
    if not isinstance(secondary_indexes, Mapping):
        raise TypeError(
            "secondary_indexes must map index names to secondary keys, got "
            f"{type(secondary_indexes).__name__}"
        )
    pairs = []
    for name, keys in secondary_indexes.items():
        _check_key(name, "a secondary index name")
        for secondary_key in [keys] if isinstance(keys, str) else keys:
            _check_key(secondary_key, f"a secondary key of index {name!r}")
            pairs.append((name, secondary_key))
    return tuple(pairs)


def _sequence_deltas(deltas: Sequence[int]) -> tuple[int, ...]:
    """A sequence-key put's deltas, checked as Oxia checks them."""
    if isinstance(deltas, (str, bytes)) or not isinstance(deltas, Sequence):
        raise TypeError(
            f"sequence_keys_deltas must be a sequence of ints, got {type(deltas).__name__}"
        )
    checked = tuple(deltas)
    if not checked:
        raise InvalidRequest("sequence_keys_deltas is empty; give at least one delta")
    for delta in checked:
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"a sequence key delta must be an int, got {type(delta).__name__}")
        if not 0 <= delta <= _MAX_DELTA:
            raise InvalidRequest(f"a sequence key delta is {delta}; it must be 0 to {_MAX_DELTA}")
    if checked[0] == 0:
        raise InvalidRequest("the first sequence key delta is 0; it must be > 0")
    return checked


class AsyncClient:
    """A quorumstore client for asyncio code.

    Open it with `async with AsyncClient(address) as client` (or `await connect()`
    and `await close()`). `address` is any node's `host:port`, or several (a list,
    or comma-separated): the client learns the other nodes from the cluster.

    Options (docs/client.md has the details):
      namespace: the namespace to use (default "default").
      linger_ms: how long a partial batch of an idle shard waits for more
        operations: until none arrived for this long, at most 4x after its first.
        The default 0 sends it once the event loop has run every ready task; under
        load batches form anyway, behind the partial batch in flight.
      max_batch_ops, max_batch_bytes: a batch is full at either.
      max_inflight_batches: batches of each kind (write, read) in flight per shard;
        of them, one partial batch at a time (full ones use the rest).
      request_timeout_s: how long an operation is retried across leader changes and
        outages before it fails with ServiceUnavailable.
      connect_timeout_s: how long `connect` waits for the first shard map.
      exactly_once: tag write batches with a client id and serial so that a retried
        batch is applied once (default True).
      session_timeout_ms: how long the cluster keeps the client's ephemeral records
        after its last keep-alive (2,000 to 300,000; default 30,000).
      client_identifier: recorded with each ephemeral record (default `client_id`).
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        namespace: str = DEFAULT_NAMESPACE,
        linger_ms: float = 0.0,
        max_batch_ops: int = 1000,
        max_batch_bytes: int = 1 << 20,
        max_inflight_batches: int = 4,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 30.0,
        exactly_once: bool = True,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        client_identifier: str | None = None,
    ) -> None:
        numbers = {
            "max_batch_ops": max_batch_ops,
            "max_batch_bytes": max_batch_bytes,
            "max_inflight_batches": max_inflight_batches,
            "request_timeout_s": request_timeout_s,
            "connect_timeout_s": connect_timeout_s,
        }
        for name, number in numbers.items():
            if number <= 0:
                raise ValueError(f"{name} must be positive, got {number}")
        if linger_ms < 0:
            raise ValueError(f"linger_ms must be >= 0, got {linger_ms}")
        check_session_timeout(session_timeout_ms)
        if client_identifier is not None:
            _check_key(client_identifier, "client_identifier")
        addresses = address.split(",") if isinstance(address, str) else list(address)
        if not addresses:
            raise ValueError("give at least one node address (host:port) to find the cluster by")
        for one in addresses:
            host, _, port = one.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"an address must be host:port, got {one!r}")
        #: The nodes the client was given to find the cluster through.
        self.addresses = [a.strip() for a in addresses]
        self.namespace = namespace
        #: This instance's identity in exactly-once serials (a random UUID).
        self.client_id = uuid.uuid4().hex
        #: Recorded with this client's ephemeral records.
        self.client_identifier = client_identifier or self.client_id
        self._session_timeout_ms = session_timeout_ms
        self._limits = BatchLimits(
            linger_ms / 1000, max_batch_ops, max_batch_bytes, max_inflight_batches
        )
        self._connect_timeout_s = connect_timeout_s
        self._request_timeout_s = request_timeout_s
        self._exactly_once = exactly_once
        self._channels: Channels | None = None
        self._directory: Directory | None = None
        self._writer: WriteSender | None = None
        self._reader: ReadSender | None = None
        self._caller: ShardCaller | None = None
        self._sessions: ShardSessions | None = None
        self._write_batchers: dict[int, Batcher[WriteOp]] = {}
        self._read_batchers: dict[int, Batcher[GetOp]] = {}
        self._subscriptions: weakref.WeakSet[Subscription | SequenceSubscription] = (
            weakref.WeakSet()
        )
        self._closed = False

    # ------------------------------------------------------------ lifecycle

    async def connect(self) -> Self:
        """Fetches the shard map; returns once the client can serve operations."""
        if self._closed:
            raise ClientClosed("this client was closed; open a new one")
        if self._directory is not None:
            return self
        channels = Channels()
        directory = Directory(channels, self.addresses, self.namespace)
        try:
            await directory.start(self._connect_timeout_s)
        except BaseException:
            await channels.close()
            raise
        self._channels, self._directory = channels, directory
        self._caller = ShardCaller(directory, channels, self._request_timeout_s)
        self._writer = WriteSender(self._caller, self.namespace, self.client_id, self._exactly_once)
        self._reader = ReadSender(self._caller)
        self._sessions = ShardSessions(
            self._caller, self._session_timeout_ms, self.client_identifier
        )
        return self

    async def close(self) -> None:
        """Sends what is queued, waits for in-flight batches, closes the sessions
        (deleting this client's ephemeral records), ends notification and sequence
        subscriptions, and closes the connections."""
        if self._closed:
            return
        self._closed = True
        batchers: list[Batcher[WriteOp] | Batcher[GetOp]] = [
            *self._write_batchers.values(),
            *self._read_batchers.values(),
        ]
        await asyncio.gather(*(b.drain() for b in batchers))
        if self._sessions is not None:
            await self._sessions.close()
        await asyncio.gather(*(s.aclose() for s in list(self._subscriptions)))
        if self._writer is not None:
            self._writer.close()
        if self._directory is not None:
            await self._directory.close()
        if self._channels is not None:
            await self._channels.close()

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _ready(self) -> Directory:
        if self._closed:
            raise ClientClosed("this client was closed; open a new one")
        if self._directory is None:
            raise ClientClosed("this client is not connected: use `async with` or await connect()")
        return self._directory

    # ------------------------------------------------------------ batching

    def _write_batcher(self, shard: int) -> Batcher[WriteOp]:
        batcher = self._write_batchers.get(shard)
        if batcher is None:
            assert self._writer is not None
            send = self._writer.send
            batcher = Batcher(lambda ops, lane: send(shard, ops, lane), self._limits)
            self._write_batchers[shard] = batcher
        return batcher

    def _read_batcher(self, shard: int) -> Batcher[GetOp]:
        batcher = self._read_batchers.get(shard)
        if batcher is None:
            assert self._reader is not None
            send = self._reader.send
            batcher = Batcher(lambda ops, lane: send(shard, ops, lane), self._limits)
            self._read_batchers[shard] = batcher
        return batcher

    def submit_put(
        self,
        key: str,
        value: bytes | str,
        expected_version_id: int | None = None,
        partition_key: str | None = None,
    ) -> asyncio.Future[Version]:
        """Queues a put and returns its future (what `put` awaits); loop thread only."""
        directory = self._ready()
        _check_key(key)
        _check_expected_version(expected_version_id)
        data = _value_bytes(value)
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

    def submit_get(
        self,
        key: str,
        partition_key: str | None = None,
        include_value: bool = True,
    ) -> asyncio.Future[Record]:
        """Queues an exact-match get and returns its future; loop thread only."""
        directory = self._ready()
        _check_key(key)
        future: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        shard = self._route(directory, key, partition_key)
        op = GetOp(key, ComparisonType.EQUAL, include_value, future)
        self._read_batcher(shard).add(op, len(key) + OP_OVERHEAD_BYTES)
        return future

    # ------------------------------------------------------------ writes

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
        _check_str(partition_key, "partition_key")
        deltas = _sequence_deltas(sequence_keys_deltas)
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
        _check_key(key)
        _check_expected_version(expected_version_id)
        data = _value_bytes(value)
        pairs = _index_pairs(secondary_indexes)
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
        _check_key(key)
        _check_expected_version(expected_version_id)
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
        _check_range(min_key_inclusive, max_key_exclusive)
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

    # ------------------------------------------------------------ reads

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
        _check_str(key, "key")
        _check_index(use_index)
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
        _check_range(min_key_inclusive, max_key_exclusive)
        _check_index(use_index)
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
        _check_range(min_key_inclusive, max_key_exclusive)
        _check_index(use_index)
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
        _check_range(min_key_inclusive, max_key_exclusive)
        _check_index(use_index)
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

    # ------------------------------------------------------------ notifications

    def notifications(
        self,
        shard: int | None = None,
        *,
        start_offset_exclusive: int | Mapping[int, int] | None = None,
    ) -> Subscription:
        """Follows the changes of one shard, or of all shards.

        `async with client.notifications() as changes: async for n in changes: ...`
        (entering waits until every shard's stream has started, so every change
        committed after it is delivered).

        start_offset_exclusive: resume after this offset (an int, with `shard`), or
          after these offsets per shard (a mapping, e.g. an earlier subscription's
          `offsets`); shards without one start at their current end.
        """
        directory = self._ready()
        assert self._caller is not None
        if isinstance(start_offset_exclusive, int):
            if shard is None:
                raise ValueError(
                    "an int start_offset_exclusive needs a shard: offsets are per shard "
                    "(pass a mapping of shard to offset to resume several shards)"
                )
            start_offset_exclusive = {shard: start_offset_exclusive}
        shards = directory.map.shards if shard is None else [shard]
        subscription = Subscription(self._caller, shards, start_offset_exclusive or {})
        self._subscriptions.add(subscription)
        return subscription

    def sequence_updates(self, prefix_key: str, *, partition_key: str) -> SequenceSubscription:
        """Follows the sequence at `prefix_key`: yields its highest key each time a
        `put_sequence` extends it (the current one first, if the sequence has keys).

        `async with client.sequence_updates("/q", partition_key="q") as keys:
        async for key in keys: ...`. A reader that falls behind gets the newest key.
        """
        directory = self._ready()
        _check_key(prefix_key, "prefix_key")
        assert self._caller is not None
        shard = self._route(directory, prefix_key, partition_key)
        subscription = SequenceSubscription(self._caller, shard, prefix_key)
        self._subscriptions.add(subscription)
        return subscription

    # ------------------------------------------------------------ helpers

    def shard_for(self, key: str) -> int:
        """The shard a key (or partition key) routes to under the current map."""
        return self._ready().map.shard_for(key)

    @staticmethod
    def _route(directory: Directory, key: str, partition_key: str | None) -> int:
        """The shard of one key's operation."""
        if partition_key is not None:
            _check_str(partition_key, "partition_key")
        return directory.map.shard_for(partition_key or key)

    @staticmethod
    def _shards(directory: Directory, partition_key: str | None) -> builtins.list[int]:
        shards = directory.map
        if partition_key is None:
            return shards.shards
        _check_str(partition_key, "partition_key")
        return [shards.shard_for(partition_key)]
