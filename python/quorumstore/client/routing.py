"""Which shard owns a key, and which node leads each shard.

quorumstore routes like Oxia's server and its Go and Java clients: the low 32 bits
of XXH3-64 of the key (or of the partition key, when one is given) fall into exactly
one shard's hash range. (The official Python client 0.2.1 hashes with XXH64 instead,
so it puts keys on other shards than every other client; this one does not.)

    >>> routing = ShardMap([ShardAssignment(0, "a:1", 0, 2**31 - 1),
    ...                     ShardAssignment(1, "b:1", 2**31, 2**32 - 1)])
    >>> routing.shard_for("/users/7"), routing.leader(1)
    (1, 'b:1')
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.wire.hashing import HASH_SPACE, key_hash


class ShardAssignment(NamedTuple):
    shard: int
    #: host:port of the leader; "" while the shard has none (an election is running).
    leader: str
    min_hash_inclusive: int
    max_hash_inclusive: int


class ShardMap:
    """An immutable snapshot of a namespace's shards; a new one replaces it on change."""

    def __init__(self, assignments: Iterable[ShardAssignment]) -> None:
        ordered = sorted(assignments, key=lambda a: a.min_hash_inclusive)
        if not ordered:
            raise ValueError("a shard map needs at least one shard")
        expected = 0
        for a in ordered:
            if a.min_hash_inclusive != expected or a.max_hash_inclusive < a.min_hash_inclusive:
                raise ValueError(
                    f"shard {a.shard}'s hash range {a.min_hash_inclusive:#010x}-"
                    f"{a.max_hash_inclusive:#010x} does not continue at {expected:#010x}: "
                    "the ranges must tile the 32-bit hash space"
                )
            expected = a.max_hash_inclusive + 1
        if expected != HASH_SPACE:
            raise ValueError(f"the hash ranges end at {expected - 1:#010x}, not at 0xffffffff")
        self._starts = [a.min_hash_inclusive for a in ordered]
        self._ordered = [a.shard for a in ordered]
        self._leaders = {a.shard: a.leader for a in ordered}
        # The same, as arrays for `shards_for`.
        self._start_array = np.array(self._starts, np.int64)
        self._shard_array = np.array(self._ordered, np.int64)

    @classmethod
    def from_proto(cls, namespace: pb.NamespaceShardsAssignment) -> ShardMap:
        if namespace.shard_key_router != pb.XXHASH3:
            raise ValueError(
                f"the server routes keys with {pb.ShardKeyRouter.Name(namespace.shard_key_router)}; "
                "this client only knows XXHASH3"
            )
        return cls(
            ShardAssignment(
                a.shard,
                a.leader,
                a.int32_hash_range.min_hash_inclusive,
                a.int32_hash_range.max_hash_inclusive,
            )
            for a in namespace.assignments
        )

    @property
    def shards(self) -> list[int]:
        """Every shard id, in hash-range order."""
        return list(self._ordered)

    def shard_for(self, routing_key: str) -> int:
        return self._ordered[bisect.bisect_right(self._starts, key_hash(routing_key)) - 1]

    def shards_for(self, routing_keys: Sequence[str]) -> np.ndarray:
        """`shard_for` of every key, as an int64 array: one search for a bulk path's keys."""
        hashes = np.fromiter((key_hash(k) for k in routing_keys), np.int64, len(routing_keys))
        return self._shard_array[np.searchsorted(self._start_array, hashes, side="right") - 1]

    def leader(self, shard: int) -> str | None:
        """The shard's leader; None while it has none or the shard is not in the map."""
        return self._leaders.get(shard) or None

    def with_leader(self, shard: int, leader: str) -> ShardMap:
        """This map with `shard` led by `leader` (a not-leader error's hint)."""
        changed = object.__new__(ShardMap)
        changed._starts, changed._ordered = self._starts, self._ordered
        changed._start_array, changed._shard_array = self._start_array, self._shard_array
        changed._leaders = {**self._leaders, shard: leader}
        return changed

    def __repr__(self) -> str:
        return f"ShardMap({self._leaders})"
