"""The checks of an Oxia request, done whole before anything of it is written.

A bad op anywhere in a request refuses all of it (INVALID_ARGUMENT, naming the op),
so that a write is applied entirely or not at all. The exactly-once metadata of a
write (`qs-client-id`, `qs-serial`) is read and checked here too.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from quorumstore.node.oxia.errors import RequestError, invalid
from quorumstore.node.oxia.plain_puts import PlainPuts, plain_puts
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.reads import KeyComparison, ShardReader
from quorumstore.storage.sequences import format_key
from quorumstore.storage.write_batch import VERSION_ID_NOT_EXISTS
from quorumstore.wire.keys import compare_keys
from quorumstore.wire.metadata import (
    CLIENT_ID_METADATA_KEY,
    MAX_CLIENT_ID_BYTES,
    SERIAL_METADATA_KEY,
    ClientSerial,
)
from quorumstore.wire.sessions import MAX_SESSION_TIMEOUT_MS, MIN_SESSION_TIMEOUT_MS
from quorumstore.wire.status import OxiaCode

#: Largest key, in UTF-8 bytes. Keys are stored escaped and segment-encoded, and every
#: record and range bound carries one, so they are kept far below values.
DEFAULT_MAX_KEY_BYTES = 64 * 1024
#: Largest value. The gRPC server must accept messages at least this large (plus the
#: key and framing): set `grpc.max_receive_message_length` accordingly.
DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024
#: Characters a sequence key adds per delta: "-" and 20 digits.
_SEQUENCE_SUFFIX_CHARS = len(format_key("", [0]))
_COMPARISONS = {int(c) for c in KeyComparison}


class Validator:
    """The limits of keys and values, and the checks of each kind of request."""

    def __init__(self, max_key_bytes: int, max_value_bytes: int) -> None:
        self._max_key_bytes = max_key_bytes
        self._max_value_bytes = max_value_bytes

    def check_key(self, key: str, field: str, *, allow_empty: bool = False) -> None:
        if not key and not allow_empty:
            raise invalid(f"{field} is empty")
        size = len(key.encode())
        if size > self._max_key_bytes:
            raise invalid(
                f"{field} is {size} bytes, above the limit of {self._max_key_bytes} bytes"
            )

    @staticmethod
    def _check_expected_version(request: pb.PutRequest | pb.DeleteRequest, field: str) -> None:
        if (
            request.HasField("expected_version_id")
            and request.expected_version_id < VERSION_ID_NOT_EXISTS
        ):
            raise invalid(
                f"{field}.expected_version_id is {request.expected_version_id}; it must be a "
                f"version id (>= 0) or {VERSION_ID_NOT_EXISTS} (the record must not exist)"
            )

    def _check_range(self, start: str, end: str, field: str) -> None:
        """A [start, end) key range; an empty end means unbounded."""
        self.check_key(start, f"{field}.start_inclusive", allow_empty=True)
        self.check_key(end, f"{field}.end_exclusive", allow_empty=True)
        if end and compare_keys(start, end) > 0:
            raise invalid(
                f"{field}: start_inclusive {start!r} sorts after end_exclusive {end!r} "
                "in hierarchical key order"
            )

    def _check_sequence(self, put: pb.PutRequest, field: str) -> None:
        """A put with sequence_key_delta, as Oxia requires it (its ErrMissingPartitionKey,
        ErrBadVersionId, ErrSequenceDeltaIsZero), and within the key limit."""
        deltas = put.sequence_key_delta
        if not put.HasField("partition_key"):
            raise invalid(f"{field}: sequence keys (sequence_key_delta) need a partition_key")
        if put.HasField("expected_version_id"):
            raise invalid(f"{field}: sequence keys cannot have an expected_version_id")
        if deltas[0] == 0:
            raise invalid(f"{field}.sequence_key_delta[0] is 0; the first delta must be > 0")
        size = len(put.key.encode()) + _SEQUENCE_SUFFIX_CHARS * len(deltas)
        if size > self._max_key_bytes:
            raise invalid(
                f"{field}: the sequence key would be {size} bytes, above the limit of "
                f"{self._max_key_bytes} bytes"
            )

    def _check_put(self, put: pb.PutRequest, field: str) -> None:
        self.check_key(put.key, f"{field}.key")
        if len(put.value) > self._max_value_bytes:
            raise invalid(
                f"{field}.value is {len(put.value)} bytes, above the limit of "
                f"{self._max_value_bytes} bytes"
            )
        if put.HasField("partition_key"):
            self.check_key(put.partition_key, f"{field}.partition_key", allow_empty=True)
        if put.HasField("client_identity"):
            self.check_key(put.client_identity, f"{field}.client_identity", allow_empty=True)
        if put.sequence_key_delta:
            self._check_sequence(put, field)
        for j, index in enumerate(put.secondary_indexes):
            self.check_key(index.index_name, f"{field}.secondary_indexes[{j}].index_name")
            self.check_key(index.secondary_key, f"{field}.secondary_indexes[{j}].secondary_key")
        self._check_expected_version(put, field)

    def check_write(self, request: pb.WriteRequest) -> PlainPuts | None:
        """The whole request, so that a bad op anywhere writes nothing; its plain puts,
        if that is all it holds (see `plain_puts.py`)."""
        plain = plain_puts(request)
        if plain is not None and self._plain_puts_within_limits(plain):
            return plain
        # Op by op: slower, and names the op that is wrong.
        for i, put in enumerate(request.puts):
            self._check_put(put, f"puts[{i}]")
        for i, delete in enumerate(request.deletes):
            self.check_key(delete.key, f"deletes[{i}].key")
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
    def check_sequence_state(reader: ShardReader, request: pb.WriteRequest) -> None:
        """Oxia's ErrMissingSequenceDeltas: a put gives fewer deltas than its sequence has."""
        for i, put in enumerate(request.puts):
            if put.sequence_key_delta:
                have = reader.sequence_dimensions(put.key)
                if len(put.sequence_key_delta) < have:
                    raise invalid(
                        f"puts[{i}]: the keys of sequence {put.key!r} carry {have} numbers, "
                        f"so sequence_key_delta needs at least {have} deltas, got "
                        f"{len(put.sequence_key_delta)}"
                    )

    def check_gets(self, gets: Sequence[pb.GetRequest]) -> None:
        for i, get in enumerate(gets):
            field = f"gets[{i}]"
            if get.comparison_type not in _COMPARISONS:
                raise invalid(f"{field}.comparison_type {get.comparison_type} is unknown")
            # A bound for FLOOR/CEILING/LOWER/HIGHER may be empty ("" sorts first).
            self.check_key(get.key, f"{field}.key", allow_empty=get.comparison_type != pb.EQUAL)
            if get.HasField("secondary_index_name"):
                self.check_key(get.secondary_index_name, f"{field}.secondary_index_name")

    def check_scan(self, request: pb.ListRequest | pb.RangeScanRequest) -> None:
        self._check_range(request.start_inclusive, request.end_exclusive, "request")
        if request.HasField("secondary_index_name"):
            self.check_key(request.secondary_index_name, "request.secondary_index_name")

    def check_create_session(self, request: pb.CreateSessionRequest) -> None:
        timeout = request.session_timeout_ms
        if not MIN_SESSION_TIMEOUT_MS <= timeout <= MAX_SESSION_TIMEOUT_MS:
            raise RequestError(
                OxiaCode.INVALID_SESSION_TIMEOUT,
                f"{OxiaCode.INVALID_SESSION_TIMEOUT.message_prefix}: {timeout} ms is outside "
                f"[{MIN_SESSION_TIMEOUT_MS}, {MAX_SESSION_TIMEOUT_MS}] ms",
            )
        self.check_key(request.client_identity, "client_identity", allow_empty=True)


def origin(context: grpc.aio.ServicerContext) -> ClientSerial | None:
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
        raise invalid(
            f"metadata {given} is given without {missing}; an exactly-once write needs both"
        )
    if not client_id or len(client_id.encode()) > MAX_CLIENT_ID_BYTES:
        raise invalid(
            f"metadata {CLIENT_ID_METADATA_KEY} must be 1 to {MAX_CLIENT_ID_BYTES} bytes, "
            f"got {len(client_id.encode())}"
        )
    if not serial.isdigit() or int(serial) >= 1 << 63:
        raise invalid(
            f"metadata {SERIAL_METADATA_KEY} must be a decimal integer in [0, 2^63), got {serial!r}"
        )
    return ClientSerial(client_id, int(serial))


def next_serial(origin: ClientSerial) -> ClientSerial:
    """The serial of a WriteStream's request after the one `origin` is of."""
    if origin.serial + 1 >= 1 << 63:
        raise invalid(
            f"metadata {SERIAL_METADATA_KEY}: the stream's serials would pass 2^63 - 1; "
            "open a new stream with a lower serial"
        )
    return origin._replace(serial=origin.serial + 1)
