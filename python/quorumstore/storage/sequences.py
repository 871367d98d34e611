"""Sequence keys: server-assigned, monotonic suffixes per key prefix (Oxia's sequential keys).

A put of prefix `p` with deltas [d0, d1, ...] is written at `p-%020d-%020d...`, where
each number is the last one assigned under `p` in that position plus its delta. The
last numbers per prefix live in the replicated KV and are advanced at apply time, so
every replica assigns the same key, and a number is never handed out twice even when
the key holding it was deleted (unlike Oxia, which derives the next key from the
highest existing one). The first delta must be positive, so every key assigned
sorts after the previous one.
"""

from __future__ import annotations

import struct

from quorumstore.storage.keys import INTERNAL_PREFIX
from quorumstore.storage.kv import KvReader
from quorumstore.storage.overlay import InternalOverlay

_SEQUENCE_PREFIX = INTERNAL_PREFIX + b"sequence/"
_NUMBER = struct.Struct("<Q")
#: Largest number a suffix can hold (20 decimal digits).
MAX_SEQUENCE = (1 << 64) - 1


class SequenceOverflowError(ValueError):
    """A delta would take a suffix beyond MAX_SEQUENCE."""


def _state_key(prefix: str) -> bytes:
    return _SEQUENCE_PREFIX + prefix.encode()


def _decode(raw: bytes | None) -> list[int]:
    if raw is None:
        return []
    return [n for (n,) in _NUMBER.iter_unpack(raw)]


def format_key(prefix: str, numbers: list[int]) -> str:
    return prefix + "".join(f"-{n:020d}" for n in numbers)


def assign(state: InternalOverlay, prefix: str, deltas: list[int]) -> str:
    """The next key of `prefix`; raises SequenceOverflowError and changes nothing then.

    Positions the prefix already has beyond `deltas` advance by 0, so a key keeps all of
    them (only reachable when requests with different numbers of deltas race).
    """
    last = _decode(state.get(_state_key(prefix)))
    padded = list(deltas) + [0] * (len(last) - len(deltas))
    numbers = [(last[i] if i < len(last) else 0) + d for i, d in enumerate(padded)]
    if any(n > MAX_SEQUENCE for n in numbers):
        raise SequenceOverflowError(f"sequence {prefix!r} would pass {MAX_SEQUENCE}")
    state.put(_state_key(prefix), b"".join(_NUMBER.pack(n) for n in numbers))
    return format_key(prefix, numbers)


def dimensions(kv: KvReader, prefix: str) -> int:
    """How many numbers the keys of `prefix` carry so far (0: none assigned yet)."""
    return len(_decode(kv.get(_state_key(prefix))))


def latest_key(kv: KvReader, prefix: str) -> str | None:
    """The last key assigned under `prefix`, if any."""
    numbers = _decode(kv.get(_state_key(prefix)))
    return format_key(prefix, numbers) if numbers else None
