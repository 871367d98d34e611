"""Writes larger than one entry: replicated pieces, then one publishing entry (storage/staging.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, make_entry
from quorumstore.storage import staging
from quorumstore.storage.kv import KvStore
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.results import EntryResult, Status
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.snapshot import install_snapshot, iter_snapshot_chunks
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import Staging, StagingKind, WriteBatchBuilder, puts_batch
from quorumstore.wire.metadata import ClientSerial

WRITE = "ab" * 16


class Log:
    """A shard's state machine fed one entry at a time."""

    def __init__(self, kv: KvStore) -> None:
        self.kv = kv
        self.sm = ShardStateMachine(kv)
        self.head: LogPosition = self.sm.applied_position

    def append(self, payload: bytes) -> EntryResult:
        entry: LogEntry = make_entry(self.head, 1, payload)
        self.head = LogPosition(entry.term, entry.offset, entry.checksum)
        [result] = self.sm.apply([entry])
        assert result is not None
        return result

    def piece(self, stage: str, number: int, keys: list[str], at_ms: int = 1_000) -> None:
        values = [f"{stage[-1]}:{k}".encode() for k in keys]
        payload = puts_batch(
            pa.array(keys), pa.array(values, pa.binary()), at_ms,
            staging=Staging(StagingKind.PIECE, stage, number),
        )  # fmt: skip
        assert self.append(payload).results == []

    def publish(
        self,
        stage: str,
        pieces: int,
        origin: ClientSerial | None = None,
        replace: tuple[str, str] | None = None,
    ) -> EntryResult:
        builder = WriteBatchBuilder()
        if replace:
            builder.add_delete_range(*replace)
        return self.append(
            builder.build(2_000, origin, Staging(StagingKind.PUBLISH, stage, pieces))
        )

    def discard(self, write_id: str) -> None:
        self.append(WriteBatchBuilder().build(3_000, None, Staging(StagingKind.DISCARD, write_id)))

    def user_keys(self) -> dict[str, bytes]:
        return {k: r.value for k, r in self.sm.range_scan("", "")}

    def staged_items(self) -> int:
        return sum(1 for _ in self.kv.scan(*staging.name_range(WRITE)))


@pytest.fixture(params=["memory", "rocks"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Log:
    return Log(MemoryKv() if request.param == "memory" else RocksKv(tmp_path / "kv"))


def test_pieces_stay_invisible_until_one_entry_publishes_them_all(log: Log) -> None:
    stage = f"{WRITE}/1"
    log.append(puts_batch(pa.array(["old"]), pa.array([b"x"]), 500))
    log.piece(stage, 0, ["a", "b"])
    log.piece(stage, 1, ["c"])
    assert log.user_keys() == {"old": b"x"}
    assert log.staged_items() == 2

    result = log.publish(stage, 2, origin=ClientSerial("job", 0))
    assert result.refused is None and not result.duplicate
    assert [r.status for r in result.results] == [Status.OK] * 3
    assert log.user_keys() == {"old": b"x", "a": b"1:a", "b": b"1:b", "c": b"1:c"}
    # One entry: one version each, the publish's timestamp, one change-log record.
    records = dict(log.sm.range_scan("a", "d"))
    assert sorted(r.version_id for r in records.values()) == [1, 2, 3]
    assert {r.modified_ms for r in records.values()} == {2_000}
    [(offset, _, changes)] = log.sm.read_changes(log.head.offset - 1, log.head.offset)
    assert offset == log.head.offset and changes.column("key").to_pylist() == ["a", "b", "c"]
    assert log.staged_items() == 0


def test_a_publish_with_replace_deletes_the_range_in_the_same_entry(log: Log) -> None:
    stage = f"{WRITE}/1"
    log.append(puts_batch(pa.array(["k/1", "k/2", "z"]), pa.array([b"o"] * 3), 500))
    log.piece(stage, 0, ["k/3"])
    log.publish(stage, 1, replace=("k/", "k/~"))
    assert log.user_keys() == {"z": b"o", "k/3": b"1:k/3"}


def test_a_retried_publish_answers_the_first_and_drops_its_own_pieces(log: Log) -> None:
    origin = ClientSerial("spark-write/job", 0)
    log.piece(f"{WRITE}/1", 0, ["a"])
    first = log.publish(f"{WRITE}/1", 1, origin=origin)
    # A second attempt (the caller retried) staged again under its own name.
    log.piece(f"{WRITE}/2", 0, ["a"])
    again = log.publish(f"{WRITE}/2", 1, origin=origin)
    assert again.duplicate
    # The stored results keep versions, not values.
    assert [r.version._replace(value=b"") for r in again.results] == [
        r.version._replace(value=b"") for r in first.results
    ]
    assert log.user_keys() == {"a": b"1:a"}
    assert log.sm.get("a").version_id == 0
    assert log.staged_items() == 0


def test_a_discarded_write_cannot_be_published(log: Log) -> None:
    log.piece(f"{WRITE}/1", 0, ["a"])
    log.piece(f"{WRITE}/2", 0, ["b"])
    assert staging.has_pieces(log.kv, WRITE)
    log.discard(WRITE)
    assert log.staged_items() == 0 and not staging.has_pieces(log.kv, WRITE)

    result = log.publish(f"{WRITE}/1", 1, origin=ClientSerial("job", 0))
    assert result.refused is not None and "1 pieces" in result.refused
    assert log.user_keys() == {}
    # Refused, the serial stays unused: nothing claims the write happened.
    log.piece(f"{WRITE}/3", 0, ["c"])
    assert not log.publish(f"{WRITE}/3", 1, origin=ClientSerial("job", 0)).duplicate
    assert log.user_keys() == {"c": b"3:c"}


def test_a_publish_missing_a_piece_is_refused_and_drops_the_rest(log: Log) -> None:
    log.piece(f"{WRITE}/1", 0, ["a"])
    result = log.publish(f"{WRITE}/1", 2)
    assert result.refused is not None and log.user_keys() == {}
    assert log.staged_items() == 0


def test_old_stages_are_found_by_the_time_of_their_first_piece(log: Log) -> None:
    other = "cd" * 16
    log.piece(f"{WRITE}/1", 0, ["a"], at_ms=1_000)
    log.piece(f"{WRITE}/1", 1, ["b"], at_ms=9_000)
    log.piece(f"{other}/1", 0, ["c"], at_ms=5_000)
    assert staging.writes_staged_before(log.kv, 1_000) == []
    assert staging.writes_staged_before(log.kv, 1_001) == [WRITE]
    assert staging.writes_staged_before(log.kv, 5_001) == [WRITE, other]


def test_pieces_travel_in_snapshots_and_publish_alike_on_every_replica(tmp_path: Path) -> None:
    leader = Log(RocksKv(tmp_path / "leader"))
    leader.piece(f"{WRITE}/1", 0, ["a", "b"])
    leader.piece(f"{WRITE}/1", 1, ["c"])
    view = leader.kv.snapshot()
    follower_kv = MemoryKv()
    install_snapshot(follower_kv, iter_snapshot_chunks(view, leader.head, chunk_bytes=64))
    view.close()
    follower = Log(follower_kv)
    assert follower.head == leader.head != EMPTY_POSITION

    payload = WriteBatchBuilder().build(2_000, None, Staging(StagingKind.PUBLISH, f"{WRITE}/1", 2))
    leader.append(payload)
    follower.append(payload)
    assert follower.user_keys() == leader.user_keys() == {"a": b"1:a", "b": b"1:b", "c": b"1:c"}
    assert follower.sm.state_digest() == leader.sm.state_digest()
