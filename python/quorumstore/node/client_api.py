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
- `KeepAlive` or `CloseSession` of a session the shard does not have: Oxia's code 108
  (`CodeSessionNotFound`); a session timeout outside [2 s, 5 min]: Oxia's code 109
  (`CodeInvalidSessionTimeout`); a put naming such a session: the put's status
  SESSION_DOES_NOT_EXIST, as in Oxia;
- malformed requests (empty or oversized keys, oversized values, inverted ranges,
  unknown shards, malformed sequence-key puts, bad exactly-once metadata):
  INVALID_ARGUMENT, before anything of the request is written;
- notifications asked from an offset whose changes are past their retention:
  OUT_OF_RANGE (Oxia would silently skip them).

Codes 106 to 110 are outside gRPC's 0-16. grpc.aio takes a status code as
`code.value[0]`, exactly as for `grpc.StatusCode` members, and puts the number on the
wire unchanged: Go and Java clients see 106-110, while C-core based clients (Python's
grpcio, hence the `oxia` package) can only report them as UNKNOWN, with our message.

Beyond Oxia: exactly-once writes (seed 003). A unary `Write` may carry the invocation
metadata `qs-client-id` and `qs-serial`; the write batch then carries that
`ClientSerial`, and a retry of the same serial (after a leader failover, say) is not
applied again but answered with the original results. Calls from clients that cannot
follow a changing shard map are served in gateway mode (`forwarding.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import aclosing
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
import pyarrow as pa

from quorumstore.event_loops import abandon
from quorumstore.node import forwarding
from quorumstore.node.aborts import abort
from quorumstore.node.forwarding import Relays, Routing
from quorumstore.node.notifications import NotificationCache, position_batch
from quorumstore.node.plain_puts import PlainPuts, plain_puts
from quorumstore.node.sessions import SessionKeeper
from quorumstore.node.write_coalescer import WriteCoalescer
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc, replication_pb2
from quorumstore.protocol.replica import NotLeaderError
from quorumstore.storage.keys import compare_keys
from quorumstore.storage.sequences import format_key
from quorumstore.storage.sessions import MAX_SESSION_TIMEOUT_MS, MIN_SESSION_TIMEOUT_MS
from quorumstore.storage.state_machine import (
    EntryResult,
    KeyComparison,
    Record,
    ShardReader,
    Status,
)
from quorumstore.storage.write_batch import (
    VERSION_ID_NOT_EXISTS,
    ClientSerial,
    WriteBatchBuilder,
    puts_batch,
)

log = logging.getLogger(__name__)

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
#: How often the leader looks for expired sessions.
DEFAULT_SESSION_CHECK_INTERVAL_S = 0.1
#: Notification and sequence-update streams wake when the shard signals a change
#: (`ShardHostApi.changes`), and look anyway after this long without one ...
DEFAULT_STREAM_RECHECK_INTERVAL_S = 1.0
#: ... but no sooner than this after their last look, so that under a stream of small
#: writes each wake-up serves several entries rather than one.
STREAM_MIN_INTERVAL_S = 0.002
#: Invocation metadata of an exactly-once write: the client's id and the write's serial.
CLIENT_ID_METADATA_KEY = "qs-client-id"
SERIAL_METADATA_KEY = "qs-serial"
#: Longest client id of an exactly-once write, in UTF-8 bytes.
MAX_CLIENT_ID_BYTES = 256
#: Characters a sequence key adds per delta: "-" and 20 digits.
_SEQUENCE_SUFFIX_CHARS = len(format_key("", [0]))

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

    #: This node's client address (`host:port`), as clients reach it.
    name: str

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

    def changes(self) -> asyncio.Event:
        """Set at the next applied entry, change of role or term, or close; taken before
        reading, so that nothing that happens meanwhile is missed."""
        ...


class OxiaCode(enum.Enum):
    """Oxia's own gRPC status codes that quorumstore sends (see the module docstring)."""

    NODE_IS_NOT_LEADER = (106, "node is not leader")
    SESSION_NOT_FOUND = (108, "session not found")
    INVALID_SESSION_TIMEOUT = (109, "invalid session timeout")
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
        await abort(context, self.code, self.message, self.trailing_metadata)


def _invalid(message: str) -> RequestError:
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


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


def _fill_version(version: pb.Version, record: Record) -> None:
    """Sets `version` (a field of the response, filled in place: no copy) from `record`."""
    version.version_id = record.version_id
    version.modifications_count = record.modifications_count
    version.created_timestamp = record.created_ms
    version.modified_timestamp = record.modified_ms
    if record.session_id is not None:
        version.session_id = record.session_id
    if record.client_identity is not None:
        version.client_identity = record.client_identity


def _write_response(request: pb.WriteRequest, result: EntryResult) -> pb.WriteResponse:
    """Per-op results, which come in batch order (puts, deletes, delete ranges)."""
    results = result.results
    n_puts, n_deletes = len(request.puts), len(request.deletes)
    expected = n_puts + n_deletes + len(request.delete_ranges)
    if len(results) != expected:
        if result.duplicate:
            raise RequestError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this exactly-once serial was already used by an earlier write of the client"
                + (
                    f" with {len(results)} operations, not {expected}"
                    if results
                    else ", and a later serial has completed since: its result is no longer kept"
                ),
            )
        raise RuntimeError(
            f"entry {result.offset} returned {len(results)} results for {expected} operations"
        )
    response = pb.WriteResponse(
        deletes=[
            pb.DeleteResponse(status=_STATUS[r.status])
            for r in results[n_puts : n_puts + n_deletes]
        ],
        delete_ranges=[
            pb.DeleteRangeResponse(status=_STATUS[r.status]) for r in results[n_puts + n_deletes :]
        ],
    )
    add_put = response.puts.add
    for r in results[:n_puts]:
        put = add_put(status=_STATUS[r.status])
        if r.version is not None:
            _fill_version(put.version, r.version)
        if r.key is not None:
            put.key = r.key
    return response


def _record_response(
    key: str, record: Record, include_value: bool, with_key: bool
) -> pb.GetResponse:
    response = pb.GetResponse(status=pb.OK)
    _fill_version(response.version, record)
    if include_value:
        response.value = record.value
    if with_key:
        response.key = key
    return response


def _get_response(reader: ShardReader, get: pb.GetRequest) -> pb.GetResponse:
    """One get; like Oxia, a non-EQUAL match names the key it found.

    Through a secondary index, `key` is a secondary key and the answer names both the
    primary key and the secondary key matched.
    """
    comparison = KeyComparison(get.comparison_type)
    if get.HasField("secondary_index_name"):
        by_index = reader.get_by_index(get.secondary_index_name, get.key, comparison)
        if by_index is None:
            return pb.GetResponse(status=pb.KEY_NOT_FOUND)
        primary, secondary, record = by_index
        response = _record_response(primary, record, get.include_value, with_key=True)
        response.secondary_index_key = secondary
        return response
    found = reader.get_with_comparison(get.key, comparison)
    if found is None:
        return pb.GetResponse(status=pb.KEY_NOT_FOUND)
    key, record = found
    return _record_response(key, record, get.include_value, get.comparison_type != pb.EQUAL)


def _client_assignments(
    table: replication_pb2.ShardAssignmentsUpdate, namespace: str, gateway: str | None = None
) -> pb.ShardAssignments:
    """Oxia's view of one namespace of our routing table.

    A shard without a leader yet is kept, with an empty leader, as Oxia's coordinator
    does: leaving it out would make clients that scan every shard (list, range scan,
    delete range) silently skip its keys, while an empty address fails loudly. With a
    `gateway` address, that address stands for every shard's leader.
    """
    for entry in table.namespaces:
        if entry.namespace == namespace:
            shards = [
                pb.ShardAssignment(
                    shard=s.shard,
                    leader=gateway or s.leader,
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


def _monotonic_ms() -> int:
    """Session clocks: a wall-clock jump must not expire sessions."""
    return time.monotonic_ns() // 1_000_000


def _origin(context: grpc.aio.ServicerContext) -> ClientSerial | None:
    """The exactly-once (client id, serial) a Write carries in its metadata, if any."""
    metadata = {m.key: m.value for m in context.invocation_metadata() or ()}
    client_id = metadata.get(CLIENT_ID_METADATA_KEY)
    serial = metadata.get(SERIAL_METADATA_KEY)
    if client_id is None and serial is None:
        return None
    if client_id is None or serial is None:
        given, missing = (
            (SERIAL_METADATA_KEY, CLIENT_ID_METADATA_KEY)
            if client_id is None
            else (CLIENT_ID_METADATA_KEY, SERIAL_METADATA_KEY)
        )
        raise _invalid(
            f"metadata {given} is given without {missing}; an exactly-once write needs both"
        )
    if not client_id or len(client_id.encode()) > MAX_CLIENT_ID_BYTES:
        raise _invalid(
            f"metadata {CLIENT_ID_METADATA_KEY} must be 1 to {MAX_CLIENT_ID_BYTES} bytes, "
            f"got {len(client_id.encode())}"
        )
    if not serial.isdigit() or int(serial) >= 1 << 63:
        raise _invalid(
            f"metadata {SERIAL_METADATA_KEY} must be a decimal integer in [0, 2^63), got {serial!r}"
        )
    return ClientSerial(client_id, int(serial))


def _next_serial(origin: ClientSerial) -> ClientSerial:
    """The serial of a WriteStream's request after the one `origin` is of."""
    if origin.serial + 1 >= 1 << 63:
        raise _invalid(
            f"metadata {SERIAL_METADATA_KEY}: the stream's serials would pass 2^63 - 1; "
            "open a new stream with a lower serial"
        )
    return origin._replace(serial=origin.serial + 1)


def _serial_metadata(origin: ClientSerial | None) -> list[tuple[str, str]]:
    """The exactly-once metadata of a write with `origin` (none without one)."""
    if origin is None:
        return []
    return [(CLIENT_ID_METADATA_KEY, origin.client_id), (SERIAL_METADATA_KEY, str(origin.serial))]


def _relay_error(address: str, shard: int, error: grpc.aio.AioRpcError) -> RequestError:
    """The status a relayed call failed with, as this node's answer to the client."""
    details = error.details() or ""
    hint = tuple(
        (key, value)
        for key, value in error.trailing_metadata() or ()
        if key == LEADER_HINT_METADATA_KEY and isinstance(value, str)
    )
    if details.startswith("node is not leader"):
        return RequestError(OxiaCode.NODE_IS_NOT_LEADER, details, hint)
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        details = f"leader {address} of shard {shard} is unreachable: {details}"
    return RequestError(error.code(), details, hint)


class OxiaClientServicer(oxia_client_pb2_grpc.OxiaClientServicer):
    """Serves the Oxia client protocol for the shards of one node.

    Requests name their shard (clients route by key hash themselves); the servicer
    never re-routes by key. Only the shard's leader serves reads and writes; a call
    for a shard led elsewhere is refused with a leader hint or, in gateway mode,
    relayed to the leader. Create it on the event loop that serves it: it starts the
    task that expires sessions there (`close()` stops it).
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
        session_check_interval_s: float = DEFAULT_SESSION_CHECK_INTERVAL_S,
        stream_recheck_interval_s: float = DEFAULT_STREAM_RECHECK_INTERVAL_S,
        session_clock_ms: Callable[[], int] = _monotonic_ms,
    ) -> None:
        limits = {
            "max_key_bytes": max_key_bytes,
            "max_value_bytes": max_value_bytes,
            "max_response_items": max_response_items,
            "max_response_bytes": max_response_bytes,
            "max_inflight_stream_writes": max_inflight_stream_writes,
            "session_check_interval_s": session_check_interval_s,
            "stream_recheck_interval_s": stream_recheck_interval_s,
        }
        for name, value in limits.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self._directory = directory
        self._max_key_bytes = max_key_bytes
        self._max_value_bytes = max_value_bytes
        self._max_response_items = max_response_items
        self._max_response_bytes = max_response_bytes
        self._max_inflight_stream_writes = max_inflight_stream_writes
        self._session_check_interval_s = session_check_interval_s
        self._recheck_interval_s = stream_recheck_interval_s
        # The shard index of the last table seen, rebuilt when the table object changes.
        self._indexed_table: replication_pb2.ShardAssignmentsUpdate | None = None
        self._index: dict[int, tuple[str, str]] = {}
        self._sessions = SessionKeeper(session_clock_ms)
        self._relays = Relays()
        self._coalescers: weakref.WeakKeyDictionary[
            ShardHostApi, WriteCoalescer[PlainPuts | None]
        ] = weakref.WeakKeyDictionary()
        self._notification_caches: weakref.WeakKeyDictionary[ShardHostApi, NotificationCache] = (
            weakref.WeakKeyDictionary()
        )
        self._expiry = asyncio.get_running_loop().create_task(self._expire_sessions())

    async def close(self) -> None:
        """Stops expiring sessions and closes the channels of relayed calls."""
        self._expiry.cancel()
        self._sessions.cancel()
        await self._relays.close()

    # ------------------------------------------------------------ routing

    async def GetShardAssignments(
        self, request: pb.ShardAssignmentsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ShardAssignments]:
        """The namespace's full map now, and again whenever it changes.

        A node that has no table yet holds the stream open until the first one. A new
        table that leaves this namespace's map as it was is not sent. In gateway mode
        the map names this node for every shard, so leader changes never change it.
        """
        namespace = request.namespace or DEFAULT_NAMESPACE
        last_sent: pb.ShardAssignments | None = None
        try:
            try:
                gateway = forwarding.routing_of(context) is Routing.GATEWAY
            except ValueError as e:
                raise _invalid(str(e)) from None
            while True:
                table = self._directory.assignments()
                if table.namespaces:
                    address = self._directory.name if gateway else None
                    message = _client_assignments(table, namespace, address)
                    if message != last_sent:
                        yield message
                        last_sent = message
                await self._directory.assignments_changed(table.version)
        except RequestError as e:
            await e.abort(context)

    def _locate(self, request_shard: int | None) -> tuple[int, str, str]:
        """(shard, namespace, leader address in the routing table) of the named shard."""
        if request_shard is None:
            raise _invalid("the request names no shard; quorumstore does not route by key")
        table = self._directory.assignments()
        if table is not self._indexed_table:
            self._index = _shard_index(table)
            self._indexed_table = table
        located = self._index.get(request_shard)
        if located is None:
            raise _invalid(f"unknown shard {request_shard}: it is in no namespace of this cluster")
        return (request_shard, *located)

    def _leader_host(self, request_shard: int | None) -> ShardHostApi:
        """The leader replica of the named shard on this node, or the error to return."""
        shard, namespace, table_leader = self._locate(request_shard)
        host = self._directory.shard_host(namespace, shard)
        if host is None:
            raise _not_leader(shard, table_leader or None)
        if not host.is_leader():
            raise _not_leader(shard, host.leader_hint())
        return host

    def _route(
        self, request_shard: int | None, context: grpc.aio.ServicerContext
    ) -> ShardHostApi | str:
        """The shard's leader replica here, or in gateway mode the address to relay to."""
        try:
            return self._leader_host(request_shard)
        except RequestError as refused:
            if refused.code is not OxiaCode.NODE_IS_NOT_LEADER:
                raise
            try:
                relay = forwarding.may_relay(context)
            except ValueError as e:
                raise _invalid(str(e)) from None
            hint = dict(refused.trailing_metadata).get(LEADER_HINT_METADATA_KEY)
            if not relay or not hint or hint == self._directory.name:
                raise
            return hint

    async def _relay_unary(
        self,
        address: str,
        method: str,
        request: Any,
        shard: int,
        context: grpc.aio.ServicerContext,
        origin: ClientSerial | None = None,
    ) -> Any:
        """`method` on the leader at `address`; `origin` is a write's exactly-once serial
        (a WriteStream's request's own, not the stream's first)."""
        call = getattr(self._relays.stub(address), method)
        try:
            return await call(
                request,
                metadata=forwarding.relay_metadata(_serial_metadata(origin)),
                timeout=context.time_remaining(),
            )
        except grpc.aio.AioRpcError as e:
            raise _relay_error(address, shard, e) from None

    async def _relay_stream(
        self, address: str, method: str, request: Any, shard: int, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[Any, None]:
        call = getattr(self._relays.stub(address), method)(
            request, metadata=forwarding.relay_metadata()
        )
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as e:
            raise _relay_error(address, shard, e) from None
        finally:
            call.cancel()

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

    def _check_sequence(self, put: pb.PutRequest, field: str) -> None:
        """A put with sequence_key_delta, as Oxia requires it (its ErrMissingPartitionKey,
        ErrBadVersionId, ErrSequenceDeltaIsZero), and within the key limit."""
        deltas = put.sequence_key_delta
        if not put.HasField("partition_key"):
            raise _invalid(f"{field}: sequence keys (sequence_key_delta) need a partition_key")
        if put.HasField("expected_version_id"):
            raise _invalid(f"{field}: sequence keys cannot have an expected_version_id")
        if deltas[0] == 0:
            raise _invalid(f"{field}.sequence_key_delta[0] is 0; the first delta must be > 0")
        size = len(put.key.encode()) + _SEQUENCE_SUFFIX_CHARS * len(deltas)
        if size > self._max_key_bytes:
            raise _invalid(
                f"{field}: the sequence key would be {size} bytes, above the limit of "
                f"{self._max_key_bytes} bytes"
            )

    def _check_put(self, put: pb.PutRequest, field: str) -> None:
        self._check_key(put.key, f"{field}.key")
        if len(put.value) > self._max_value_bytes:
            raise _invalid(
                f"{field}.value is {len(put.value)} bytes, above the limit of "
                f"{self._max_value_bytes} bytes"
            )
        if put.HasField("partition_key"):
            self._check_key(put.partition_key, f"{field}.partition_key", allow_empty=True)
        if put.HasField("client_identity"):
            self._check_key(put.client_identity, f"{field}.client_identity", allow_empty=True)
        if put.sequence_key_delta:
            self._check_sequence(put, field)
        for j, index in enumerate(put.secondary_indexes):
            self._check_key(index.index_name, f"{field}.secondary_indexes[{j}].index_name")
            self._check_key(index.secondary_key, f"{field}.secondary_indexes[{j}].secondary_key")
        self._check_expected_version(put, field)

    def _check_write(self, request: pb.WriteRequest) -> PlainPuts | None:
        """The whole request, so that a bad op anywhere writes nothing; its plain puts,
        if that is all it holds (see `plain_puts.py`)."""
        plain = plain_puts(request)
        if plain is not None and self._plain_puts_within_limits(plain):
            return plain
        # Op by op: slower, and names the op that is wrong.
        for i, put in enumerate(request.puts):
            self._check_put(put, f"puts[{i}]")
        for i, delete in enumerate(request.deletes):
            self._check_key(delete.key, f"deletes[{i}].key")
            self._check_expected_version(delete, f"deletes[{i}]")
        for i, delete_range in enumerate(request.delete_ranges):
            self._check_range(
                delete_range.start_inclusive, delete_range.end_exclusive, f"delete_ranges[{i}]"
            )
        return None

    def _plain_puts_within_limits(self, plain: PlainPuts) -> bool:
        """Whether `_check_put` would pass every one of these plain puts."""
        return not len(plain.keys) or (
            plain.shortest_key_bytes > 0
            and plain.longest_key_bytes <= self._max_key_bytes
            and plain.largest_value_bytes <= self._max_value_bytes
        )

    @staticmethod
    def _check_sequence_state(reader: ShardReader, request: pb.WriteRequest) -> None:
        """Oxia's ErrMissingSequenceDeltas: a put gives fewer deltas than its sequence has."""
        for i, put in enumerate(request.puts):
            if put.sequence_key_delta:
                have = reader.sequence_dimensions(put.key)
                if len(put.sequence_key_delta) < have:
                    raise _invalid(
                        f"puts[{i}]: the keys of sequence {put.key!r} carry {have} numbers, "
                        f"so sequence_key_delta needs at least {have} deltas, got "
                        f"{len(put.sequence_key_delta)}"
                    )

    def _check_gets(self, gets: Sequence[pb.GetRequest]) -> None:
        for i, get in enumerate(gets):
            field = f"gets[{i}]"
            if get.comparison_type not in _COMPARISONS:
                raise _invalid(f"{field}.comparison_type {get.comparison_type} is unknown")
            # A bound for FLOOR/CEILING/LOWER/HIGHER may be empty ("" sorts first).
            self._check_key(get.key, f"{field}.key", allow_empty=get.comparison_type != pb.EQUAL)
            if get.HasField("secondary_index_name"):
                self._check_key(get.secondary_index_name, f"{field}.secondary_index_name")

    def _check_scan(self, request: pb.ListRequest | pb.RangeScanRequest) -> None:
        self._check_range(request.start_inclusive, request.end_exclusive, "request")
        if request.HasField("secondary_index_name"):
            self._check_key(request.secondary_index_name, "request.secondary_index_name")

    # -------------------------------------------------------------- writes

    def _build_batch(
        self,
        requests: Sequence[pb.WriteRequest],
        plains: Sequence[PlainPuts | None],
        origin: ClientSerial | None,
    ) -> bytes:
        """One write batch of `requests` in order, each as its puts, then its deletes,
        then its delete ranges; `plains` are their `plain_puts`."""
        columns = [plain for plain in plains if plain is not None]
        if len(columns) == len(requests):
            return puts_batch(
                pa.concat_arrays([plain.keys for plain in columns]),
                pa.concat_arrays([plain.values for plain in columns]),
                self._directory.now_ms(),
                origin,
            )
        batch = WriteBatchBuilder()
        for request in requests:
            self._add_request(batch, request)
        return batch.build(self._directory.now_ms(), origin)

    @staticmethod
    def _add_request(batch: WriteBatchBuilder, request: pb.WriteRequest) -> None:
        for put in request.puts:
            batch.add_put(
                put.key,
                put.value,
                expected_version_id=put.expected_version_id
                if put.HasField("expected_version_id")
                else None,
                session_id=put.session_id if put.HasField("session_id") else None,
                client_identity=put.client_identity if put.HasField("client_identity") else None,
                partition_key=put.partition_key if put.HasField("partition_key") else None,
                sequence_key_delta=list(put.sequence_key_delta),
                secondary_indexes=[(i.index_name, i.secondary_key) for i in put.secondary_indexes],
            )
        for delete in request.deletes:
            batch.add_delete(
                delete.key,
                delete.expected_version_id if delete.HasField("expected_version_id") else None,
            )
        for delete_range in request.delete_ranges:
            batch.add_delete_range(delete_range.start_inclusive, delete_range.end_exclusive)

    def _coalescer(self, host: ShardHostApi, shard: int) -> WriteCoalescer[PlainPuts | None]:
        coalescer = self._coalescers.get(host)
        if coalescer is None:

            async def replicate(
                requests: Sequence[pb.WriteRequest], plains: Sequence[PlainPuts | None]
            ) -> EntryResult:
                return await self._replicate(host, shard, self._build_batch(requests, plains, None))

            coalescer = self._coalescers[host] = WriteCoalescer(replicate)
        return coalescer

    @staticmethod
    async def _replicate(host: ShardHostApi, shard: int, payload: bytes) -> EntryResult:
        try:
            return await host.write(payload)
        except NotLeaderError as e:
            raise _not_leader(shard, e.leader_hint) from e

    async def _write(
        self,
        request: pb.WriteRequest,
        context: grpc.aio.ServicerContext,
        origin: ClientSerial | None = None,
        previous: asyncio.Future[pb.WriteResponse] | None = None,
    ) -> pb.WriteResponse:
        """One write; a relayed one first waits for `previous` (the stream's write before
        it), so that a stream's writes reach their leaders in request order."""
        shard = request.shard if request.HasField("shard") else None
        target = self._route(shard, context)
        plain = self._check_write(request)
        if isinstance(target, str):
            if previous is not None:
                await asyncio.wait([previous])
            return await self._relay_unary(target, "Write", request, request.shard, context, origin)
        if not (request.puts or request.deletes or request.delete_ranges):
            return pb.WriteResponse()
        if plain is None:
            self._check_sequence_state(target.reader(), request)
        if origin is None:  # merged with the shard's other concurrent writes
            result = await self._coalescer(target, request.shard).write(request, plain)
        else:
            result = await self._replicate(
                target, request.shard, self._build_batch([request], [plain], origin)
            )
        return _write_response(request, result)

    async def Write(
        self, request: pb.WriteRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteResponse:
        try:
            return await self._write(request, context, _origin(context))
        except RequestError as e:
            await e.abort(context)

    async def WriteStream(
        self, request_iterator: AsyncIterator[pb.WriteRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WriteResponse]:
        """Each request is one write, started as soon as it arrives; answers keep order.

        A refused request ends the stream with its status once the answers before it
        are sent; writes after it that had already started are abandoned, not undone
        (as when a connection drops). With exactly-once metadata, `qs-serial` is the
        serial of the stream's first request and each later one carries the next.
        """
        try:
            first = _origin(context)
        except RequestError as e:
            await e.abort(context)
        pending: asyncio.Queue[asyncio.Future[pb.WriteResponse] | None] = asyncio.Queue()
        inflight = asyncio.Semaphore(self._max_inflight_stream_writes)

        async def start_writes() -> None:
            previous: asyncio.Future[pb.WriteResponse] | None = None
            origin = first
            try:
                async for request in request_iterator:
                    await inflight.acquire()
                    previous = asyncio.ensure_future(
                        self._write(request, context, origin, previous)
                    )
                    pending.put_nowait(previous)
                    if origin is not None:
                        origin = _next_serial(origin)
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
                abandon(pending.get_nowait())

    # --------------------------------------------------------------- reads

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadResponse]:
        try:
            target = self._route(request.shard if request.HasField("shard") else None, context)
            self._check_gets(request.gets)
            if isinstance(target, str):
                relayed = self._relay_stream(target, "Read", request, request.shard, context)
                async with aclosing(relayed):
                    async for response in relayed:
                        yield response
                return
        except RequestError as e:
            await e.abort(context)
        reader = target.reader()
        responses = (_get_response(reader, get) for get in request.gets)
        for chunk in _chunks(
            responses, lambda r: len(r.value), self._max_response_items, self._max_response_bytes
        ):
            yield pb.ReadResponse(gets=chunk)

    async def List(
        self, request: pb.ListRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListResponse]:
        """Keys in [start, end) in hierarchical order; an empty end means unbounded.

        Through a secondary index, the range is over secondary keys and the answer is
        the primary keys, by secondary key.
        """

        def answer(reader: ShardReader) -> Iterator[pb.ListResponse]:
            if request.HasField("secondary_index_name"):
                keys = reader.list_by_index(
                    request.secondary_index_name, request.start_inclusive, request.end_exclusive
                )
            else:
                keys = reader.list_keys(request.start_inclusive, request.end_exclusive)
            for chunk in _chunks(keys, len, self._max_response_items, self._max_response_bytes):
                yield pb.ListResponse(keys=chunk)

        async with aclosing(self._scan("List", request, context, answer)) as responses:
            async for response in responses:
                yield response

    async def RangeScan(
        self, request: pb.RangeScanRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RangeScanResponse]:
        """Records in [start, end) in hierarchical order; an empty end means unbounded.

        Through a secondary index, as for List, and each record also names the
        secondary key it was found by (`secondary_index_key`, which Oxia sets on
        index gets), so that a client can merge the shards' streams in index order.
        """

        def by_index(reader: ShardReader, name: str) -> Iterator[pb.GetResponse]:
            found = reader.range_scan_by_index(name, request.start_inclusive, request.end_exclusive)
            for primary, secondary, record in found:
                response = _record_response(primary, record, include_value=True, with_key=True)
                response.secondary_index_key = secondary
                yield response

        def answer(reader: ShardReader) -> Iterator[pb.RangeScanResponse]:
            if request.HasField("secondary_index_name"):
                records = by_index(reader, request.secondary_index_name)
            else:
                records = (
                    _record_response(k, r, include_value=True, with_key=True)
                    for k, r in reader.range_scan(request.start_inclusive, request.end_exclusive)
                )
            for chunk in _chunks(
                records,
                lambda r: len(r.key) + len(r.value),
                self._max_response_items,
                self._max_response_bytes,
            ):
                yield pb.RangeScanResponse(records=chunk)

        async with aclosing(self._scan("RangeScan", request, context, answer)) as responses:
            async for response in responses:
                yield response

    async def _scan(
        self,
        method: str,
        request: pb.ListRequest | pb.RangeScanRequest,
        context: grpc.aio.ServicerContext,
        answer: Callable[[ShardReader], Iterator[_T]],
    ) -> AsyncGenerator[_T, None]:
        """A List or RangeScan: checked, then relayed to the leader in gateway mode or
        answered here from the leader's committed state."""
        try:
            target = self._route(request.shard if request.HasField("shard") else None, context)
            self._check_scan(request)
            if isinstance(target, str):
                relayed = self._relay_stream(target, method, request, request.shard, context)
                async with aclosing(relayed):
                    async for response in relayed:
                        yield response
                return
        except RequestError as e:
            await e.abort(context)
        for response in answer(target.reader()):
            yield response

    # ------------------------------------------------------------ sessions

    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateSessionResponse:
        try:
            target = self._route(request.shard, context)
            timeout = request.session_timeout_ms
            if not MIN_SESSION_TIMEOUT_MS <= timeout <= MAX_SESSION_TIMEOUT_MS:
                raise RequestError(
                    OxiaCode.INVALID_SESSION_TIMEOUT,
                    f"oxia: invalid session timeout: {timeout} ms is outside "
                    f"[{MIN_SESSION_TIMEOUT_MS}, {MAX_SESSION_TIMEOUT_MS}] ms",
                )
            self._check_key(request.client_identity, "client_identity", allow_empty=True)
            if isinstance(target, str):
                return await self._relay_unary(
                    target, "CreateSession", request, request.shard, context
                )
            batch = WriteBatchBuilder()
            batch.add_create_session(timeout, request.client_identity)
            result = await self._replicate(
                target, request.shard, batch.build(self._directory.now_ms())
            )
            session_id = result.results[0].session_id
            assert session_id is not None, "a session create returned no session id"
            self._sessions.started(target, session_id, timeout)
            return pb.CreateSessionResponse(session_id=session_id)
        except RequestError as e:
            await e.abort(context)

    async def KeepAlive(
        self, request: pb.SessionHeartbeat, context: grpc.aio.ServicerContext
    ) -> pb.KeepAliveResponse:
        try:
            target = self._route(request.shard, context)
            if isinstance(target, str):
                return await self._relay_unary(target, "KeepAlive", request, request.shard, context)
            if not self._sessions.heartbeat(target, request.session_id):
                raise _session_not_found(request.shard, request.session_id)
            return pb.KeepAliveResponse()
        except RequestError as e:
            await e.abort(context)

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseSessionResponse:
        """Closes the session; its ephemeral records are deleted by the same write."""
        try:
            target = self._route(request.shard, context)
            if isinstance(target, str):
                return await self._relay_unary(
                    target, "CloseSession", request, request.shard, context
                )
            if not await self._close_session(target, request.shard, request.session_id):
                raise _session_not_found(request.shard, request.session_id)
            return pb.CloseSessionResponse()
        except RequestError as e:
            await e.abort(context)

    async def _close_session(self, host: ShardHostApi, shard: int, session_id: int) -> bool:
        """Replicates the session's close; False if the shard had no such session."""
        batch = WriteBatchBuilder()
        batch.add_close_session(session_id)
        result = await self._replicate(host, shard, batch.build(self._directory.now_ms()))
        self._sessions.forget(host, session_id)
        return result.results[0].status == Status.OK

    def _hosts(self) -> list[tuple[int, ShardHostApi]]:
        """(shard, replica) of every shard in the routing table hosted here."""
        table = self._directory.assignments()
        hosts = []
        for shard, (namespace, _) in _shard_index(table).items():
            host = self._directory.shard_host(namespace, shard)
            if host is not None:
                hosts.append((shard, host))
        return hosts

    async def _expire_sessions(self) -> None:
        """Forever: close the sessions whose leader here heard nothing for their timeout."""
        while True:
            await asyncio.sleep(self._session_check_interval_s)
            try:
                hosts = self._hosts()
                shards = {id(host): shard for shard, host in hosts}
                close = functools.partial(self._close_expired, shards)
                self._sessions.expire([host for _, host in hosts], close)
            except Exception:  # the sweep must go on; the next one retries
                log.exception("session expiry sweep failed")

    async def _close_expired(self, shards: dict[int, int], host: Any, session_id: int) -> None:
        await self._close_session(host, shards[id(host)], session_id)

    # --------------------------------------------------- streams of changes

    async def GetSequenceUpdates(
        self, request: pb.GetSequenceUpdatesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetSequenceUpdatesResponse]:
        """The last key assigned under the prefix now (if any), then each newer one.

        Keys assigned in quick succession may be collapsed into the latest, as in Oxia.
        The stream ends with a not-leader error when this node stops leading the shard.
        """
        try:
            target = self._route(request.shard, context)
            self._check_key(request.key, "key")
            if isinstance(target, str):
                relayed = self._relay_stream(
                    target, "GetSequenceUpdates", request, request.shard, context
                )
                async with aclosing(relayed):
                    async for response in relayed:
                        yield response
                return
            last_sent: str | None = None
            seen_offset: int | None = None
            while True:
                host = self._leader_host(request.shard)
                changed = host.changes()
                reader = host.reader()
                offset = reader.applied_position.offset
                if offset != seen_offset:
                    seen_offset = offset
                    latest = reader.latest_sequence_key(request.key)
                    if latest is not None and latest != last_sent:
                        yield pb.GetSequenceUpdatesResponse(highest_sequence_key=latest)
                        last_sent = latest
                await self._next_look(changed)
        except RequestError as e:
            await e.abort(context)

    async def GetNotifications(
        self, request: pb.NotificationsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.NotificationBatch]:
        """The batches of each entry after `start_offset_exclusive` (one, unless the entry
        is large: see `notifications`), from the shard's change log.

        Without an offset the stream starts at the last applied entry, announced by an
        empty batch at that offset (as Oxia does). A resumed stream with nothing new
        yet also starts with an empty batch at its offset (see `position_batch`).
        """
        shard = request.shard
        try:
            target = self._route(shard, context)
            start = (
                request.start_offset_exclusive
                if request.HasField("start_offset_exclusive")
                else None
            )
            if start is not None and start < -1:
                raise _invalid(f"start_offset_exclusive is {start}; offsets start at -1")
            if isinstance(target, str):
                relayed = self._relay_stream(target, "GetNotifications", request, shard, context)
                async with aclosing(relayed):
                    async for response in relayed:
                        yield response
                return
            reader = target.reader()
            if start is None:
                start = reader.applied_position.offset
                yield position_batch(shard, start)
                announced = True
            else:
                kept_after = reader.changes_kept_after()
                if start < kept_after:
                    raise RequestError(
                        grpc.StatusCode.OUT_OF_RANGE,
                        f"the changes of shard {shard} up to offset {kept_after} are past their "
                        f"retention; resume from offset {kept_after} or later, or subscribe "
                        "without an offset",
                    )
                announced = False
            last = start
            while True:
                host = self._leader_host(shard)
                changed = host.changes()
                reader = host.reader()
                applied = reader.applied_position.offset
                if applied > last:
                    cache = self._notification_caches.get(host)
                    if cache is None:
                        cache = self._notification_caches[host] = NotificationCache(shard)
                    for batch in cache.batches(reader, last, applied):
                        yield batch
                        announced = True
                    last = applied
                if not announced:
                    yield position_batch(shard, start)
                    announced = True
                await self._next_look(changed)
        except RequestError as e:
            await e.abort(context)

    async def _next_look(self, changed: asyncio.Event) -> None:
        """Waits until a stream looks at its shard again: `STREAM_MIN_INTERVAL_S` from now
        at the soonest, once `changed` is set or the recheck interval has passed."""
        await asyncio.sleep(STREAM_MIN_INTERVAL_S)
        if not changed.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._recheck_interval_s):
                    await changed.wait()


def _session_not_found(shard: int, session_id: int) -> RequestError:
    return RequestError(
        OxiaCode.SESSION_NOT_FOUND, f"oxia: session not found: {session_id} on shard {shard}"
    )
