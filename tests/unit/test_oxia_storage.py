"""Sessions, secondary indexes and sequence keys in the state machine.

Everything here is replicated state changed at apply time, so besides the semantics
the tests check determinism: two replicas applying the same entries hold the same
bytes, internal keys included.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quorumstore.protocol.types import LogPosition, make_entry
from quorumstore.storage.kv import KvStore
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.reads import KeyComparison
from quorumstore.storage.records import Record
from quorumstore.storage.results import OpResult, Status, decode_results, encode_results
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.sequences import MAX_SEQUENCE
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import WriteBatchBuilder
from quorumstore.wire.keys import index_order
from quorumstore.wire.metadata import ClientSerial


class Shard:
    def __init__(self, kv: KvStore) -> None:
        self.kv = kv
        self.sm = ShardStateMachine(kv)
        self.payloads: list[bytes] = []

    def apply(
        self, builder: WriteBatchBuilder, origin: ClientSerial | None = None
    ) -> list[OpResult]:
        payload = builder.build(1_000 + len(self.payloads), origin)
        self.payloads.append(payload)
        position = self.sm.applied_position
        entry = make_entry(
            LogPosition(position.term, position.offset, position.checksum), 1, payload
        )
        [result] = self.sm.apply([entry])
        assert result is not None
        return result.results

    def put(self, key: str, **options: object) -> OpResult:
        builder = WriteBatchBuilder()
        builder.add_put(key, key.encode(), **options)  # type: ignore[arg-type]
        return self.apply(builder)[0]

    def session(self, timeout_ms: int = 5000) -> int:
        builder = WriteBatchBuilder()
        builder.add_create_session(timeout_ms, "me")
        [result] = self.apply(builder)
        assert result.session_id is not None
        return result.session_id

    def close(self, session_id: int) -> Status:
        builder = WriteBatchBuilder()
        builder.add_close_session(session_id)
        return self.apply(builder)[0].status

    def delete(self, key: str) -> Status:
        builder = WriteBatchBuilder()
        builder.add_delete(key)
        return self.apply(builder)[0].status

    def delete_range(self, start: str, end: str) -> None:
        builder = WriteBatchBuilder()
        builder.add_delete_range(start, end)
        self.apply(builder)

    def keys(self) -> list[str]:
        return list(self.sm.list_keys("", ""))


@pytest.fixture
def shard() -> Shard:
    return Shard(MemoryKv())


# ------------------------------------------------------------------ sessions


def test_sessions_get_increasing_ids_and_are_listed(shard: Shard) -> None:
    assert [shard.session(5000), shard.session(9000)] == [1, 2]
    assert [(s.session_id, s.timeout_ms, s.client_identity) for s in shard.sm.open_sessions()] == [
        (1, 5000, "me"),
        (2, 9000, "me"),
    ]
    assert shard.sm.session_info(2) is not None and shard.sm.session_info(3) is None


def test_a_put_on_an_unknown_session_fails_and_writes_nothing(shard: Shard) -> None:
    result = shard.put("/e", session_id=7)
    assert result == OpResult(Status.SESSION_DOES_NOT_EXIST)
    assert shard.keys() == []


def test_closing_a_session_deletes_the_records_it_still_owns(shard: Shard) -> None:
    first, second = shard.session(), shard.session()
    for key in ["/owned", "/overwritten", "/taken", "/deleted", "/ranged/x"]:
        assert shard.put(key, session_id=first).status == Status.OK
    shard.put("/overwritten")  # no longer ephemeral
    shard.put("/taken", session_id=second)  # now the other session's
    shard.delete("/deleted")
    shard.delete_range("/ranged/", "/ranged/~")
    shard.put("/deleted")  # re-created, not ephemeral

    assert shard.close(first) == Status.OK
    assert shard.keys() == ["/deleted", "/overwritten", "/taken"]
    assert shard.close(first) == Status.SESSION_DOES_NOT_EXIST
    assert shard.put("/late", session_id=first).status == Status.SESSION_DOES_NOT_EXIST
    assert shard.close(second) == Status.OK
    assert shard.keys() == ["/deleted", "/overwritten"]


def test_an_ephemeral_put_and_its_sessions_close_in_one_entry(shard: Shard) -> None:
    session = shard.session()
    builder = WriteBatchBuilder()
    builder.add_put("/e", b"v", session_id=session)
    builder.add_close_session(session)
    builder.add_put("/after", b"v", session_id=session)
    results = shard.apply(builder)
    assert [r.status for r in results] == [Status.OK, Status.OK, Status.SESSION_DOES_NOT_EXIST]
    assert shard.keys() == []


# ------------------------------------------------------------------ secondary indexes


def test_index_lists_primary_keys_by_secondary_key(shard: Shard) -> None:
    shard.put("/u/3", secondary_indexes=[("name", "bob")])
    shard.put("/u/1", secondary_indexes=[("name", "bob"), ("age", "30")])
    shard.put("/u/2", secondary_indexes=[("name", "alice")])
    shard.put("/u/4", secondary_indexes=[("name", "a/deeper")])  # hierarchical: after "bob"
    assert list(shard.sm.list_by_index("name", "", "")) == ["/u/2", "/u/1", "/u/3", "/u/4"]
    assert list(shard.sm.list_by_index("name", "b", "c")) == ["/u/1", "/u/3"]
    assert list(shard.sm.list_by_index("name", "alice", "bob")) == ["/u/2"]
    assert list(shard.sm.list_by_index("age", "", "")) == ["/u/1"]
    assert list(shard.sm.list_by_index("nope", "", "")) == []
    found = [(k, s) for k, s, _ in shard.sm.range_scan_by_index("name", "b", "")]
    assert found == [("/u/1", "bob"), ("/u/3", "bob"), ("/u/4", "a/deeper")]


def test_the_clients_index_order_is_the_order_a_shard_scans_its_index_in(shard: Shard) -> None:
    # The client merges shards' index scans on `index_order`; it must be the servers' order.
    rng = random.Random(7)
    segments = ["", "a", "a/b", "b", "ab", "a-", "a~", "é", "0", "a/b/c"]
    pairs = []
    for i in range(300):
        primary = f"/{rng.choice(segments)}/{i}"
        secondary = "/".join(rng.choice(segments[1:]) for _ in range(rng.randint(1, 3)))
        shard.put(primary, secondary_indexes=[("i", secondary)])
        pairs.append((primary, secondary))
    scanned = [(p, s) for p, s, _ in shard.sm.range_scan_by_index("i", "", "")]
    assert scanned == sorted(pairs, key=lambda pair: index_order(pair[1], pair[0]))


def test_index_entries_follow_overwrites_deletes_and_delete_ranges(shard: Shard) -> None:
    shard.put("/a", secondary_indexes=[("i", "x")])
    shard.put("/b", secondary_indexes=[("i", "x")])
    shard.put("/c/d", secondary_indexes=[("i", "y")])
    shard.put("/a", secondary_indexes=[("i", "z")])
    assert list(shard.sm.list_by_index("i", "", "")) == ["/b", "/c/d", "/a"]  # x, y, z
    shard.put("/b")  # overwritten without indexes
    shard.delete("/a")
    assert list(shard.sm.list_by_index("i", "", "")) == ["/c/d"]
    assert shard.sm.get("/b") == Record(b"/b", 4, 1, 1_001, 1_004)  # no longer indexed
    shard.delete_range("/c/", "/c/~")
    assert list(shard.sm.list_by_index("i", "", "")) == []
    internal = [k for k, _ in shard.kv.scan(b"\x00idx", b"\x00idy")]
    assert internal == []


@pytest.mark.parametrize(
    ("comparison", "key", "found"),
    [
        (KeyComparison.EQUAL, "m", ("/m1", "m")),
        (KeyComparison.EQUAL, "n", None),
        (KeyComparison.FLOOR, "m", ("/m1", "m")),
        (KeyComparison.FLOOR, "n", ("/m2", "m")),
        (KeyComparison.FLOOR, "a", None),
        (KeyComparison.CEILING, "m", ("/m1", "m")),
        (KeyComparison.CEILING, "n", ("/t", "t")),
        (KeyComparison.LOWER, "m", ("/g", "g")),
        (KeyComparison.HIGHER, "m", ("/t", "t")),
        (KeyComparison.HIGHER, "t", None),
    ],
)
def test_get_through_an_index(
    shard: Shard, comparison: KeyComparison, key: str, found: tuple[str, str] | None
) -> None:
    for primary, secondary in [("/g", "g"), ("/m2", "m"), ("/m1", "m"), ("/t", "t")]:
        shard.put(primary, secondary_indexes=[("i", secondary)])
    shard.put("/other", secondary_indexes=[("j", "a")])
    result = shard.sm.get_by_index("i", key, comparison)
    assert (None if result is None else result[:2]) == found


# ------------------------------------------------------------------ sequences


def test_sequence_keys_are_assigned_at_apply_time_and_never_reused(shard: Shard) -> None:
    first = shard.put("/s", partition_key="p", sequence_key_delta=[1, 5])
    assert first.key == f"/s-{1:020d}-{5:020d}"
    assert first.version is not None and first.version.partition_key == "p"
    second = shard.put("/s", partition_key="p", sequence_key_delta=[2, 0])
    assert second.key == f"/s-{3:020d}-{5:020d}"
    shard.delete(second.key)
    third = shard.put("/s", partition_key="p", sequence_key_delta=[1, 1, 7])
    assert third.key == f"/s-{4:020d}-{6:020d}-{7:020d}"
    # Fewer deltas than positions (requests racing): the missing ones advance by 0.
    fourth = shard.put("/s", partition_key="p", sequence_key_delta=[1])
    assert fourth.key == f"/s-{5:020d}-{6:020d}-{7:020d}"
    assert shard.sm.latest_sequence_key("/s") == fourth.key
    assert shard.sm.sequence_dimensions("/s") == 3
    assert shard.sm.latest_sequence_key("/other") is None
    assert shard.keys() == [first.key, third.key, fourth.key]


def test_a_sequence_that_would_overflow_fails_without_changing_anything(shard: Shard) -> None:
    shard.put("/s", partition_key="p", sequence_key_delta=[MAX_SEQUENCE - 1])
    before = shard.sm.latest_sequence_key("/s")
    assert shard.put("/s", partition_key="p", sequence_key_delta=[2]).status == (
        Status.UNEXPECTED_VERSION_ID
    )
    assert shard.sm.latest_sequence_key("/s") == before
    assert shard.put("/s", partition_key="p", sequence_key_delta=[1]).key == (
        f"/s-{MAX_SEQUENCE:020d}"
    )


def test_a_retried_exactly_once_sequence_put_returns_the_original_key(shard: Shard) -> None:
    builder = WriteBatchBuilder()
    builder.add_put("/s", b"v", partition_key="p", sequence_key_delta=[1])
    [original] = shard.apply(builder, ClientSerial("c", 1))
    [retried] = shard.apply(builder, ClientSerial("c", 1))
    assert original.key == f"/s-{1:020d}" and retried.key == original.key
    assert original.version is not None
    assert retried.version == original.version._replace(value=b"")  # stored without values
    assert shard.sm.latest_sequence_key("/s") == original.key


def test_results_round_trip_with_keys_and_session_ids() -> None:
    results = [
        OpResult(Status.OK, Record(b"v", 1, 0, 2, 3, indexed=True), key="/s-1"),
        OpResult(Status.OK, session_id=9),
        OpResult(Status.SESSION_DOES_NOT_EXIST),
    ]
    stored = [
        r._replace(version=r.version._replace(value=b"")) if r.version else r for r in results
    ]
    assert decode_results(encode_results(results)) == stored  # versions, without values


# ------------------------------------------------------------------ determinism


def test_replicas_hold_identical_bytes(tmp_path: Path) -> None:
    """The same entries on MemoryKv and RocksKv: every key, internal ones included, equal."""
    leader = Shard(MemoryKv())
    session = leader.session()
    leader.put("/e", session_id=session, secondary_indexes=[("i", "1")])
    leader.put("/s", partition_key="p", sequence_key_delta=[3])
    leader.put("/x", secondary_indexes=[("i", "2"), ("j", "2")])
    leader.delete_range("/x", "/y")
    leader.close(session)

    follower = Shard(RocksKv(tmp_path / "kv"))
    for payload in leader.payloads:
        position = follower.sm.applied_position
        follower.sm.apply([make_entry(position, 1, payload)])
    assert list(follower.kv.scan(b"", None)) == list(leader.kv.scan(b"", None))
    follower.kv.close()
