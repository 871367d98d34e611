"""Checks of an operation's arguments, made before the operation is queued: a bad
argument fails its own call, never the batch it would share with others."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from quorumstore.client.errors import InvalidRequest
from quorumstore.client.types import EXPECTED_RECORD_DOES_NOT_EXIST

#: Version ids are int64 on the wire.
_MAX_VERSION_ID = 2**63 - 1
#: Sequence-key deltas are uint64 on the wire.
_MAX_DELTA = 2**64 - 1
#: What `secondary_indexes=` takes: index name -> one secondary key or several.
SecondaryIndexes = Mapping[str, str | Iterable[str]]


def value_bytes(value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a value must be bytes or str, got {type(value).__name__}")


def check_key(key: str, what: str = "key") -> None:
    check_str(key, what)
    if not key:
        raise InvalidRequest(f"{what} is empty")


def check_str(value: str, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")


def check_range(min_key_inclusive: str, max_key_exclusive: str) -> None:
    check_str(min_key_inclusive, "min_key_inclusive")
    check_str(max_key_exclusive, "max_key_exclusive")


def check_expected_version(expected_version_id: int | None) -> None:
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


def check_index(use_index: str | None) -> None:
    if use_index is not None:
        check_key(use_index, "use_index")


def index_pairs(secondary_indexes: SecondaryIndexes | None) -> tuple[tuple[str, str], ...]:
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
        check_key(name, "a secondary index name")
        for secondary_key in [keys] if isinstance(keys, str) else keys:
            check_key(secondary_key, f"a secondary key of index {name!r}")
            pairs.append((name, secondary_key))
    return tuple(pairs)


def sequence_deltas(deltas: Sequence[int]) -> tuple[int, ...]:
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
