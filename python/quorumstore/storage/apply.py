"""The per-op apply: an entry's ops applied one by one, in order, to the KV as the
entry found it, without writing it.

Semantics follow Oxia's server (db.go): version ids come from a per-shard counter
bumped by every successful put, the creation time survives overwrites, a version
check against an absent key fails unless it expects absence (-1), and ops in one
batch see the effects of the ops before them. The outcome is one KV write, which
the state machine makes atomically with the entry's position.

The apply is total: an op it cannot apply (an unknown op code, a string that is not
UTF-8, a null inside a sequence's deltas or an index pair, a close without a session
id) gets INVALID_OP and changes nothing, the same on every replica, and the
entry's other ops apply as usual. The write paths refuse such ops before proposing
them, so only a buggy or older leader's entries hold them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa

from quorumstore.storage import change_log, secondary_indexes, sequences, sessions
from quorumstore.storage.kv import KvReader, KvWrite
from quorumstore.storage.overlay import InternalOverlay
from quorumstore.storage.records import HAS_INDEXES, HEADER, Record, encode_record_head
from quorumstore.storage.results import (
    INVALID_OP,
    KEY_NOT_FOUND,
    OK,
    SESSION_DOES_NOT_EXIST,
    UNEXPECTED_VERSION_ID,
    OpResult,
    Status,
)
from quorumstore.storage.write_batch import BINARY_TYPES, VERSION_ID_NOT_EXISTS, Op
from quorumstore.wire.keys import USER_KEYS_END, encode_key, encode_key_list

#: The op code an op whose strings are not UTF-8 is applied as: none, so INVALID_OP.
_NOT_UTF8 = -1
#: Session ids run from 1 up; closing one scans the ids below the next, so the largest
#: int64 is no session's: closing it finds no session, as for any id never assigned
#: (a client may send any int64).
_MAX_SESSION_ID = (1 << 63) - 2
_PUT, _DELETE, _DELETE_RANGE = Op.PUT.value, Op.DELETE.value, Op.DELETE_RANGE.value
_CREATE_SESSION, _CLOSE_SESSION = Op.CREATE_SESSION.value, Op.CLOSE_SESSION.value


class OpsApply(NamedTuple):
    """An entry's ops applied: what the state machine writes and answers."""

    #: Puts, deletes and delete ranges of user keys and of the internal keys behind
    #: sessions, secondary indexes and sequences.
    write: KvWrite
    #: The entry's change-log batch (None: nothing changed).
    changes: pa.RecordBatch | None
    results: list[OpResult]
    #: Encoded head of each record put, by id(record), for `encode_results`.
    heads: dict[int, bytes]
    next_version_id: int
    #: Which op could not be applied and why (`EntryResult.invalid`); None: every op could.
    invalid: str | None


#: The batch columns an op's row holds, in order, after the op and its encoded key.
_COLUMNS = (
    "key",
    "end_key",
    "value",
    "expected_version_id",
    "session_id",
    "client_identity",
    "partition_key",
    "sequence_key_delta",
    "secondary_indexes",
    "session_timeout_ms",
)
#: One op: (op, encoded key, *_COLUMNS). A plain tuple that each handler unpacks into
#: the names it reads, which costs far less per op than a NamedTuple and its attribute
#: reads.
_Row = tuple[Any, ...]


def apply_ops(
    store: KvReader,
    batch: pa.RecordBatch,
    now: int,
    next_version_id: int,
    utf8_valid: bool,
) -> OpsApply:
    """Applies the ops of `batch` (an entry timestamped `now`) in order, on `store` as
    it is, with version ids from `next_version_id` on. Unless `utf8_valid` (the batch
    passed Arrow's full validation), its strings are decoded one by one and an op
    holding one that is not UTF-8 gets INVALID_OP."""
    if utf8_valid:
        columns = batch.to_pydict()
        keys = encode_key_list(batch.column("key"))
        not_utf8: dict[int, str] = {}
    else:
        columns, not_utf8 = _decoded_columns(batch)
        keys = [encode_key(key) for key in columns["key"]]
    ops = columns["op"]
    entry = _EntryOps(store, ops, keys, now, next_version_id)
    rows = zip(ops, keys, *(columns[name] for name in _COLUMNS))
    results = [_HANDLERS.get(row[0], _EntryOps.invalid)(entry, row) for row in rows]
    invalid = None
    if entry.invalid_ops:
        at = next(i for i, r in enumerate(results) if r.status is Status.INVALID_OP)
        reason = not_utf8.get(at) or _reason(ops[at], *(columns[name][at] for name in _COLUMNS))
        invalid = f"op {at} cannot be applied: {reason}"
    return entry.outcome(results, invalid)


def _decoded(value: Any) -> Any:
    """A binary view's Python value with its bytes decoded as UTF-8 (which may raise)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    if isinstance(value, dict):
        return {name: _decoded(v) for name, v in value.items()}
    return value


def _decoded_columns(batch: pa.RecordBatch) -> tuple[dict[str, list[Any]], dict[int, str]]:
    """`batch.to_pydict()` for a batch whose strings are not all UTF-8: each row holding
    one that is not gets op `_NOT_UTF8`, and the strings of that row's column None."""
    columns: dict[str, list[Any]] = {}
    not_utf8: dict[int, str] = {}
    for name in batch.schema.names:
        column = batch.column(name)
        if name not in BINARY_TYPES:
            columns[name] = column.to_pylist()
            continue
        values = column.view(BINARY_TYPES[name]).to_pylist()
        for i, value in enumerate(values):
            try:
                values[i] = _decoded(value)
            except UnicodeDecodeError:
                values[i] = None
                not_utf8.setdefault(i, f"{name} is not valid UTF-8")
        columns[name] = values
    ops = columns["op"]
    for i in not_utf8:
        ops[i] = _NOT_UTF8
    columns["key"] = ["" if key is None else key for key in columns["key"]]
    return columns, not_utf8


def _reason(op: int, *fields: Any) -> str:
    """Why `_EntryOps` gave an op of these `_COLUMNS` INVALID_OP."""
    named = dict(zip(_COLUMNS, fields))
    if op not in _HANDLERS:
        return f"op code {op} is unknown"
    if op == _CLOSE_SESSION:
        return f"session_id {named['session_id']} is no session's"
    if None in (named["sequence_key_delta"] or ()):
        return "sequence_key_delta holds a null"
    return "secondary_indexes holds a null"


def _pairs(indexes: list[dict[str, str | None] | None]) -> list[tuple[str, str]] | None:
    """The (index name, secondary key) pairs of a put; None if one holds a null."""
    pairs = []
    for index in indexes:
        if index is None:
            return None
        name, secondary = index["index_name"], index["secondary_key"]
        if name is None or secondary is None:
            return None
        pairs.append((name, secondary))
    return pairs


class _EntryOps:
    """The state one entry's ops read and change, one handler per op kind."""

    def __init__(
        self, store: KvReader, ops: list[int], keys: list[bytes], now: int, next_version_id: int
    ) -> None:
        self._store = store
        self._now = now
        self._next_version_id = next_version_id
        # Stored state of every key a point op names, read once; `_changes` overlays
        # what earlier ops of this entry did (None: deleted).
        point_keys = list(dict.fromkeys(k for op, k in zip(ops, keys) if op != _DELETE_RANGE))
        self._stored: dict[bytes, bytes | None] = dict(zip(point_keys, store.multi_get(point_keys)))
        self._changes: dict[bytes, bytes | None] = {}
        #: User key and record of each key put, for the change log.
        self._versions: dict[bytes, tuple[str, Record]] = {}
        self._ranges: list[tuple[bytes, bytes]] = []
        #: Sessions, secondary indexes and sequences, under internal keys.
        self._internal = InternalOverlay(store)
        self._heads: dict[int, bytes] = {}
        #: How many ops got INVALID_OP.
        self.invalid_ops = 0

    def outcome(self, results: list[OpResult], invalid: str | None) -> OpsApply:
        changes = self._changes
        puts = [(k, v) for k, v in changes.items() if v is not None]
        deletes = [k for k, v in changes.items() if v is None]
        internal_puts, internal_deletes = self._internal.writes()
        puts.extend(internal_puts)
        deletes.extend(internal_deletes)
        ranges = self._ranges
        return OpsApply(
            (puts, deletes, ranges),
            change_log.entry_changes(changes, self._stored, ranges, self._versions),
            results,
            self._heads,
            self._next_version_id,
            invalid,
        )

    def _named(self, key: bytes) -> bytes | None:
        """The current record of a key a point op of the entry names."""
        changes = self._changes
        return changes[key] if key in changes else self._stored[key]

    def _current(self, key: bytes) -> bytes | None:
        """The current record of any key (a sequence key, a session's ephemeral key)."""
        if key in self._changes:
            return self._changes[key]
        if key in self._stored:
            return self._stored[key]
        if any(start <= key < end for start, end in self._ranges):
            return None
        return self._store.get(key)

    def put(self, row: _Row) -> OpResult:
        (
            _,
            key,
            user_key,
            _,
            value,
            expected,
            session_id,
            client_identity,
            partition_key,
            deltas,
            indexes,
            _,
        ) = row
        pairs = None
        if indexes and (pairs := _pairs(indexes)) is None or deltas and None in deltas:
            return self.invalid(row)
        assigned = None
        if session_id is not None or deltas:
            if session_id is not None and not sessions.session_exists(self._internal, session_id):
                return SESSION_DOES_NOT_EXIST
            if deltas:
                try:
                    assigned = sequences.assign(self._internal, user_key, deltas)
                except sequences.SequenceOverflowError:
                    return UNEXPECTED_VERSION_ID
                key = encode_key(assigned)
        changes = self._changes
        if assigned is None:  # _named(key), inline on the hot path
            current = changes[key] if key in changes else self._stored[key]
        else:
            current = self._current(key)
        now = self._now
        if current is None:
            if expected is not None and expected != VERSION_ID_NOT_EXISTS:
                return UNEXPECTED_VERSION_ID
            modifications_count, created_ms, was_indexed = 0, now, 0
        else:
            old_version, modifications, created_ms, _, _, flags, _, _ = HEADER.unpack_from(current)
            if expected is not None and expected != old_version:
                return UNEXPECTED_VERSION_ID
            modifications_count, was_indexed = modifications + 1, flags & HAS_INDEXES
        version_id = self._next_version_id
        record = Record(
            value or b"",
            version_id,
            modifications_count,
            created_ms,
            now,
            session_id,
            client_identity,
            partition_key,
            bool(indexes),
        )
        self._next_version_id = version_id + 1
        # encode_record(record), keeping its head for the stored results
        head = self._heads[id(record)] = encode_record_head(record)
        changes[key] = head + record.value
        self._versions[key] = (user_key if assigned is None else assigned, record)
        if session_id is not None:
            sessions.add_ephemeral_key(self._internal, session_id, key)
        if pairs or was_indexed:
            secondary_indexes.replace(self._internal, key, pairs or [])
        return OpResult(Status.OK, record, assigned)

    def delete(self, row: _Row) -> OpResult:
        _, key, _, _, _, expected, _, _, _, _, _, _ = row
        current = self._named(key)
        if current is None:
            if expected is not None and expected != VERSION_ID_NOT_EXISTS:
                return UNEXPECTED_VERSION_ID
            return KEY_NOT_FOUND
        version_id, _, _, _, _, flags, _, _ = HEADER.unpack_from(current)
        if expected is not None and expected != version_id:
            return UNEXPECTED_VERSION_ID
        self._changes[key] = None
        if flags & HAS_INDEXES:
            secondary_indexes.remove(self._internal, key)
        return OK

    def delete_range(self, row: _Row) -> OpResult:
        _, start, _, end_key, _, _, _, _, _, _, _, _ = row
        end = encode_key(end_key) if end_key else USER_KEYS_END
        if start < end:
            self._ranges.append((start, end))
            for view in (self._stored, self._changes):
                for k in view:
                    if start <= k < end:
                        view[k] = None
            secondary_indexes.remove_range(self._internal, start, end)
        return OK

    def create_session(self, row: _Row) -> OpResult:
        _, _, _, _, _, _, _, client_identity, _, _, _, timeout_ms = row
        new_id = sessions.create_session(self._internal, timeout_ms or 0, client_identity or "")
        return OpResult(Status.OK, session_id=new_id)

    def close_session(self, row: _Row) -> OpResult:
        _, _, _, _, _, _, session_id, _, _, _, _, _ = row
        if session_id is None:
            return self.invalid(row)
        if session_id > _MAX_SESSION_ID:
            return SESSION_DOES_NOT_EXIST
        listed = sessions.close_session(self._internal, session_id)
        if listed is None:
            return SESSION_DOES_NOT_EXIST
        for k in listed:
            ephemeral = self._current(k)
            if ephemeral is None:
                continue
            _, _, _, _, owner, flags, _, _ = HEADER.unpack_from(ephemeral)
            if owner == session_id:
                self._changes[k] = None
                if flags & HAS_INDEXES:
                    secondary_indexes.remove(self._internal, k)
        return OK

    def invalid(self, row: _Row) -> OpResult:
        """An op that cannot be applied: it changes nothing."""
        self.invalid_ops += 1
        return INVALID_OP


#: The handler of each op kind, by op value.
_HANDLERS: dict[int, Callable[[_EntryOps, _Row], OpResult]] = {
    _PUT: _EntryOps.put,
    _DELETE: _EntryOps.delete,
    _DELETE_RANGE: _EntryOps.delete_range,
    _CREATE_SESSION: _EntryOps.create_session,
    _CLOSE_SESSION: _EntryOps.close_session,
}
