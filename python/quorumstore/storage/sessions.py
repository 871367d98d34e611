"""Client sessions in a shard's replicated state, and the index of their ephemeral records.

A session is created by a replicated write (its id comes from a shard-local counter
in the KV, so every replica assigns the same one) and ended by another (close or
expiry, both proposed by the leader, which alone keeps the heartbeat clocks). An
ephemeral put names its session; the shard records the key under the session, and
closing the session deletes every listed key whose record still belongs to it. A key
later overwritten, deleted or re-attached to another session is simply skipped then,
so deletes and overwrites never have to touch the session index.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from quorumstore.storage.keys import INTERNAL_PREFIX
from quorumstore.storage.kv import KvReader
from quorumstore.storage.overlay import InternalOverlay

_SESSION_PREFIX = INTERNAL_PREFIX + b"session/"
_EPHEMERAL_PREFIX = INTERNAL_PREFIX + b"session-key/"
NEXT_SESSION_ID_KEY = INTERNAL_PREFIX + b"next-session-id"
_ID = struct.Struct(">q")  # big-endian, so byte order is id order
_META = struct.Struct("<q")  # timeout_ms; the client identity's UTF-8 bytes follow
#: Id of a shard's first session (0 would read as "no session" to some clients).
FIRST_SESSION_ID = 1


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: int
    timeout_ms: int
    client_identity: str


def _session_key(session_id: int) -> bytes:
    return _SESSION_PREFIX + _ID.pack(session_id)


def _ephemeral_prefix(session_id: int) -> bytes:
    return _EPHEMERAL_PREFIX + _ID.pack(session_id)


def _decode(key: bytes, value: bytes) -> SessionInfo:
    (session_id,) = _ID.unpack_from(key, len(_SESSION_PREFIX))
    (timeout_ms,) = _META.unpack_from(value)
    return SessionInfo(session_id, timeout_ms, value[_META.size :].decode())


def create_session(state: InternalOverlay, timeout_ms: int, client_identity: str) -> int:
    """Registers a session; returns its id."""
    raw = state.get(NEXT_SESSION_ID_KEY)
    session_id = FIRST_SESSION_ID if raw is None else _ID.unpack(raw)[0]
    state.put(NEXT_SESSION_ID_KEY, _ID.pack(session_id + 1))
    state.put(_session_key(session_id), _META.pack(timeout_ms) + client_identity.encode())
    return session_id


def session_exists(state: InternalOverlay, session_id: int) -> bool:
    return state.get(_session_key(session_id)) is not None


def add_ephemeral_key(state: InternalOverlay, session_id: int, encoded_key: bytes) -> None:
    state.put(_ephemeral_prefix(session_id) + encoded_key, b"")


def close_session(state: InternalOverlay, session_id: int) -> list[bytes] | None:
    """Removes the session; returns the encoded keys it listed (None: no such session).

    The caller deletes those of them whose record still names this session.
    """
    key = _session_key(session_id)
    if state.get(key) is None:
        return None
    state.delete(key)
    prefix = _ephemeral_prefix(session_id)
    listed = []
    for index_key, _ in state.scan(prefix, _ephemeral_prefix(session_id + 1)):
        state.delete(index_key)
        listed.append(index_key[len(prefix) :])
    return listed


def read_sessions(kv: KvReader) -> list[SessionInfo]:
    """Every open session of the shard, by id."""
    end = _SESSION_PREFIX[:-1] + bytes([_SESSION_PREFIX[-1] + 1])
    return [_decode(k, v) for k, v in kv.scan(_SESSION_PREFIX, end)]


def read_session(kv: KvReader, session_id: int) -> SessionInfo | None:
    raw = kv.get(_session_key(session_id))
    return None if raw is None else _decode(_session_key(session_id), raw)
