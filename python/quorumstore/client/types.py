"""Values the client returns: record versions, records, key comparisons.

They are NamedTuples: immutable, typed, unpackable, and cheap to build for every
operation of a batch.

    >>> version = Version(version_id=3, modifications_count=0, created_ms=0, modified_ms=0)
    >>> record = Record("/a", b"x", version)
    >>> key, value, v = record
    >>> (key, value, v.version_id, v.is_ephemeral)
    ('/a', b'x', 3, False)
"""

from __future__ import annotations

import datetime
import enum
from typing import NamedTuple

from quorumstore.proto import oxia_client_pb2 as pb

#: `expected_version_id` meaning "the record must not exist yet" (Oxia's -1).
EXPECTED_RECORD_DOES_NOT_EXIST = -1


class ComparisonType(enum.IntEnum):
    """How `get` matches keys, in hierarchical key order (Oxia's KeyComparisonType)."""

    EQUAL = pb.EQUAL  #: exactly the key
    FLOOR = pb.FLOOR  #: the greatest key <= the one given
    CEILING = pb.CEILING  #: the least key >= the one given
    LOWER = pb.LOWER  #: the greatest key < the one given
    HIGHER = pb.HIGHER  #: the least key > the one given


class Version(NamedTuple):
    """Metadata of a stored record, as of the operation that returned it."""

    #: Per-shard counter value given by the put that wrote this record.
    version_id: int
    #: 0 when the record was created, +1 for every later put.
    modifications_count: int
    #: Creation and last modification times, in milliseconds since the epoch.
    created_ms: int
    modified_ms: int
    #: Set on ephemeral records only.
    session_id: int | None = None
    client_identity: str | None = None

    @property
    def created_timestamp(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.created_ms / 1000, datetime.UTC)

    @property
    def modified_timestamp(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.modified_ms / 1000, datetime.UTC)

    @property
    def is_ephemeral(self) -> bool:
        return self.session_id is not None


class Record(NamedTuple):
    """A key with its value and version: what `get` returns and `range_scan` yields.

    `value` is None when the get asked for `include_value=False`.
    """

    key: str
    value: bytes | None
    version: Version


class PutResult(NamedTuple):
    """What a sequence-key put returns: the key the server assigned, and its version."""

    key: str
    version: Version


def version_from_proto(v: pb.Version) -> Version:
    return Version(
        v.version_id,
        v.modifications_count,
        v.created_timestamp,
        v.modified_timestamp,
        v.session_id if v.HasField("session_id") else None,
        v.client_identity if v.HasField("client_identity") else None,
    )
