"""The change log: each applied entry's net effect, recorded atomically with it, kept by time."""

from __future__ import annotations

import hashlib
import random

import pytest

from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, make_entry
from quorumstore.storage import change_log
from quorumstore.storage.change_log import (
    CHANGE_RETENTION_MS,
    ChangeEvent,
    changes_kept_after,
    read_changes,
)
from quorumstore.storage.keys import INTERNAL_PREFIX
from quorumstore.storage.kv import KvStore
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import Op, WriteBatchBuilder
from quorumstore.wire.keys import compare_keys, encode_key
from quorumstore.wire.metadata import ClientSerial

T0 = 1_700_000_000_000
#: See test_the_stored_record_bytes_do_not_change_between_versions.
GOLDEN_DIGESTS = ["1b2a3876ba0c0928", "df00ad95b9d17ce9"]


class Log:
    """A state machine fed one write batch per entry."""

    def __init__(self, kv: KvStore) -> None:
        self.kv = kv
        self.sm = ShardStateMachine(kv)
        self.head: LogPosition = EMPTY_POSITION
        self.entries: list[LogEntry] = []

    def apply(self, builder: WriteBatchBuilder, ts: int = T0, origin: ClientSerial | None = None):
        entry = make_entry(self.head, 1, builder.build(ts, origin))
        self.head = LogPosition(entry.term, entry.offset, entry.checksum)
        self.entries.append(entry)
        [result] = self.sm.apply([entry])
        return result

    def changes(self, start: int = -1, end: int | None = None) -> list[tuple[int, int, list[dict]]]:
        end = self.head.offset if end is None else end
        return [(o, ts, b.to_pylist()) for o, ts, b in read_changes(self.kv, start, end)]


def batch(*ops: tuple) -> WriteBatchBuilder:
    b = WriteBatchBuilder()
    for op, *args in ops:
        {"put": b.add_put, "delete": b.add_delete, "range": b.add_delete_range}[op](*args)
    return b


def row(key: str, op: Op, event: ChangeEvent, **fields) -> dict:
    out = {
        "key": key,
        "operation": op.value,
        "value": None,
        "version_id": None,
        "modifications_count": None,
        "created_ms": None,
        "modified_ms": None,
        "range_end": None,
        "event": event.value,
    }
    out.update(fields)
    return out


@pytest.fixture(params=["memory", "rocks"])
def log(request: pytest.FixtureRequest, tmp_path) -> Log:
    return Log(MemoryKv() if request.param == "memory" else RocksKv(tmp_path / "kv"))


def test_puts_record_created_then_modified_with_their_versions(log: Log) -> None:
    log.apply(batch(("put", "a", b"1"), ("put", "b", b"2")))
    log.apply(batch(("put", "a", b"3")), ts=T0 + 5)
    [(o0, ts0, first), (o1, ts1, second)] = log.changes()
    assert (o0, ts0, o1, ts1) == (0, T0, 1, T0 + 5)
    assert first == [
        row(
            "a",
            Op.PUT,
            ChangeEvent.KEY_CREATED,
            value=b"1",
            version_id=0,
            modifications_count=0,
            created_ms=T0,
            modified_ms=T0,
        ),
        row(
            "b",
            Op.PUT,
            ChangeEvent.KEY_CREATED,
            value=b"2",
            version_id=1,
            modifications_count=0,
            created_ms=T0,
            modified_ms=T0,
        ),
    ]
    assert second == [
        row(
            "a",
            Op.PUT,
            ChangeEvent.KEY_MODIFIED,
            value=b"3",
            version_id=2,
            modifications_count=1,
            created_ms=T0,
            modified_ms=T0 + 5,
        )
    ]


def test_rows_are_ranges_then_deletes_then_puts_and_only_real_deletes(log: Log) -> None:
    log.apply(batch(("put", "x/1", b"a"), ("put", "x/2", b"b"), ("put", "gone", b"g")))
    log.apply(
        batch(
            ("put", "new", b"n"),
            ("delete", "new"),  # created and deleted in one entry: no change at all
            ("delete", "never"),  # KEY_NOT_FOUND: no change
            ("delete", "gone"),
            ("range", "x/", ""),
            ("put", "x/3", b"c"),  # after the range: survives it
        )
    )
    [(_, _, rows)] = log.changes(start=0)
    assert [(r["key"], r["operation"], r["event"], r["range_end"]) for r in rows] == [
        ("x/", Op.DELETE_RANGE, ChangeEvent.KEY_RANGE_DELETED, ""),
        ("gone", Op.DELETE, ChangeEvent.KEY_DELETED, None),
        ("x/3", Op.PUT, ChangeEvent.KEY_CREATED, None),
    ]


def test_entries_that_change_nothing_have_no_record(log: Log) -> None:
    log.apply(WriteBatchBuilder())  # the leader's no-op
    b = WriteBatchBuilder()
    b.add_put("k", b"v", expected_version_id=5)  # fails: k does not exist
    log.apply(b)
    log.apply(batch(("put", "k", b"v")), origin=ClientSerial("c", 1))
    retry = log.apply(batch(("put", "k", b"v")), origin=ClientSerial("c", 1))
    assert retry.duplicate
    assert [o for o, _, _ in log.changes()] == [2]


def test_replaying_the_rows_in_order_reproduces_the_state() -> None:
    rng = random.Random(7)
    log = Log(MemoryKv())
    model: dict[str, bytes] = {}
    keys = [f"{a}/{b}" for a in "pq" for b in "abcd"] + list("pqrs")
    for _ in range(200):
        ops = []
        for _ in range(rng.randint(1, 5)):
            kind = rng.choice(["put", "put", "delete", "range"])
            if kind == "range":
                low, high = sorted(rng.sample(keys, 2), key=lambda k: (compare_keys(k, "~"), k))
                ops.append(("range", low, rng.choice([high, ""])))
            elif kind == "put":
                ops.append(("put", rng.choice(keys), rng.randbytes(3)))
            else:
                ops.append(("delete", rng.choice(keys)))
        log.apply(batch(*ops), ts=T0 + len(log.entries))
    for _, _, rows in log.changes():
        for r in rows:
            if r["operation"] == Op.DELETE_RANGE:
                for k in [
                    k
                    for k in model
                    if compare_keys(r["key"], k) <= 0
                    and (not r["range_end"] or compare_keys(k, r["range_end"]) < 0)
                ]:
                    del model[k]
            elif r["operation"] == Op.DELETE:
                del model[r["key"]]
            else:
                model[r["key"]] = r["value"]
    assert model == {k: rec.value for k, rec in log.sm.range_scan("", "")}


def test_a_closed_sessions_ephemeral_records_are_deleted_changes(log: Log) -> None:
    [created] = log.apply(_session_batch()).results
    session = created.session_id
    eph = WriteBatchBuilder()
    eph.add_put("eph", b"e", session_id=session)
    log.apply(eph)
    close = WriteBatchBuilder()
    close.add_close_session(session)
    log.apply(close)
    last_offset, _, rows = log.changes()[-1]
    assert last_offset == log.head.offset
    assert [(r["key"], r["event"]) for r in rows] == [("eph", ChangeEvent.KEY_DELETED)]


def _session_batch() -> WriteBatchBuilder:
    b = WriteBatchBuilder()
    b.add_create_session(10_000, "test-client")
    return b


def test_the_record_is_part_of_the_entrys_atomic_write() -> None:
    kv = MemoryKv()
    log = Log(kv)
    log.apply(batch(("put", "a", b"1")))
    kv.flush()
    log.apply(batch(("put", "b", b"2")))
    kv.crash()  # loses the second entry's write: its changes go with it
    assert [o for o, _, _ in Log(kv).changes(end=5)] == [0]
    ShardStateMachine(kv).apply(log.entries)  # the log is replayed: entry 1 is applied again
    assert [o for o, _, _ in read_changes(kv, -1, 1)] == [0, 1]


def _internal_state(kv: KvStore) -> list[tuple[bytes, bytes]]:
    return list(kv.scan(INTERNAL_PREFIX + b"changes", INTERNAL_PREFIX + b"changet"))


def test_retention_expires_old_records_by_entry_time_deterministically() -> None:
    replicas = [Log(MemoryKv()), Log(MemoryKv())]
    interval = change_log._EXPIRY_INTERVAL
    for log in replicas:
        for i in range(3 * interval):
            # The first 70 entries are old; then time jumps past the retention.
            ts = T0 + i if i < 70 else T0 + CHANGE_RETENTION_MS + 1_000 + i
            log.apply(batch(("put", f"k{i % 7}", b"v")), ts=ts)
    first, second = replicas
    assert _internal_state(first.kv) == _internal_state(second.kv)
    # Expiry ran at offsets 128 (the first check after the jump): entries < T0 + 1000 + i are gone.
    kept_after = changes_kept_after(first.kv)
    assert kept_after == 69
    offsets = [o for o, _, _ in read_changes(first.kv, -1, first.head.offset)]
    assert offsets == list(range(70, 3 * interval))


def test_an_unknown_record_format_is_an_error() -> None:
    rows = change_log.entry_changes({encode_key("k"): None}, {}, [], {})
    assert rows is not None
    data = bytearray(change_log.encode(T0, rows))
    data[8] = 99
    with pytest.raises(ValueError, match="format 99"):
        change_log.decode(bytes(data))


def test_the_stored_record_bytes_do_not_change_between_versions() -> None:
    """Change records are replicated state: replicas of different versions (a rolling
    upgrade) must store the same bytes for the same entry, so a change to how the batch
    is built must not change its encoding. The digest was taken from the column-wise
    build this replaced."""
    log = Log(MemoryKv())
    log.apply(batch(("put", "/a", b"1"), ("put", "/b", b"2"), ("put", "/r/x", b"3")))
    log.apply(
        batch(
            ("range", "/r/", ""),
            ("delete", "/a"),
            ("put", "/b", b"22"),
            ("put", "/c", b""),
            ("delete", "/never"),
        ),
        ts=T0 + 5,
    )
    records = [log.kv.get(change_log.change_key(offset)) for offset in (0, 1)]
    digests = [hashlib.sha256(record or b"").hexdigest()[:16] for record in records]
    assert digests == GOLDEN_DIGESTS
