"""Exactly-once writes (docs/protocol.md, Exactly-once serials): a retried (client id,
serial) takes effect once."""

from __future__ import annotations

from quorumstore.protocol.types import EMPTY_POSITION, LogPosition, make_entry
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.results import OpResult, Status
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.serials import SERIAL_TTL_MS, serial_key
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import WriteBatchBuilder
from quorumstore.wire.metadata import ClientSerial


def _put(key: str, value: bytes, ts: int, origin: ClientSerial | None) -> bytes:
    b = WriteBatchBuilder()
    b.add_put(key, value)
    return b.build(ts, origin)


class _Log:
    def __init__(self) -> None:
        self.head: LogPosition = EMPTY_POSITION

    def entry(self, payload: bytes):
        e = make_entry(self.head, 1, payload)
        self.head = LogPosition(e.term, e.offset, e.checksum)
        return e


def _without_values(results: list[OpResult]) -> list[OpResult]:
    """`results` as a retry gets them back: versions without the values written."""
    return [
        r if r.version is None else r._replace(version=r.version._replace(value=b""))
        for r in results
    ]


def test_retry_of_the_same_serial_returns_the_original_result_and_changes_nothing():
    sm, log = ShardStateMachine(MemoryKv()), _Log()
    origin = ClientSerial("client-a", 7)
    [first] = sm.apply([log.entry(_put("k", b"v1", 1000, origin))])
    [retry] = sm.apply([log.entry(_put("k", b"v1", 2000, origin))])
    assert not first.duplicate and retry.duplicate
    assert retry.results == _without_values(first.results)
    record = sm.get("k")
    assert record.version_id == first.results[0].version.version_id
    assert record.modifications_count == 0 and record.modified_ms == 1000


def test_an_older_serial_is_ignored_and_a_newer_one_applies():
    sm, log = ShardStateMachine(MemoryKv()), _Log()
    sm.apply([log.entry(_put("k", b"v5", 1000, ClientSerial("c", 5)))])
    [old] = sm.apply([log.entry(_put("k", b"v4", 1001, ClientSerial("c", 4)))])
    assert old.duplicate and old.results == []
    assert sm.get("k").value == b"v5"
    [new] = sm.apply([log.entry(_put("k", b"v6", 1002, ClientSerial("c", 6)))])
    assert not new.duplicate and new.results[0].status is Status.OK
    assert sm.get("k").value == b"v6"


def test_clients_are_independent_and_writes_without_serial_always_apply():
    sm, log = ShardStateMachine(MemoryKv()), _Log()
    sm.apply([log.entry(_put("k", b"a", 1, ClientSerial("a", 1)))])
    [b] = sm.apply([log.entry(_put("k", b"b", 2, ClientSerial("b", 1)))])
    assert not b.duplicate
    sm.apply([log.entry(_put("k", b"plain", 3, None)), log.entry(_put("k", b"plain", 4, None))])
    assert sm.get("k").modifications_count == 3


def test_serials_expire_after_the_ttl_by_entry_time():
    kv = MemoryKv()
    sm, log = ShardStateMachine(kv), _Log()
    sm.apply([log.entry(_put("k", b"old", 1000, ClientSerial("idle", 1)))])
    assert kv.get(serial_key("idle")) is not None
    sm.apply([log.entry(_put("x", b"y", 1000 + SERIAL_TTL_MS + 1, ClientSerial("busy", 1)))])
    assert kv.get(serial_key("idle")) is None
    # After expiry the old serial is unknown again: a (very late) retry would apply.
    [late] = sm.apply(
        [log.entry(_put("k", b"late", 1000 + SERIAL_TTL_MS + 2, ClientSerial("idle", 1)))]
    )
    assert not late.duplicate


def test_the_serial_table_survives_a_restart(tmp_path):
    kv = RocksKv(tmp_path / "kv")
    sm, log = ShardStateMachine(kv), _Log()
    [first] = sm.apply([log.entry(_put("k", b"v", 10, ClientSerial("c", 1)))])
    kv.close()
    kv = RocksKv(tmp_path / "kv")
    sm = ShardStateMachine(kv)
    [retry] = sm.apply([log.entry(_put("k", b"v", 20, ClientSerial("c", 1)))])
    assert retry.duplicate and retry.results == _without_values(first.results)
    kv.close()


def test_the_stored_results_of_a_write_do_not_hold_its_values():
    """A write's response carries versions, not values: storing them would write each
    value twice (once in the record, once with the client's serial)."""
    kv = MemoryKv()
    sm, log = ShardStateMachine(kv), _Log()
    value = b"v" * 10_000
    sm.apply([log.entry(_put("k", value, 1000, ClientSerial("c", 1)))])
    stored = kv.get(serial_key("c"))
    assert stored is not None and len(stored) < 200
