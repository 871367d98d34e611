"""The Arrow form of one client write batch, which is also one WAL entry's payload.

A batch is a single Arrow record batch, one row per operation, applied in row order,
IPC-stream encoded. The leader stamps it with its wall clock (`timestamp_ms` in the
schema metadata) when it builds it: replicas derive record timestamps from the entry,
never from their own clocks, so every replica computes identical records.

A write too large for one entry travels as several (`storage/staging.py`): PIECES,
each a batch of puts marked `stage=<stage id>` that every replica keeps aside, unapplied,
then ONE small entry marked `publish=<stage id>` whose apply applies its own ops followed
by all the pieces' puts, atomically. `discard=<write id>` drops pieces never published.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Concatenate, NamedTuple, ParamSpec, TypeVar, cast

import pyarrow as pa

from quorumstore.arrow.ipc import NotIpcStream, ipc_batches, ipc_bytes
from quorumstore.wire.metadata import ClientSerial

#: Schema metadata key holding the leader's wall clock, in ms, as a decimal string.
TIMESTAMP_KEY = b"timestamp_ms"
#: Schema metadata keys of an exactly-once write: the client's id and its serial
#: (docs/protocol.md, "Exactly-once serials").
CLIENT_ID_KEY = b"client_id"
SERIAL_KEY = b"serial"
#: Schema metadata keys of staged writes (see the module docstring and `Staging`).
STAGE_KEY = b"stage"
PIECE_KEY = b"piece"
PUBLISH_KEY = b"publish"
PIECES_KEY = b"pieces"
DISCARD_KEY = b"discard"
#: `expected_version_id` meaning "the key must not exist".
VERSION_ID_NOT_EXISTS = -1


class Op(enum.IntEnum):
    """Operation of one row (the `op` column)."""

    PUT = 0
    DELETE = 1
    DELETE_RANGE = 2
    #: A session with `session_timeout_ms` and `client_identity`; the shard assigns its id.
    CREATE_SESSION = 3
    #: Ends session `session_id`: its ephemeral records are deleted with it.
    CLOSE_SESSION = 4


SECONDARY_INDEX = pa.struct(
    [
        pa.field("index_name", pa.string(), nullable=False),
        pa.field("secondary_key", pa.string(), nullable=False),
    ]
)


SCHEMA = pa.schema(
    [
        pa.field("op", pa.int8(), nullable=False),
        # For DELETE_RANGE: the inclusive start.
        pa.field("key", pa.string(), nullable=False),
        # DELETE_RANGE's exclusive end; null or "" means unbounded, as for a list.
        pa.field("end_key", pa.string()),
        pa.field("value", pa.binary()),
        # Null: unconditional; VERSION_ID_NOT_EXISTS: the key must be absent.
        pa.field("expected_version_id", pa.int64()),
        pa.field("session_id", pa.int64()),
        pa.field("client_identity", pa.string()),
        pa.field("partition_key", pa.string()),
        # A PUT with deltas writes `key` + one "-%020d" suffix per delta, chosen at apply time.
        pa.field("sequence_key_delta", pa.list_(pa.uint64())),
        pa.field("secondary_indexes", pa.list_(SECONDARY_INDEX)),
        pa.field("session_timeout_ms", pa.int64()),
    ]
)


#: Batches up to this many rows share their all-null and op columns (`_shared_when_small`;
#: at most ~3 MB cached).
_SHARED_COLUMNS_MAX_ROWS = 1024

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _shared_when_small(
    maxsize: int,
) -> Callable[[Callable[Concatenate[int, _P], _T]], Callable[Concatenate[int, _P], _T]]:
    """Makes `make(rows, ...)` hand out one shared result per arguments for batches of at
    most `_SHARED_COLUMNS_MAX_ROWS` rows (Arrow arrays are immutable), a new one for larger."""

    def wrap(make: Callable[Concatenate[int, _P], _T]) -> Callable[Concatenate[int, _P], _T]:
        shared = cast(Callable[Concatenate[int, _P], _T], functools.lru_cache(maxsize)(make))

        @functools.wraps(make)
        def made(rows: int, *args: _P.args, **kwargs: _P.kwargs) -> _T:
            return (shared if rows <= _SHARED_COLUMNS_MAX_ROWS else make)(rows, *args, **kwargs)

        return made

    return wrap


@_shared_when_small(maxsize=64 * len(SCHEMA))
def _null_column(rows: int, type: pa.DataType) -> pa.Array:
    """An all-null column, `rows` long. Small batches, where making them was a sixth of
    building a batch of puts, share them."""
    return pa.nulls(rows, type)


class StagingKind(enum.Enum):
    PIECE = "piece"
    PUBLISH = "publish"
    DISCARD = "discard"


class Staging(NamedTuple):
    """What a staged-write entry does: keep piece `number` of stage `name` (PIECE),
    apply the `number` pieces of stage `name` (PUBLISH), or drop every stage of the
    write `name` (DISCARD)."""

    kind: StagingKind
    name: str
    number: int = 0

    def metadata(self) -> dict[bytes, bytes]:
        name = self.name.encode()
        if self.kind is StagingKind.PIECE:
            return {STAGE_KEY: name, PIECE_KEY: str(self.number).encode()}
        if self.kind is StagingKind.PUBLISH:
            return {PUBLISH_KEY: name, PIECES_KEY: str(self.number).encode()}
        return {DISCARD_KEY: name}


class InvalidBatchError(ValueError):
    """A payload that is not a write batch the apply can read. Its message is made from
    the payload alone, in quorumstore's words, so every replica words it alike."""


def _text(metadata: dict[bytes, bytes], key: bytes) -> str:
    raw = metadata.get(key)
    if raw is None:
        raise InvalidBatchError(f"write batch has no {key.decode()} metadata")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise InvalidBatchError(
            f"write batch metadata {key.decode()!r} is not valid UTF-8"
        ) from None


def _number(metadata: dict[bytes, bytes], key: bytes, limit: int) -> int:
    """A decimal metadata value in [0, limit)."""
    text = _text(metadata, key)
    if not (text.isascii() and text.isdigit()) or int(text) >= limit:
        raise InvalidBatchError(
            f"write batch metadata {key.decode()!r} is {text!r}, not a decimal in [0, {limit})"
        )
    return int(text)


#: Bounds of the numbers an entry's metadata carries: serials and timestamps are int64,
#: piece numbers 4 bytes of a piece's key.
_INT64_LIMIT = 1 << 63
_PIECES_LIMIT = 1 << 32


def batch_staging(batch: pa.RecordBatch) -> Staging | None:
    """The staged-write role of an entry's batch; None for an ordinary write."""
    metadata = batch.schema.metadata or {}
    if STAGE_KEY in metadata:
        return Staging(
            StagingKind.PIECE,
            _text(metadata, STAGE_KEY),
            _number(metadata, PIECE_KEY, _PIECES_LIMIT),
        )
    if PUBLISH_KEY in metadata:
        return Staging(
            StagingKind.PUBLISH,
            _text(metadata, PUBLISH_KEY),
            _number(metadata, PIECES_KEY, _PIECES_LIMIT),
        )
    if DISCARD_KEY in metadata:
        return Staging(StagingKind.DISCARD, _text(metadata, DISCARD_KEY))
    return None


def _with_timestamp(
    timestamp_ms: int, origin: ClientSerial | None = None, staging: Staging | None = None
) -> pa.Schema:
    metadata = {TIMESTAMP_KEY: str(int(timestamp_ms)).encode()}
    if staging is not None:
        metadata.update(staging.metadata())
    if origin is not None:
        if not origin.client_id or origin.serial < 0:
            raise ValueError(
                f"an exactly-once write needs a client id and a serial >= 0, got {origin}"
            )
        metadata[CLIENT_ID_KEY] = origin.client_id.encode()
        metadata[SERIAL_KEY] = str(int(origin.serial)).encode()
    return SCHEMA.with_metadata(metadata)


def batch_origin(batch: pa.RecordBatch) -> ClientSerial | None:
    """The (client id, serial) an exactly-once write carries, if any."""
    metadata = batch.schema.metadata or {}
    if CLIENT_ID_KEY not in metadata:
        return None
    client_id = _text(metadata, CLIENT_ID_KEY)
    if not client_id:
        raise InvalidBatchError("write batch metadata 'client_id' is empty")
    return ClientSerial(client_id, _number(metadata, SERIAL_KEY, _INT64_LIMIT))


#: Columns that must hold no nulls; listed once, as iterating a schema builds its fields.
_NOT_NULL = [field.name for field in SCHEMA if not field.nullable]


def _binary(type: pa.DataType) -> pa.DataType:
    """`type` with every string in it a binary and every field nullable: the same
    buffers, read without UTF-8, whatever nulls they hold."""
    if type == pa.string():
        return pa.binary()
    if pa.types.is_list(type):
        return pa.list_(type.value_field.with_type(_binary(type.value_type)).with_nullable(True))
    if pa.types.is_struct(type):
        return pa.struct([f.with_type(_binary(f.type)).with_nullable(True) for f in type])
    return type


#: The binary view of each SCHEMA column that holds strings (`utf8_valid`).
BINARY_TYPES = {
    field.name: _binary(field.type) for field in SCHEMA if _binary(field.type) != field.type
}


def _check(batch: pa.RecordBatch, *, utf8: bool) -> None:
    """What every write batch is: SCHEMA, no nulls where SCHEMA has none, sound Arrow
    buffers, valid metadata; and, if `utf8`, valid UTF-8 in every string (the apply
    refuses the ops of a decoded batch whose strings are not, one by one)."""
    if not batch.schema.equals(SCHEMA):
        raise InvalidBatchError(f"write batch schema mismatch; expected:\n{SCHEMA}")
    for name in _NOT_NULL:
        if batch.column(name).null_count:
            raise InvalidBatchError(f"write batch column {name!r} holds nulls")
    if not utf8_valid(batch):
        if utf8:
            raise InvalidBatchError("write batch holds a string that is not valid UTF-8")
        binary = [
            batch.column(i).view(BINARY_TYPES[name]) if name in BINARY_TYPES else batch.column(i)
            for i, name in enumerate(batch.schema.names)
        ]
        try:
            pa.RecordBatch.from_arrays(binary, names=batch.schema.names).validate(full=True)
        except pa.ArrowInvalid:
            raise InvalidBatchError("write batch has malformed Arrow buffers") from None
    batch_timestamp_ms(batch)
    batch_staging(batch)
    batch_origin(batch)


def utf8_valid(batch: pa.RecordBatch) -> bool:
    """Whether `batch` passes Arrow's full validation, UTF-8 of every string included."""
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """IPC-stream bytes of `batch`, which must have SCHEMA and a timestamp and be fully
    valid Arrow data; raises InvalidBatchError otherwise."""
    _check(batch, utf8=True)
    return ipc_bytes(batch)


def decode_batch(data: bytes) -> pa.RecordBatch:
    """The record batch of a WAL entry payload; raises InvalidBatchError if it is not one.
    Its strings may still be invalid UTF-8 (`utf8_valid`): the apply refuses those ops."""
    try:
        batches = ipc_batches(data)
    except NotIpcStream:
        raise InvalidBatchError("write batch is not an Arrow IPC stream") from None
    if len(batches) != 1:
        raise InvalidBatchError(f"write batch holds {len(batches)} record batches, expected 1")
    _check(batches[0], utf8=False)
    return batches[0]


def batch_timestamp_ms(batch: pa.RecordBatch) -> int:
    """The leader's wall clock recorded in the batch."""
    return _number(batch.schema.metadata or {}, TIMESTAMP_KEY, _INT64_LIMIT)


class WriteBatchBuilder:
    """Accumulates operations row by row; `build` turns them into an entry payload."""

    def __init__(self) -> None:
        #: One tuple per op, in SCHEMA's column order; `build` transposes them.
        self._rows: list[tuple] = []

    def __len__(self) -> int:
        return len(self._rows)

    def _add(
        self,
        op: Op,
        key: str,
        *,
        end_key: str | None = None,
        value: bytes | None = None,
        expected_version_id: int | None = None,
        session_id: int | None = None,
        client_identity: str | None = None,
        partition_key: str | None = None,
        sequence_key_delta: list[int] | None = None,
        secondary_indexes: list[tuple[str, str]] | None = None,
        session_timeout_ms: int | None = None,
    ) -> None:
        indexes = None
        if secondary_indexes:
            indexes = [{"index_name": n, "secondary_key": k} for n, k in secondary_indexes]
        self._rows.append(
            (
                op,
                key,
                end_key,
                value,
                expected_version_id,
                session_id,
                client_identity,
                partition_key,
                sequence_key_delta or None,
                indexes,
                session_timeout_ms,
            )
        )

    def add_put(
        self,
        key: str,
        value: bytes,
        expected_version_id: int | None = None,
        session_id: int | None = None,
        client_identity: str | None = None,
        partition_key: str | None = None,
        sequence_key_delta: list[int] | None = None,
        secondary_indexes: list[tuple[str, str]] | None = None,
    ) -> None:
        """A put; with `sequence_key_delta`, `key` is the prefix of a server-assigned key."""
        self._add(
            Op.PUT,
            key,
            value=value,
            expected_version_id=expected_version_id,
            session_id=session_id,
            client_identity=client_identity,
            partition_key=partition_key,
            sequence_key_delta=sequence_key_delta,
            secondary_indexes=secondary_indexes,
        )

    def add_delete(self, key: str, expected_version_id: int | None = None) -> None:
        self._add(Op.DELETE, key, expected_version_id=expected_version_id)

    def add_delete_range(self, start_inclusive: str, end_exclusive: str) -> None:
        self._add(Op.DELETE_RANGE, start_inclusive, end_key=end_exclusive)

    def add_create_session(self, timeout_ms: int, client_identity: str) -> None:
        self._add(
            Op.CREATE_SESSION, "", session_timeout_ms=timeout_ms, client_identity=client_identity
        )

    def add_close_session(self, session_id: int) -> None:
        self._add(Op.CLOSE_SESSION, "", session_id=session_id)

    def build(
        self,
        timestamp_ms: int,
        origin: ClientSerial | None = None,
        staging: Staging | None = None,
    ) -> bytes:
        n = len(self._rows)
        columns = zip(*self._rows) if n else ([] for _ in SCHEMA)
        arrays = [
            _null_column(n, field.type) if column.count(None) == n else pa.array(column, field.type)
            for column, field in zip(columns, SCHEMA)
        ]
        return encode_batch(
            pa.RecordBatch.from_arrays(
                arrays, schema=_with_timestamp(timestamp_ms, origin, staging)
            )
        )


_OP_COLUMN, _KEY_COLUMN, _VALUE_COLUMN = map(SCHEMA.get_field_index, ("op", "key", "value"))


@_shared_when_small(maxsize=64)
def _puts_columns(rows: int) -> tuple[pa.Array | None, ...]:
    """SCHEMA's columns of `rows` puts that set nothing beyond key and value, but for the
    key and value columns themselves (None), which the caller fills in. Small batches
    share them: building them was about a fifth of encoding a batch of 64 puts."""
    columns: list[pa.Array | None] = [_null_column(rows, field.type) for field in SCHEMA]
    columns[_OP_COLUMN] = pa.repeat(pa.scalar(Op.PUT.value, pa.int8()), rows)
    columns[_KEY_COLUMN] = columns[_VALUE_COLUMN] = None
    return tuple(columns)


def puts_batch(
    keys: pa.Array,
    values: pa.Array,
    timestamp_ms: int,
    origin: ClientSerial | None = None,
    staging: Staging | None = None,
) -> bytes:
    """Payload of unconditional puts straight from Arrow arrays (no Python per key)."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values")
    n = len(keys)
    arrays = list(_puts_columns(n))
    arrays[_KEY_COLUMN] = keys if keys.type == pa.string() else keys.cast(pa.string())
    arrays[_VALUE_COLUMN] = values if values.type == pa.binary() else values.cast(pa.binary())
    return encode_batch(
        pa.RecordBatch.from_arrays(arrays, schema=_with_timestamp(timestamp_ms, origin, staging))
    )
