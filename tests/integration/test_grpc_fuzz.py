"""A fuzz campaign against a node's client port: the Oxia API and the data service.

Every input from the network is hostile until validated, and no committed entry may fail
to apply (security issue, item 7). The apply's own totality has hypothesis tests
(tests/unit/test_total_apply.py); this suite attacks the servers that feed it, over
gRPC. Two real nodes on loopback (`leader_and_follower`) replicate one shard, so what a
fuzzed call commits is applied on both; both route clients to its leader, and both are
attacked, the follower's calls being refused or relayed to the leader.

Every method of both services, read from their service descriptors (a new method is
fuzzed without a change here), gets two layers:

- raw bytes: random bytes, and hostile requests mangled (cut, flipped, spliced), as the
  serialized request, through generic calls; a request stream gets several;
- hostile messages: requests built field by field from the message descriptors: ints at
  their extremes, keys empty, at and past their limit, invalid UTF-8 in string fields,
  the existing shard often and unknown ones, oneofs unset, many repeated elements, and
  Arrow IPC payloads (`ipc` fields) that are garbage, cut, of the wrong schema or column
  types, dictionary-encoded, with nulls, bad offsets or invalid UTF-8.

Two more tests aim those at the existing shard, so that more of them reach the deeper
checks: Oxia writes, and Arrow rows written inline or staged and then published. Every
call carries hostile values of the metadata the servers read (wire/metadata.py), now
and then.

Oracles, after every example: the call ended with a status other than UNKNOWN or
INTERNAL (what grpc.aio answers for an exception escaping a servicer), except Oxia's own
codes, which grpcio reports as UNKNOWN (node/oxia/errors.py); nothing logged an error; neither node stopped
(`Node.wait`); a put then a get still work; and a fresh state machine per replica, fed
the entries that replica committed, applies every one without an op refused as
unappliable. After each test both replicas hold the state those fresh machines reach.

Runs: QS_FUZZ_EXAMPLES examples per test (default 20: about 30 s on two cores). A long
campaign (5.5 minutes on two cores):

    QS_FUZZ_EXAMPLES=180 PYTHONPATH=python python -m pytest -q -p no:cacheprovider \\
        tests/integration/test_grpc_fuzz.py

Examples are derandomized: the same QS_FUZZ_EXAMPLES runs the same examples again. A
failure prints the falsifying example and a `@reproduce_failure(...)` line; put that line
on the failing test's inner `fuzz` function to replay only that example.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import numpy as np
import pyarrow as pa
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leader_and_follower import leader_and_follower
from quorumstore.arrow.ipc import ipc_buffer
from quorumstore.event_loops import cancel_other_tasks, new_event_loop
from quorumstore.node.node import Node
from quorumstore.node.oxia.validation import DEFAULT_MAX_KEY_BYTES
from quorumstore.node.wal_retention import WalRetention
from quorumstore.proto import oxia_client_pb2 as opb
from quorumstore.proto import oxia_client_pb2_grpc, quorumstore_data_pb2
from quorumstore.proto import replication_pb2 as rpb
from quorumstore.protocol.types import LogEntry, LogPosition
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.wire.metadata import (
    CLIENT_ID_METADATA_KEY,
    FORWARDED_METADATA_KEY,
    LEADER_ROUTING_METADATA,
    ROUTING_METADATA_KEY,
    SERIAL_METADATA_KEY,
)
from quorumstore.wire.schemas import ROWS_SCHEMA
from quorumstore.wire.status import OxiaCode

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("QS_FUZZ_EXAMPLES", "20"))
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=EXAMPLES,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SHARD = ("default", 0)
#: A unary call, or a stream's request side, that takes longer has hung.
CALL_TIMEOUT_S = 10.0
#: How long a server stream is read: some rightly stay open (notifications, assignments).
STREAM_READ_S = 0.25
#: Responses read of a server stream before it is cancelled.
MAX_RESPONSES = 2

OXIA = opb.DESCRIPTOR.services_by_name["OxiaClient"]
DATA = quorumstore_data_pb2.DESCRIPTOR.services_by_name["QuorumstoreData"]
#: Every method of both services, by full name (what a falsifying example shows).
METHODS: dict[str, MethodDescriptor] = {
    method.full_name: method for service in (OXIA, DATA) for method in service.methods
}

#: Stands for an invalid UTF-8 sequence in a string field: `_wire` swaps its encoding for
#: a UTF-8-encoded lone surrogate of the same length, which protobuf cannot build itself.
_NOT_UTF8 = "\ue000"
_NOT_UTF8_SWAP = (_NOT_UTF8.encode(), b"\xed\xa0\x80")

_OXIA_PREFIXES = tuple(code.message_prefix for code in OxiaCode)


# ------------------------------------------------------------------ the nodes under fire


class Outcome(NamedTuple):
    """How a call ended, and what it answered (serialized)."""

    code: grpc.StatusCode
    details: str
    responses: list[bytes]


class _ErrorLog(logging.Handler):
    """What any logger reports at ERROR or above: grpc.aio logs every exception that
    escapes a servicer there, a replica its failure, asyncio a task's lost exception."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self._records: list[logging.LogRecord] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self._records.append(record)

    def take_unexpected(self) -> list[str]:
        """The records since the last call."""
        with self._lock:
            records, self._records = self._records, []
        return [self.format(record) for record in records]


class FuzzedShard:
    """`leader_and_follower` on an event loop of its own thread, both nodes routing
    clients to the leader, and the checks that the fuzzing did not harm them.

    A fresh state machine per replica (`_replays`) applies that replica's committed WAL
    entries as they come, so an entry that cannot be applied is caught in the example
    that made it.
    """

    def __init__(self, data_dir: Path) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzzed-nodes")
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self.errors = _ErrorLog()
        logging.getLogger().addHandler(self.errors)
        self.nodes: dict[str, Node] = {}
        self._stopped: list[asyncio.Future[None]] = []
        self._run(self._start(data_dir))
        self.channels = {
            name: grpc.insecure_channel(node.name) for name, node in self.nodes.items()
        }
        self._replays = {name: ShardStateMachine(MemoryKv()) for name in self.nodes}
        self._canaries = itertools.count()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    async def _start(self, data_dir: Path) -> None:
        # Every entry stays in the WAL, so that all of them can be applied again.
        nodes = leader_and_follower(
            data_dir, SHARD, wal_sync=False, wal_retention=WalRetention(keep_entries=1 << 40)
        )
        leader, follower = await self._stack.enter_async_context(nodes)
        self.nodes = {"leader": leader, "follower": follower}
        table = rpb.ShardAssignmentsUpdate(
            version=1,
            namespaces=[
                rpb.NamespaceAssignments(
                    namespace=SHARD[0],
                    shards=[
                        rpb.ShardAssignment(
                            shard=SHARD[1],
                            hash_range=rpb.HashRange(
                                min_hash_inclusive=0, max_hash_inclusive=0xFFFFFFFF
                            ),
                            term=1,
                            leader=leader.name,
                            followers=[follower.name],
                        )
                    ],
                )
            ],
        )
        for node in (leader, follower):
            node.set_assignments(table, "fuzz")
        self._stopped = [asyncio.ensure_future(node.wait()) for node in (leader, follower)]

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

        async def stop() -> None:
            for stopped in self._stopped:
                stopped.cancel()
            await self._stack.aclose()
            await cancel_other_tasks()

        try:
            self._run(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(60)
            self._loop.close()
            logging.getLogger().removeHandler(self.errors)

    # -------------------------------------------------------------- calls

    def call(
        self,
        node: str,
        method: MethodDescriptor,
        requests: Sequence[bytes],
        metadata: Sequence[tuple[str, str]] = (),
    ) -> Outcome:
        """Sends `requests` (serialized) to `method` of `node`, then checks how the call
        ended and that nothing was harmed."""
        outcome = _invoke(self.channels[node], method, requests, metadata)
        unhandled = None
        if outcome.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
            details = outcome.details
            oxia_code = method.containing_service is OXIA and details.startswith(_OXIA_PREFIXES)
            if outcome.code is grpc.StatusCode.INTERNAL or not oxia_code:
                unhandled = f"{method.full_name} on the {node} ended {outcome.code.name}: {details}"
        self.check(unhandled)
        return outcome

    def check(self, unhandled: str | None = None) -> None:
        """The call did not end `unhandled`, nothing logged an error, both nodes serve, a
        put then a get work, and every entry committed since the last check applies
        cleanly on a fresh state machine."""
        problems = [*filter(None, [unhandled]), *self.errors.take_unexpected()]
        assert not problems, "\n".join(problems)
        assert not self._run(self._failures())
        self._put_then_get()
        self._replay()

    async def _failures(self) -> list[str]:
        return [
            f"the {name} stopped: {stopped.exception() or 'its server ended'}"
            for name, stopped in zip(self.nodes, self._stopped, strict=True)
            if stopped.done()
        ]

    def _put_then_get(self) -> None:
        number = next(self._canaries)
        key, value = f"/canary/{number}", number.to_bytes(8, "big")
        stub = oxia_client_pb2_grpc.OxiaClientStub(self.channels["leader"])
        options: dict[str, Any] = {"timeout": CALL_TIMEOUT_S, "metadata": LEADER_ROUTING_METADATA}
        put = opb.PutRequest(key=key, value=value)
        written = stub.Write(opb.WriteRequest(shard=SHARD[1], puts=[put]), **options)
        assert [p.status for p in written.puts] == [opb.OK]
        get = opb.GetRequest(key=key, include_value=True)
        read = stub.Read(opb.ReadRequest(shard=SHARD[1], gets=[get]), **options)
        assert [(g.status, g.value) for r in read for g in r.gets] == [(opb.OK, value)]

    def _replay(self) -> dict[str, tuple[LogPosition, int]]:
        """Applies each replica's newly applied entries on its fresh state machine, and
        checks that none holds an op that cannot be applied; returns each replica's
        (applied position, state digest) as it was when they were read."""
        states, applied = self._run(self._applied())
        for name, entries in applied.items():
            for entry, result in zip(entries, self._replays[name].apply(entries), strict=True):
                assert result is not None and result.invalid is None, (
                    f"entry {entry.offset} committed on the {name} holds an op no replica can "
                    f"apply: {result}"
                )
        return states

    async def _applied(
        self,
    ) -> tuple[dict[str, tuple[LogPosition, int]], dict[str, list[LogEntry]]]:
        """Each replica's (applied position, state digest), and the entries it applied
        that its fresh state machine did not, all read at one moment."""
        states, applied = {}, {}
        for name, node in self.nodes.items():
            host = node.hosts[SHARD]
            position = host.machine.applied_position
            states[name] = (position, host.machine.state_digest())
            entries: list[LogEntry] = []
            replayed = self._replays[name].applied_position.offset
            while (start := replayed + len(entries) + 1) <= position.offset:
                entries.extend(host.wal.read(start, position.offset - start + 1, 64 << 20))
            applied[name] = entries
        return states, applied

    def assert_replicas_agree(self) -> None:
        """Once both replicas applied the same entries, both hold the state that their
        fresh state machines reached by applying them. Retried a while: sessions may
        expire meanwhile, and a large entry is applied off the event loop."""
        self.check()
        deadline = time.monotonic() + 30
        while True:
            states = self._replay()
            replayed = {
                name: (machine.applied_position, machine.state_digest())
                for name, machine in self._replays.items()
            }
            if states == replayed and len({position for position, _ in states.values()}) == 1:
                return
            assert time.monotonic() < deadline, (
                f"the replicas do not converge on their replayed state: {states} != {replayed}"
            )
            time.sleep(0.05)


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzedShard]:
    fuzzed = FuzzedShard(tmp_path_factory.mktemp("fuzz"))
    try:
        yield fuzzed
    finally:
        fuzzed.close()


def _invoke(
    channel: grpc.Channel,
    method: MethodDescriptor,
    requests: Sequence[bytes],
    metadata: Sequence[tuple[str, str]],
) -> Outcome:
    """Calls `method` with `requests` and responses as bytes (generic calls without
    serializers); a server stream is read for a moment."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    reads_a_while = method.server_streaming and not method.client_streaming
    deadline = STREAM_READ_S if reads_a_while else CALL_TIMEOUT_S
    options: dict[str, Any] = {"timeout": deadline, "metadata": tuple(metadata)}
    try:
        if not method.server_streaming:
            if method.client_streaming:
                response = channel.stream_unary(path)(iter(requests), **options)
            else:
                response = channel.unary_unary(path)(requests[0], **options)
            return Outcome(grpc.StatusCode.OK, "", [response])
        if method.client_streaming:
            call = channel.stream_stream(path)(iter(requests), **options)
        else:
            call = channel.unary_stream(path)(requests[0], **options)
        responses = list(itertools.islice(call, MAX_RESPONSES))
        call.cancel()  # still open after MAX_RESPONSES: ends CANCELLED
        return Outcome(call.code(), call.details() or "", responses)
    except grpc.RpcError as error:
        return Outcome(error.code(), error.details() or "", [])


# ------------------------------------------------------------------ hostile values

_MAX_KEY = DEFAULT_MAX_KEY_BYTES
#: How large a request's very long repeated field may grow (fields nest).
_MANY_BYTES = 1 << 20
#: Write ids and parts that pass StageArrow's checks, so that WriteArrow may publish them.
_WRITE_IDS = ["0" * 32, "f" * 32]
_PARTS = ["p", "part-0.1"]
_KEY_PARTS = ["", "a", "b", "é", "\x00", "\uffff", "..", "%2F"]

_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
    st.sampled_from(["", "\x00", "/", "../..", "a" + _NOT_UTF8]),
    st.sampled_from([256, 257, 4096]).map(lambda n: "x" * n),
)
#: Keys: a small space (so that versions and sequences meet), the limit's edges, garbage.
_KEYS = st.one_of(
    st.lists(st.sampled_from(_KEY_PARTS), min_size=1, max_size=4).map("/".join),
    st.sampled_from([_MAX_KEY, _MAX_KEY + 1]).map(lambda n: "k" * n),
    st.sampled_from([_MAX_KEY // 2, _MAX_KEY // 2 + 1]).map(lambda n: "é" * n),
    _TEXT,
)
#: Fields mostly set: those that name the shard a request is for, and an op's key.
_MOSTLY_SET = {"shard", "namespace", "key"}
_KEY_FIELDS = {
    "key",
    "keys",
    "start_inclusive",
    "end_exclusive",
    "min_inclusive",
    "max_exclusive",
    "replace_min_inclusive",
    "replace_max_exclusive",
    "partition_key",
    "index_name",
    "secondary_key",
    "secondary_index_name",
    "client_identity",
}
_BYTES = st.one_of(
    st.binary(max_size=32),
    st.sampled_from([1 << 10, 1 << 16, 1 << 20]).map(lambda n: b"\xff" * n),
)

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    FieldDescriptor.TYPE_FIXED64: (0, (1 << 64) - 1),
}


def _mostly(valid: Any, hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` three times in four, so that what it guards is reached, else `hostile`."""
    return st.one_of(st.just(valid), st.just(valid), st.just(valid), hostile)


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    """Any int of [low, high], often one at an edge: of the range, of 32 and 64 bits."""
    edges = {0, 1, -1, 2, low, low + 1, high - 1, high, 1 << 31, (1 << 31) - 1, (1 << 63) - 1}
    return st.one_of(
        st.sampled_from(sorted(v for v in edges if low <= v <= high)),
        st.integers(0, 8),
        st.integers(low, high),
    )


def _scalars(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """Values of one element of `field`: hostile ones, and valid ones often enough that
    the checks behind the first ones are reached."""
    name, kind = field.name, field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return _messages(field.message_type)
    if kind == FieldDescriptor.TYPE_ENUM:
        known = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(known), _integers(-(1 << 31), (1 << 31) - 1))
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=64 if kind == FieldDescriptor.TYPE_DOUBLE else 32)
    if kind == FieldDescriptor.TYPE_BYTES:
        return _arrow_payloads() if name == "ipc" else _BYTES
    if kind == FieldDescriptor.TYPE_STRING:
        if name == "namespace":
            return _mostly(SHARD[0], _TEXT)
        if name == "write_id":
            return st.one_of(st.sampled_from(_WRITE_IDS), _TEXT)
        if name == "part":
            return st.one_of(st.sampled_from(_PARTS), _TEXT)
        return _KEYS if name in _KEY_FIELDS else _TEXT
    integers = _integers(*_INT_RANGES[kind])
    if name == "shard":
        return _mostly(SHARD[1], integers)
    if name == "session_timeout_ms":
        return st.one_of(st.integers(2_000, 300_000), integers)
    return integers


def _values(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """The value of `field`: one element, or a list of them (a few, or very many)."""
    element = _scalars(field)
    if not field.is_repeated:
        return element
    return st.one_of(
        st.lists(element, max_size=4),
        st.tuples(element, st.sampled_from([64, 1024])).map(lambda made: _many(*made)),
    )


def _many(element: Any, count: int) -> list[Any]:
    """`count` copies of `element`, fewer if they would take more than `_MANY_BYTES`."""
    if isinstance(element, Message):
        size = element.ByteSize()
    elif isinstance(element, str | bytes):
        size = len(element)
    else:
        size = 8
    return [element] * max(1, min(count, _MANY_BYTES // max(size, 1)))


def _set(message: Message, field: FieldDescriptor, value: Any) -> None:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entries = getattr(message, field.name)
        for entry in value:
            if field.message_type.fields_by_name["value"].message_type is None:
                entries[entry.key] = entry.value
            else:
                entries[entry.key].CopyFrom(entry.value)
    elif field.is_repeated:
        getattr(message, field.name).extend(value)
    elif field.message_type is not None:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


@functools.cache
def _messages(descriptor: Descriptor) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`: each oneof unset or set to one of its fields, each other
    field set or not (a proto3 `optional` field is a oneof of its own), `_MOSTLY_SET`
    mostly, so that requests get past routing and key checks."""
    message_class = message_factory.GetMessageClass(descriptor)
    in_oneofs = {field.name for oneof in descriptor.oneofs for field in oneof.fields}
    loose = [field for field in descriptor.fields if field.name not in in_oneofs]

    def present(field: FieldDescriptor) -> st.SearchStrategy[bool]:
        return _mostly(True, st.just(False)) if field.name in _MOSTLY_SET else st.booleans()

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = message_class()
        fields = [f for f in loose if draw(present(f))]
        for oneof in descriptor.oneofs:
            if len(oneof.fields) == 1:
                fields += [f for f in oneof.fields if draw(present(f))]
            elif (chosen := draw(st.sampled_from([None, *oneof.fields]))) is not None:
                fields.append(chosen)
        for field in fields:
            _set(message, field, draw(_values(field)))
        return message

    return build()


def _wire(message: Message) -> bytes:
    """`message` serialized, with invalid UTF-8 where its strings hold `_NOT_UTF8`."""
    return message.SerializeToString().replace(*_NOT_UTF8_SWAP)


@st.composite
def _mangled(draw: st.DrawFn, data: st.SearchStrategy[bytes]) -> bytes:
    """Bytes of `data`, then cut, with bytes flipped, inserted or appended."""
    mangled = bytearray(draw(data))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(mangled)))
        action = draw(st.sampled_from(["cut", "flip", "insert", "append"]))
        if action == "cut":
            del mangled[at:]
        elif action == "flip" and at < len(mangled):
            mangled[at] ^= draw(st.integers(1, 255))
        elif action == "insert":
            mangled[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            mangled += draw(st.binary(min_size=1, max_size=16))
    return bytes(mangled)


# ------------------------------------------------------------------ hostile Arrow

#: Column types a client might send instead of ROWS_SCHEMA's, with their values.
_COLUMNS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "string": (pa.string(), _KEYS),
    "large_string": (pa.large_string(), _TEXT),
    "string_view": (pa.string_view(), _TEXT),
    "binary": (pa.binary(), _BYTES),
    "large_binary": (pa.large_binary(), _BYTES),
    "binary_view": (pa.binary_view(), st.binary(max_size=8)),
    "fixed_size_binary": (pa.binary(3), st.binary(min_size=3, max_size=3)),
    "int64": (pa.int64(), _integers(-(1 << 63), (1 << 63) - 1)),
    "bool": (pa.bool_(), st.booleans()),
    "null": (pa.null(), st.none()),
    "list<string>": (pa.list_(pa.string()), st.lists(_TEXT, max_size=2)),
    "struct": (pa.struct([("key", pa.string())]), st.fixed_dictionaries({"key": _TEXT})),
}


@st.composite
def _column(draw: st.DrawFn, kind: str, rows: int) -> pa.Array:
    """A column of `kind`, maybe with nulls, maybe dictionary-encoded."""
    arrow_type, values = _COLUMNS[kind]
    nulls = draw(st.booleans())
    items = [None if nulls and draw(st.booleans()) else draw(values) for _ in range(rows)]
    column = pa.array(items, arrow_type)
    if draw(st.booleans()) and kind in ("string", "binary", "large_string", "int64"):
        column = column.dictionary_encode()
    return column


@st.composite
def _tables(draw: st.DrawFn) -> pa.Table:
    """Rows as a client should send them (ROWS_SCHEMA) or could: with nulls, other types
    (dictionaries among them), other, duplicated or missing columns, keys that are not
    UTF-8 or whose offsets go backwards."""
    rows = draw(st.integers(0, 6))
    shape = draw(st.sampled_from(["rows", "nulls", "types", "columns", "not-utf8", "offsets"]))
    if shape in ("rows", "nulls"):
        keys: list[str | None] = draw(st.lists(_KEYS, min_size=rows, max_size=rows))
        values: list[bytes | None] = draw(st.lists(_BYTES, min_size=rows, max_size=rows))
        if shape == "nulls":
            keys = [None if draw(st.booleans()) else key for key in keys]
            values = [None if draw(st.booleans()) else value for value in values]
        return pa.table([pa.array(keys, pa.string()), pa.array(values)], names=ROWS_SCHEMA.names)
    if shape in ("types", "columns"):
        names = (
            ROWS_SCHEMA.names
            if shape == "types"
            else draw(st.lists(st.sampled_from(["key", "value", "other"]), max_size=4))
        )
        kinds = [draw(st.sampled_from(sorted(_COLUMNS))) for _ in names]
        return pa.table([draw(_column(kind, rows)) for kind in kinds], names=names)
    values = pa.array([b"v"] * rows, pa.binary())
    if shape == "not-utf8":
        raw = draw(st.lists(st.binary(min_size=1, max_size=6), min_size=rows, max_size=rows))
        keys = pa.array(raw, pa.binary()).view(pa.string())
    else:  # within the data buffer, so that Arrow writes it; only validation sees it
        data = draw(st.binary(min_size=1, max_size=12))
        inner = draw(
            st.lists(
                st.integers(0, len(data)), min_size=max(rows - 1, 0), max_size=max(rows - 1, 0)
            )
        )
        offsets = np.array([0, *inner, len(data)] if rows else [0], np.int32)
        keys = pa.Array.from_buffers(
            pa.string(), rows, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
        )
    return pa.Table.from_arrays([keys, values], schema=ROWS_SCHEMA)


@st.composite
def _ipc_streams(draw: st.DrawFn) -> bytes:
    """An IPC stream of a table from `_tables`, in one batch or several, maybe compressed."""
    table = draw(_tables())
    compression = draw(st.sampled_from([None, "lz4", "zstd"]))
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=draw(st.sampled_from([None, 1, 2])))
    return sink.getvalue().to_pybytes()


def _arrow_payloads() -> st.SearchStrategy[bytes]:
    """What an `ipc` field may hold: mostly streams of `_ipc_streams`, else those
    mangled, two in a row, an IPC file, an empty stream, garbage."""
    rows = ROWS_SCHEMA.empty_table()
    streams = _ipc_streams()
    return st.one_of(
        streams,
        streams,
        streams,
        _mangled(streams),
        st.tuples(streams, streams).map(b"".join),
        st.sampled_from([_ipc_file(rows), ipc_buffer(rows).to_pybytes()]),
        st.binary(max_size=64),
    )


def _ipc_file(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


# ------------------------------------------------------------------ hostile metadata

_HEADER_VALUES = st.one_of(
    st.sampled_from(
        ["", "0", "1", "-1", "leader", "gateway", "Leader", str((1 << 63) - 1), str(1 << 63)]
    ),
    st.sampled_from(["9" * 40, "1_000", "+1", " 1", "0x10", "x" * 300]),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24),
)
#: Mostly none, so that calls get past the metadata checks to the others.
_METADATA = _mostly(
    [],
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    CLIENT_ID_METADATA_KEY,
                    SERIAL_METADATA_KEY,
                    ROUTING_METADATA_KEY,
                    FORWARDED_METADATA_KEY,
                ]
            ),
            _HEADER_VALUES,
        ),
        min_size=1,
        max_size=4,
    ),
)
_NODES = st.sampled_from(["leader", "follower"])


def _requests(method: MethodDescriptor, request: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """What one call of `method` sends: one request, or a stream of several."""
    return st.lists(request, min_size=1, max_size=4 if method.client_streaming else 1)


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("name", sorted(METHODS))
def test_raw_bytes_never_crash_a_server(shard: FuzzedShard, name: str) -> None:
    """Bytes that are mostly no request of the method at all: gRPC's parsing, and what
    the servers make of the few that parse after all."""
    method = METHODS[name]
    garbage = st.one_of(st.binary(max_size=48), _mangled(_messages(method.input_type).map(_wire)))

    @FUZZ
    @given(_requests(method, garbage), _NODES, _METADATA)
    def fuzz(requests: list[bytes], node: str, metadata: list[tuple[str, str]]) -> None:
        shard.call(node, method, requests, metadata)

    fuzz()
    shard.assert_replicas_agree()


@pytest.mark.parametrize("name", sorted(METHODS))
def test_hostile_messages_never_crash_a_server(shard: FuzzedShard, name: str) -> None:
    """Requests that parse, with hostile values in any of their fields."""
    method = METHODS[name]

    @FUZZ
    @given(_requests(method, _messages(method.input_type)), _NODES, _METADATA)
    def fuzz(messages: list[Message], node: str, metadata: list[tuple[str, str]]) -> None:
        shard.call(node, method, [_wire(message) for message in messages], metadata)

    fuzz()
    shard.assert_replicas_agree()


def test_hostile_arrow_rows_never_crash_a_server(shard: FuzzedShard) -> None:
    """Arrow payloads for the existing shard's leader, so that each reaches the checks
    of its rows: written inline, or staged (under a new write id) and then published."""
    stage = METHODS["quorumstore.data.v1.QuorumstoreData.StageArrow"]
    write = METHODS["quorumstore.data.v1.QuorumstoreData.WriteArrow"]
    write_ids = itertools.count(1)

    @FUZZ
    @given(_arrow_payloads(), st.booleans(), st.booleans(), _METADATA)
    def fuzz(ipc: bytes, staged: bool, unique_keys: bool, metadata: list[tuple[str, str]]) -> None:
        namespace, number = SHARD
        request = quorumstore_data_pb2.WriteArrowRequest(
            namespace=namespace, shard=number, unique_keys=unique_keys
        )
        if staged:
            write_id, part = f"{next(write_ids):032x}", _PARTS[0]
            staging = quorumstore_data_pb2.StageArrowRequest(
                namespace=namespace, shard=number, write_id=write_id, part=part, chunk=0, ipc=ipc
            )
            staged_rows = shard.call("leader", stage, [staging.SerializeToString()], metadata)
            rows = sum(
                quorumstore_data_pb2.StageArrowResponse.FromString(response).rows
                for response in staged_rows.responses
            )
            request.staged.write_id = write_id
            request.staged.parts.add(part=part, chunks=1, rows=rows)
        else:
            request.ipc = ipc
        shard.call("leader", write, [request.SerializeToString()], metadata)

    fuzz()
    shard.assert_replicas_agree()


@pytest.mark.parametrize("name", ["Write", "WriteStream"])
def test_hostile_oxia_writes_never_crash_a_server(shard: FuzzedShard, name: str) -> None:
    """Writes for the existing shard, so that each reaches the checks of its ops (and,
    from the follower, the relay), then the apply on both replicas."""
    method = METHODS[f"{OXIA.full_name}.{name}"]

    @FUZZ
    @given(_requests(method, _messages(opb.WriteRequest.DESCRIPTOR)), _NODES, _METADATA)
    def fuzz(requests: list[opb.WriteRequest], node: str, metadata: list[tuple[str, str]]) -> None:
        for request in requests:
            request.shard = SHARD[1]
        shard.call(node, method, [_wire(request) for request in requests], metadata)

    fuzz()
    shard.assert_replicas_agree()


# ------------------------------------------------------------------ what fuzzing found


def _rows_with_columns(*names: str) -> bytes:
    columns = {"key": pa.array(["/k"]), "value": pa.array([b"v"]), "other": pa.array([1])}
    return ipc_buffer(pa.table([columns[name] for name in names], names=list(names))).to_pybytes()


@pytest.mark.parametrize(
    "method,request_,code,details",
    [
        (
            "quorumstore.data.v1.QuorumstoreData.WriteArrow",
            quorumstore_data_pb2.WriteArrowRequest(
                namespace=SHARD[0], shard=SHARD[1], ipc=_rows_with_columns("key", "value", "key")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "the rows has more than one column named ['key']",
        ),
        (
            "quorumstore.data.v1.QuorumstoreData.StageArrow",
            quorumstore_data_pb2.StageArrowRequest(
                namespace=SHARD[0],
                shard=SHARD[1],
                write_id="e" * 32,
                part="p",
                ipc=_rows_with_columns("value", "key", "other", "value"),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "the staged rows has more than one column named ['value']",
        ),
        (
            "io.streamnative.oxia.proto.OxiaClient.CloseSession",
            opb.CloseSessionRequest(shard=SHARD[1], session_id=(1 << 63) - 1),
            grpc.StatusCode.UNKNOWN,  # Oxia's code 108, as grpcio reports it
            f"oxia: session not found: {(1 << 63) - 1} on shard {SHARD[1]}",
        ),
        (
            "quorumstore.data.v1.QuorumstoreData.WriteArrow",
            quorumstore_data_pb2.WriteArrowRequest(
                namespace=SHARD[0],
                shard=SHARD[1],
                ipc=_rows_with_columns("key", "value"),
                has_serial=True,
                client_id="c" * 100_000,
                serial=1,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "client_id is 100000 bytes; at most 256 are kept per client",
        ),
    ],
    ids=["key-column-twice", "value-column-twice", "close-largest-session-id", "huge-client-id"],
)
def test_what_fuzzing_found_is_refused_cleanly(
    shard: FuzzedShard, method: str, request_: Message, code: grpc.StatusCode, details: str
) -> None:
    """Each of these ended UNKNOWN (an exception escaped the data servicer), committed an
    entry whose op the apply refused as unappliable, or (a 100 KB client id) was kept
    as it came; `call` checks the first two."""
    outcome = shard.call("leader", METHODS[method], [request_.SerializeToString()])
    assert (outcome.code, outcome.details) == (code, details)


def test_a_request_that_cannot_be_parsed_is_an_invalid_argument(shard: FuzzedShard) -> None:
    codes = {name: shard.call("leader", method, [b"\xff"]).code for name, method in METHODS.items()}
    assert set(codes.values()) == {grpc.StatusCode.INVALID_ARGUMENT}, codes
