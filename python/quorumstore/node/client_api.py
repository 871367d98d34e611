"""The Oxia client protocol (`io.streamnative.oxia.proto.OxiaClient`) served over a node's shards.

The servicer is a thin translation layer: it validates a whole request, turns one
`WriteRequest` into one write batch (one WAL entry) for the shard's leader, and maps
the state machine's per-op results and records back into Oxia's messages. Where the
Oxia semantics live (versions, conditional ops, hierarchical order) is the storage
layer; what lives here is routing, limits and Oxia's error behaviour.

Error statuses follow Oxia's server (oxia-db/oxia `common/constant`), because that is
what the official clients react to:

- a shard this node does not lead: Oxia's code 106 (`CodeNodeIsNotLeader`), which the
  Go client's `isRetriable` treats as "refresh assignments and retry on the new leader";
  the message names the shard, and a known leader is added to the message and to the
  `leader-hint` trailing metadata entry;
- an unknown namespace in `GetShardAssignments`: Oxia's code 110
  (`CodeNamespaceNotFound`), with the namespaces that do exist in the message;
- malformed requests (empty or oversized keys, oversized values, inverted ranges,
  unknown shards, features not implemented yet): INVALID_ARGUMENT, before anything
  of the request is written;
- sessions, notifications and sequence updates: UNIMPLEMENTED (not there yet).

Codes 106 and 110 are outside gRPC's 0-16. grpc.aio takes a status code as
`code.value[0]`, exactly as for `grpc.StatusCode` members, and puts the number on the
wire unchanged: Go and Java clients see 106/110, while C-core based clients (Python's
grpcio, hence the `oxia` package) can only report them as UNKNOWN, with our message.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import NoReturn, Protocol, TypeVar

import grpc

from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc, replication_pb2
from quorumstore.protocol.replica import NotLeaderError
from quorumstore.storage.keys import compare_keys
from quorumstore.storage.state_machine import (
    EntryResult,
    KeyComparison,
    OpResult,
    Record,
    ShardReader,
    Status,
)
from quorumstore.storage.write_batch import VERSION_ID_NOT_EXISTS, WriteBatchBuilder

#: Namespace of a `ShardAssignmentsRequest` that names none (as in Oxia).
DEFAULT_NAMESPACE = "default"
#: Trailing metadata key carrying the current leader's address on a not-leader error.
LEADER_HINT_METADATA_KEY = "leader-hint"

#: Largest key, in UTF-8 bytes. Keys are stored escaped and segment-encoded, and every
#: record and range bound carries one, so they are kept far below values.
DEFAULT_MAX_KEY_BYTES = 64 * 1024
#: Largest value. The gRPC server must accept messages at least this large (plus the
#: key and framing): set `grpc.max_receive_message_length` accordingly.
DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024
#: A streamed response (Read, List, RangeScan) is cut after this many items ...
DEFAULT_MAX_RESPONSE_ITEMS = 1000
#: ... or once its keys and values add up to this many bytes, whichever comes first.
DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
#: Writes of one WriteStream that may be replicating at once before reading pauses.
DEFAULT_MAX_INFLIGHT_STREAM_WRITES = 256

_T = TypeVar("_T")

_STATUS = {
    Status.OK: pb.OK,
    Status.KEY_NOT_FOUND: pb.KEY_NOT_FOUND,
    Status.UNEXPECTED_VERSION_ID: pb.UNEXPECTED_VERSION_ID,
    Status.SESSION_DOES_NOT_EXIST: pb.SESSION_DOES_NOT_EXIST,
}
_COMPARISONS = {int(c) for c in KeyComparison}


class ShardDirectory(Protocol):
    """What a node tells its client API: hosted shards and the routing table."""

    def shard_host(self, namespace: str, shard: int) -> ShardHostApi | None:
        """The replica of the shard on this node; None when it is not hosted here."""
        ...

    def assignments(self) -> replication_pb2.ShardAssignmentsUpdate:
        """The latest routing table pushed by the coordinator."""
        ...

    async def assignments_changed(self, version: int) -> None:
        """Returns once a table newer than `version` is present."""
        ...

    def now_ms(self) -> int:
        """Wall clock for write timestamps: the leader's clock goes into the entry."""
        ...


class ShardHostApi(Protocol):
    """One shard replica hosted by this node, as the client API needs it."""

    def is_leader(self) -> bool: ...

    def leader_hint(self) -> str | None:
        """Address of the current leader, if known."""
        ...

    async def write(self, payload: bytes) -> EntryResult:
        """Replicate one write batch; resolves once it is committed and applied.

        Entries are appended in call order: write() takes its log position before its
        first suspension, so the writes of one WriteStream, started in request order,
        are applied in request order. Raises NotLeaderError when not the leader.
        """
        ...

    def reader(self) -> ShardReader:
        """The committed state (the leader's applied KV)."""
        ...


class OxiaCode(enum.Enum):
    """Oxia's own gRPC status codes that quorumstore sends (see the module docstring)."""

    NODE_IS_NOT_LEADER = (106, "node is not leader")
    NAMESPACE_NOT_FOUND = (110, "namespace not found")


class RequestError(Exception):
    """A refused request, with the gRPC status it is refused with.

    Raised by the validation and routing helpers, which know nothing of the RPC,
    and turned into the RPC's status by `abort`.
    """

    def __init__(
        self,
        code: grpc.StatusCode | OxiaCode,
        message: str,
        trailing_metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailing_metadata = trailing_metadata

    async def abort(self, context: grpc.aio.ServicerContext) -> NoReturn:
        await context.abort(self.code, self.message, self.trailing_metadata)  # type: ignore[arg-type]
        raise AssertionError("context.abort returned")  # abort always raises


def _invalid(message: str) -> RequestError:
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _not_supported(what: str) -> RequestError:
    return _invalid(f"{what} not supported by quorumstore yet")


def _not_leader(shard: int, leader_hint: str | None) -> RequestError:
    message = f"node is not leader for shard {shard}"
    if not leader_hint:
        return RequestError(OxiaCode.NODE_IS_NOT_LEADER, message)
    return RequestError(
        OxiaCode.NODE_IS_NOT_LEADER,
        f"{message}; leader hint: {leader_hint}",
        ((LEADER_HINT_METADATA_KEY, leader_hint),),
    )


def _chunks(
    items: Iterable[_T], size_of: Callable[[_T], int], max_items: int, max_bytes: int
) -> Iterator[list[_T]]:
    """`items` cut into lists of at most `max_items` and about `max_bytes` each."""
    chunk: list[_T] = []
    size = 0
    for item in items:
        chunk.append(item)
        size += size_of(item)
        if len(chunk) >= max_items or size >= max_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _version(record: Record) -> pb.Version:
    return pb.Version(
        version_id=record.version_id,
        modifications_count=record.modifications_count,
        created_timestamp=record.created_ms,
        modified_timestamp=record.modified_ms,
        session_id=record.session_id,
        client_identity=record.client_identity,
    )


def _put_response(result: OpResult) -> pb.PutResponse:
    if result.version is None:
        return pb.PutResponse(status=_STATUS[result.status])
    return pb.PutResponse(status=_STATUS[result.status], version=_version(result.version))


def _write_response(request: pb.WriteRequest, result: EntryResult) -> pb.WriteResponse:
    """Per-op results, which come in batch order (puts, deletes, delete ranges)."""
    results = result.results
    n_puts, n_deletes = len(request.puts), len(request.deletes)
    expected = n_puts + n_deletes + len(request.delete_ranges)
    if len(results) != expected:
        raise RuntimeError(
            f"entry {result.offset} returned {len(results)} results for {expected} operations"
        )
    return pb.WriteResponse(
        puts=[_put_response(r) for r in results[:n_puts]],
        deletes=[
            pb.DeleteResponse(status=_STATUS[r.status])
            for r in results[n_puts : n_puts + n_deletes]
        ],
        delete_ranges=[
            pb.DeleteRangeResponse(status=_STATUS[r.status]) for r in results[n_puts + n_deletes :]
        ],
    )


def _record_response(
    key: str, record: Record, include_value: bool, with_key: bool
) -> pb.GetResponse:
    response = pb.GetResponse(status=pb.OK, version=_version(record))
    if include_value:
        response.value = record.value
    if with_key:
        response.key = key
    return response


def _get_response(reader: ShardReader, get: pb.GetRequest) -> pb.GetResponse:
    """One get; like Oxia, a non-EQUAL match names the key it found."""
    found = reader.get_with_comparison(get.key, KeyComparison(get.comparison_type))
    if found is None:
        return pb.GetResponse(status=pb.KEY_NOT_FOUND)
    key, record = found
    return _record_response(key, record, get.include_value, get.comparison_type != pb.EQUAL)


def _client_assignments(
    table: replication_pb2.ShardAssignmentsUpdate, namespace: str
) -> pb.ShardAssignments:
    """Oxia's view of one namespace of our routing table.

    A shard without a leader yet is kept, with an empty leader, as Oxia's coordinator
    does: leaving it out would make clients that scan every shard (list, range scan,
    delete range) silently skip its keys, while an empty address fails loudly.
    """
    for entry in table.namespaces:
        if entry.namespace == namespace:
            shards = [
                pb.ShardAssignment(
                    shard=s.shard,
                    leader=s.leader,
                    int32_hash_range=pb.Int32HashRange(
                        min_hash_inclusive=s.hash_range.min_hash_inclusive,
                        max_hash_inclusive=s.hash_range.max_hash_inclusive,
                    ),
                )
                for s in entry.shards
            ]
            return pb.ShardAssignments(
                namespaces={
                    namespace: pb.NamespaceShardsAssignment(
                        assignments=shards, shard_key_router=pb.XXHASH3
                    )
                }
            )
    known = sorted(entry.namespace for entry in table.namespaces)
    raise RequestError(
        OxiaCode.NAMESPACE_NOT_FOUND,
        f"oxia: namespace not found: {namespace!r} (this cluster has {known})",
    )


def _shard_index(table: replication_pb2.ShardAssignmentsUpdate) -> dict[int, tuple[str, str]]:
    """shard id -> (namespace, leader address) of every shard in the table."""
    return {
        s.shard: (entry.namespace, s.leader) for entry in table.namespaces for s in entry.shards
    }


class OxiaClientServicer(oxia_client_pb2_grpc.OxiaClientServicer):
    """Serves the Oxia client protocol for the shards of one node.

    Requests name their shard (clients route by key hash themselves); the servicer
    never re-routes. Only the shard's leader serves reads and writes.
    """

    def __init__(
        self,
        directory: ShardDirectory,
        *,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_response_items: int = DEFAULT_MAX_RESPONSE_ITEMS,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_inflight_stream_writes: int = DEFAULT_MAX_INFLIGHT_STREAM_WRITES,
    ) -> None:
        limits = {
            "max_key_bytes": max_key_bytes,
            "max_value_bytes": max_value_bytes,
            "max_response_items": max_response_items,
            "max_response_bytes": max_response_bytes,
            "max_inflight_stream_writes": max_inflight_stream_writes,
        }
        for name, value in limits.items():
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self._directory = directory
        self._max_key_bytes = max_key_bytes
        self._max_value_bytes = max_value_bytes
        self._max_response_items = max_response_items
        self._max_response_bytes = max_response_bytes
        self._max_inflight_stream_writes = max_inflight_stream_writes
        # The shard index of the last table seen, rebuilt when the table object changes.
        self._indexed_table: replication_pb2.ShardAssignmentsUpdate | None = None
        self._index: dict[int, tuple[str, str]] = {}

    # ------------------------------------------------------------ routing

    async def GetShardAssignments(
        self, request: pb.ShardAssignmentsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ShardAssignments]:
        """The namespace's full map now, and again whenever it changes.

        A node that has no table yet holds the stream open until the first one. A new
        table that leaves this namespace's map as it was is not sent, because every
        message costs the official Python client (0.2.1) dearly: its reader thread waits
        on its start-up barrier after each map, so it applies the second map, then blocks
        for good (later maps are never read, and `Client.close()` hangs joining it).
        """
        namespace = request.namespace or DEFAULT_NAMESPACE
        last_sent: pb.ShardAssignments | None = None
        try:
            while True:
                table = self._directory.assignments()
                if table.namespaces:
                    message = _client_assignments(table, namespace)
                    if message != last_sent:
                        yield message
                        last_sent = message
                await self._directory.assignments_changed(table.version)
        except RequestError as e:
            await e.abort(context)

    def _leader_host(self, request_shard: int | None) -> ShardHostApi:
        """The leader replica of the named shard on this node, or the error to return."""
        if request_shard is None:
            raise _invalid("the request names no shard; quorumstore does not route by key")
        table = self._directory.assignments()
        if table is not self._indexed_table:
            self._index = _shard_index(table)
            self._indexed_table = table
        located = self._index.get(request_shard)
        if located is None:
            raise _invalid(f"unknown shard {request_shard}: it is in no namespace of this cluster")
        namespace, table_leader = located
        host = self._directory.shard_host(namespace, request_shard)
        if host is None:
            raise _not_leader(request_shard, table_leader or None)
        if not host.is_leader():
            raise _not_leader(request_shard, host.leader_hint())
        return host

    # ---------------------------------------------------------- validation

    def _check_key(self, key: str, field: str, *, allow_empty: bool = False) -> None:
        if not key and not allow_empty:
            raise _invalid(f"{field} is empty")
        size = len(key.encode())
        if size > self._max_key_bytes:
            raise _invalid(
                f"{field} is {size} bytes, above the limit of {self._max_key_bytes} bytes"
            )

    @staticmethod
    def _check_expected_version(request: pb.PutRequest | pb.DeleteRequest, field: str) -> None:
        if (
            request.HasField("expected_version_id")
            and request.expected_version_id < VERSION_ID_NOT_EXISTS
        ):
            raise _invalid(
                f"{field}.expected_version_id is {request.expected_version_id}; it must be a "
                f"version id (>= 0) or {VERSION_ID_NOT_EXISTS} (the record must not exist)"
            )

    def _check_range(self, start: str, end: str, field: str) -> None:
        """A [start, end) key range; an empty end means unbounded."""
        self._check_key(start, f"{field}.start_inclusive", allow_empty=True)
        self._check_key(end, f"{field}.end_exclusive", allow_empty=True)
        if end and compare_keys(start, end) > 0:
            raise _invalid(
                f"{field}: start_inclusive {start!r} sorts after end_exclusive {end!r} "
                "in hierarchical key order"
            )

    def _check_put(self, put: pb.PutRequest, field: str) -> None:
        self._check_key(put.key, f"{field}.key")
        if len(put.value) > self._max_value_bytes:
            raise _invalid(
                f"{field}.value is {len(put.value)} bytes, above the limit of "
                f"{self._max_value_bytes} bytes"
            )
        if put.HasField("session_id"):
            raise _not_supported(f"{field}: ephemeral records (session_id) are")
        if put.sequence_key_delta:
            raise _not_supported(f"{field}: sequence keys (sequence_key_delta) are")
        if put.secondary_indexes:
            raise _not_supported(f"{field}: secondary indexes are")
        self._check_expected_version(put, field)

    def _check_write(self, request: pb.WriteRequest) -> None:
        """The whole request, so that a bad op anywhere writes nothing."""
        for i, put in enumerate(request.puts):
            self._check_put(put, f"puts[{i}]")
        for i, delete in enumerate(request.deletes):
            self._check_key(delete.key, f"deletes[{i}].key")
            self._check_expected_version(delete, f"deletes[{i}]")
        for i, delete_range in enumerate(request.delete_ranges):
            self._check_range(
                delete_range.start_inclusive, delete_range.end_exclusive, f"delete_ranges[{i}]"
            )

    def _check_gets(self, gets: Sequence[pb.GetRequest]) -> None:
        for i, get in enumerate(gets):
            field = f"gets[{i}]"
            if get.comparison_type not in _COMPARISONS:
                raise _invalid(f"{field}.comparison_type {get.comparison_type} is unknown")
            # A bound for FLOOR/CEILING/LOWER/HIGHER may be empty ("" sorts first).
            self._check_key(get.key, f"{field}.key", allow_empty=get.comparison_type != pb.EQUAL)
            if get.HasField("secondary_index_name"):
                raise _not_supported(f"{field}: secondary index lookups are")

    def _check_scan(self, request: pb.ListRequest | pb.RangeScanRequest) -> None:
        self._check_range(request.start_inclusive, request.end_exclusive, "request")
        if request.HasField("secondary_index_name"):
            raise _not_supported("secondary index scans are")

    # -------------------------------------------------------------- writes

    def _build_batch(self, request: pb.WriteRequest) -> bytes:
        """One write batch: the puts, then the deletes, then the delete ranges."""
        batch = WriteBatchBuilder()
        for put in request.puts:
            batch.add_put(
                put.key,
                put.value,
                expected_version_id=put.expected_version_id
                if put.HasField("expected_version_id")
                else None,
                client_identity=put.client_identity if put.HasField("client_identity") else None,
                partition_key=put.partition_key if put.HasField("partition_key") else None,
            )
        for delete in request.deletes:
            batch.add_delete(
                delete.key,
                delete.expected_version_id if delete.HasField("expected_version_id") else None,
            )
        for delete_range in request.delete_ranges:
            batch.add_delete_range(delete_range.start_inclusive, delete_range.end_exclusive)
        return batch.build(self._directory.now_ms())

    async def _write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        shard = request.shard if request.HasField("shard") else None
        host = self._leader_host(shard)
        self._check_write(request)
        if not (request.puts or request.deletes or request.delete_ranges):
            return pb.WriteResponse()
        payload = self._build_batch(request)
        try:
            result = await host.write(payload)
        except NotLeaderError as e:
            raise _not_leader(request.shard, e.leader_hint) from e
        return _write_response(request, result)

    async def Write(
        self, request: pb.WriteRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteResponse:
        try:
            return await self._write(request)
        except RequestError as e:
            await e.abort(context)

    async def WriteStream(
        self, request_iterator: AsyncIterator[pb.WriteRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WriteResponse]:
        """Each request is one write, started as soon as it arrives; answers keep order.

        A refused request ends the stream with its status once the answers before it
        are sent; writes after it that had already started are abandoned, not undone
        (as when a connection drops).
        """
        pending: asyncio.Queue[asyncio.Future[pb.WriteResponse] | None] = asyncio.Queue()
        inflight = asyncio.Semaphore(self._max_inflight_stream_writes)

        async def start_writes() -> None:
            try:
                async for request in request_iterator:
                    await inflight.acquire()
                    pending.put_nowait(asyncio.ensure_future(self._write(request)))
            finally:
                pending.put_nowait(None)

        starter = asyncio.create_task(start_writes())
        try:
            while (write := await pending.get()) is not None:
                response = await write
                inflight.release()
                yield response
            await starter  # surfaces a failure to read the request stream
        except RequestError as e:
            await e.abort(context)
        finally:
            starter.cancel()
            while not pending.empty():
                _abandon(pending.get_nowait())

    # --------------------------------------------------------------- reads

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadResponse]:
        try:
            host = self._leader_host(request.shard if request.HasField("shard") else None)
            self._check_gets(request.gets)
        except RequestError as e:
            await e.abort(context)
        reader = host.reader()
        responses = (_get_response(reader, get) for get in request.gets)
        for chunk in _chunks(
            responses, lambda r: len(r.value), self._max_response_items, self._max_response_bytes
        ):
            yield pb.ReadResponse(gets=chunk)

    def _scan_reader(self, request: pb.ListRequest | pb.RangeScanRequest) -> ShardReader:
        host = self._leader_host(request.shard if request.HasField("shard") else None)
        self._check_scan(request)
        return host.reader()

    async def List(
        self, request: pb.ListRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListResponse]:
        """Keys in [start, end) in hierarchical order; an empty end means unbounded."""
        try:
            reader = self._scan_reader(request)
        except RequestError as e:
            await e.abort(context)
        keys = reader.list_keys(request.start_inclusive, request.end_exclusive)
        for chunk in _chunks(keys, len, self._max_response_items, self._max_response_bytes):
            yield pb.ListResponse(keys=chunk)

    async def RangeScan(
        self, request: pb.RangeScanRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RangeScanResponse]:
        """Records in [start, end) in hierarchical order; an empty end means unbounded."""
        try:
            reader = self._scan_reader(request)
        except RequestError as e:
            await e.abort(context)
        records = reader.range_scan(request.start_inclusive, request.end_exclusive)
        for chunk in _chunks(
            records,
            lambda item: len(item[0]) + len(item[1].value),
            self._max_response_items,
            self._max_response_bytes,
        ):
            yield pb.RangeScanResponse(
                records=[
                    _record_response(k, r, include_value=True, with_key=True) for k, r in chunk
                ]
            )

    # ----------------------------------------------------- not implemented

    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> NoReturn:
        await _unimplemented(context, "sessions (ephemeral records) are")

    async def KeepAlive(
        self, request: pb.SessionHeartbeat, context: grpc.aio.ServicerContext
    ) -> NoReturn:
        await _unimplemented(context, "sessions (ephemeral records) are")

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> NoReturn:
        await _unimplemented(context, "sessions (ephemeral records) are")

    async def GetNotifications(
        self, request: pb.NotificationsRequest, context: grpc.aio.ServicerContext
    ) -> NoReturn:
        await _unimplemented(context, "notifications are")

    async def GetSequenceUpdates(
        self, request: pb.GetSequenceUpdatesRequest, context: grpc.aio.ServicerContext
    ) -> NoReturn:
        await _unimplemented(context, "sequence keys are")


def _abandon(write: asyncio.Future[pb.WriteResponse] | None) -> None:
    """Drop a write nobody will answer: cancel it, or consume its outcome if it is done."""
    if write is None:
        return
    if not write.done():
        write.cancel()
    elif not write.cancelled():
        write.exception()  # consumed, so asyncio does not log it as never retrieved


async def _unimplemented(context: grpc.aio.ServicerContext, what: str) -> NoReturn:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{what} not supported by quorumstore yet")
    raise AssertionError("context.abort returned")
