"""Random write logs and their clean replay, shared by the state machine's unit tests and
its crash-recovery test (which builds the same log in a child process)."""

from __future__ import annotations

import functools
import random

from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, make_entry
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.results import EntryResult
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import WriteBatchBuilder
from quorumstore.wire.keys import compare_keys

hierarchical = functools.cmp_to_key(compare_keys)

SMALL_KEYS = ["a", "b", "a/1", "a/2", "a/b/c", "b/x", "c\x00", "é/1"]


def position_of(entry: LogEntry) -> LogPosition:
    return LogPosition(entry.term, entry.offset, entry.checksum)


def chain(
    payloads: list[bytes], term: int = 1, after: LogPosition = EMPTY_POSITION
) -> list[LogEntry]:
    entries = []
    for payload in payloads:
        entry = make_entry(after, term, payload)
        entries.append(entry)
        after = position_of(entry)
    return entries


def random_log(seed: int, length: int) -> list[LogEntry]:
    """Mixed batches over a small key space, so that versions collide and matter."""
    rng = random.Random(seed)
    payloads = []
    for i in range(length):
        builder = WriteBatchBuilder()
        for _ in range(rng.choice([0, 1, 2, 5, 12])):
            roll = rng.random()
            expected = None if roll < 0.6 else -1 if roll < 0.75 else rng.randrange(2 * i + 2)
            roll = rng.random()
            if roll < 0.7:
                builder.add_put(
                    rng.choice(SMALL_KEYS),
                    rng.randbytes(rng.randrange(8)),
                    expected,
                    client_identity=rng.choice([None, "c1"]),
                )
            elif roll < 0.95:
                builder.add_delete(rng.choice(SMALL_KEYS), expected)
            else:
                start, end = sorted(rng.sample(SMALL_KEYS, 2), key=hierarchical)
                builder.add_delete_range(start, rng.choice([end, ""]))
        payloads.append(builder.build(timestamp_ms=1_000 + 10 * i))
    return chain(payloads, term=rng.choice([1, 2]))


def replay(entries: list[LogEntry]) -> tuple[int, list[EntryResult | None]]:
    """The state digest and per-entry results of applying `entries` once, on a fresh store."""
    sm = ShardStateMachine(MemoryKv())
    results = sm.apply(entries)
    return sm.state_digest(), results
