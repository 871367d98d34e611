"""The archive's manifest logic (retention, fencing, restore plans, leftovers) and object
encodings, without I/O but the local store's."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from quorumstore.archive.manifest import (
    ArchiveError,
    ArchiveFenced,
    Manifest,
    SegmentRef,
    SnapshotRef,
    plan_restore,
    segment_name,
    snapshot_name,
)
from quorumstore.archive.objects import (
    check_chain,
    decode_segment,
    encode_segment,
    entry_times,
    frame_chunks,
    read_framed_chunks,
)
from quorumstore.archive.shipper import ArchiveSettings, ArchiveShipper
from quorumstore.archive.store import ArchiveStore
from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, chain_checksum
from quorumstore.storage.write_batch import WriteBatchBuilder

SHARD = ("default", 0)


def _log(count: int, times: list[int] | None = None) -> list[LogEntry]:
    entries, previous = [], EMPTY_POSITION.checksum
    for offset in range(count):
        payload = WriteBatchBuilder().build(times[offset] if times else 1000 + offset)
        previous = chain_checksum(previous, 1, offset, payload)
        entries.append(LogEntry(1, offset, previous, payload))
    return entries


def _position(entry: LogEntry) -> LogPosition:
    return LogPosition(entry.term, entry.offset, entry.checksum)


def _snapshot(entries: list[LogEntry], offset: int, time_ms: int) -> SnapshotRef:
    return SnapshotRef(snapshot_name(offset, f"s{offset}"), _position(entries[offset]), time_ms, 1)


def _segment(entries: list[LogEntry], first: int, last: int) -> SegmentRef:
    return SegmentRef(
        segment_name(first, last, f"g{first}"),
        first,
        _position(entries[last]),
        1000 + first,
        1000 + last,
        1,
    )


def _archive(entries: list[LogEntry]) -> Manifest:
    """Snapshots at 0 and 10, segments 1-9 and 10-19."""
    manifest, _ = Manifest.empty(SHARD, 1).with_snapshot(_snapshot(entries, 0, 1000), keep=3)
    manifest = manifest.with_segment(_segment(entries, 1, 9))
    manifest, _ = manifest.with_snapshot(_snapshot(entries, 9, 1009), keep=3)
    return manifest.with_segment(_segment(entries, 10, 19))


def test_a_manifest_reads_back_as_written() -> None:
    manifest = _archive(_log(20))
    assert Manifest.from_json(manifest.to_json(), "m") == manifest
    with pytest.raises(ArchiveError, match="unreadable"):
        Manifest.from_json(manifest.to_json()[:-5], "m")


def test_segments_continue_the_head_only() -> None:
    entries = _log(20)
    with pytest.raises(ValueError, match="not after the head"):
        _archive(entries).with_segment(_segment(entries, 5, 19))


def test_a_newer_terms_manifest_fences_an_older_writer() -> None:
    manifest = _archive(_log(20)).fence(4)
    assert manifest.term == 4
    with pytest.raises(ArchiveFenced):
        manifest.fence(3)


def test_retention_keeps_the_newest_snapshots_and_the_segments_they_need() -> None:
    entries = _log(30)
    manifest = _archive(entries)
    kept, dropped = manifest.with_snapshot(_snapshot(entries, 19, 1019), keep=2)
    assert [s.position.offset for s in kept.snapshots] == [9, 19]
    assert [s.first for s in kept.segments] == [10]
    assert dropped == sorted([manifest.snapshots[0].name, manifest.segments[0].name])


def test_a_snapshot_past_the_head_restarts_the_chain() -> None:
    entries = _log(40)
    manifest, _ = _archive(entries).with_snapshot(_snapshot(entries, 30, 1030), keep=5)
    assert manifest.head == _position(entries[30])
    assert plan_restore(manifest, 30, None).snapshot.position.offset == 30
    with pytest.raises(ArchiveError, match="no entries 20-25"):
        plan_restore(manifest, 25, None)


def test_a_plan_by_offset_starts_at_the_last_snapshot_before_it() -> None:
    manifest = _archive(_log(20))
    plan = plan_restore(manifest, 15, None)
    assert (plan.snapshot.position.offset, [s.first for s in plan.segments]) == (9, [10])
    assert plan.target_offset == 15
    assert plan_restore(manifest, None, None).target_offset == 19
    with pytest.raises(ArchiveError, match="past the last archived entry 19"):
        plan_restore(manifest, 20, None)
    kept, _ = manifest.with_snapshot(_snapshot(_log(20), 19, 1019), keep=1)
    with pytest.raises(ArchiveError, match="before the oldest kept snapshot, at offset 19"):
        plan_restore(kept, 12, None)


def test_a_plan_by_time_takes_the_segments_written_by_then() -> None:
    manifest = _archive(_log(20))
    plan = plan_restore(manifest, None, 1005)
    assert (plan.snapshot.position.offset, [s.first for s in plan.segments]) == (0, [1])
    assert plan_restore(manifest, None, 1012).snapshot.position.offset == 9
    with pytest.raises(ArchiveError, match="before the oldest kept snapshot"):
        plan_restore(manifest, None, 999)


def test_leftovers_are_unnamed_objects_below_the_oldest_snapshot_only() -> None:
    entries = _log(30)
    manifest, _ = _archive(entries).with_snapshot(_snapshot(entries, 19, 1019), keep=1)
    cut = segment_name(3, 8, "cut")
    temporary = "segments/." + segment_name(2, 4, "x").split("/")[1] + ".abc.tmp"
    later = segment_name(20, 25, "in-flight")
    odd = "segments/something-else"
    names = [cut, temporary, later, odd, *manifest.names()]
    assert sorted(manifest.leftovers(names)) == sorted([cut, temporary])


def test_segments_carry_entries_and_never_decreasing_times() -> None:
    entries = _log(5, times=[10, 30, 20, 0, 50])
    times = entry_times(entries, floor_ms=15)
    assert times == [15, 30, 30, 30, 50]
    decoded, decoded_times = decode_segment(encode_segment(entries, times), "s")
    assert (decoded, decoded_times) == (entries, times)
    assert check_chain(EMPTY_POSITION, decoded, "s") == _position(entries[-1])
    with pytest.raises(ArchiveError, match="does not follow"):
        check_chain(EMPTY_POSITION, decoded[1:], "s")
    with pytest.raises(ArchiveError, match="damaged"):
        decode_segment(b"not arrow", "s")


def test_a_cut_snapshot_object_is_refused() -> None:
    data = b"".join(frame_chunks([b"abc", b"defgh"]))
    assert list(read_framed_chunks(io.BytesIO(data), "x")) == [b"abc", b"defgh"]
    with pytest.raises(ArchiveError, match="ends inside a chunk"):
        list(read_framed_chunks(io.BytesIO(data[:-1]), "x"))


def test_the_local_store_names_only_what_it_completed(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path / "archive"))
    assert store.load_manifest(SHARD) is None and store.load_metadata() is None
    manifest = _archive(_log(20))
    store.save_manifest(manifest)
    assert store.load_manifest(SHARD) == manifest
    name = segment_name(1, 9, "x")
    assert store.put(SHARD, name, b"payload") == 7
    assert store.get(SHARD, name) == b"payload"
    assert name in store.names(SHARD)
    with pytest.raises(ArchiveError, match="lacks"):
        store.get(SHARD, segment_name(1, 2, "missing"))
    assert not list((tmp_path / "archive").rglob("*.tmp"))


def test_a_deposed_leader_deletes_nothing_a_newer_leaders_manifest_names(tmp_path: Path) -> None:
    """Retention runs after a manifest is saved; by then a leader of a newer term may have
    saved its own, which still names what the deposed one dropped."""
    store = ArchiveStore(str(tmp_path / "archive"))
    entries = _log(30)
    base = _archive(entries)
    for name in base.names():
        store.put(SHARD, name, b"x")
    shipper = ArchiveShipper(store, ArchiveSettings(), list, ThreadPoolExecutor(1), "n1")
    deposed, dropped = base.with_snapshot(_snapshot(entries, 19, 1019), keep=1)
    assert dropped
    newer = base.fence(2)  # the new leader's manifest, saved after the deposed one's
    store.save_manifest(newer)
    shipper._delete(deposed, dropped)
    assert set(newer.names()) <= set(store.names(SHARD))
    # Its own manifest still in place, a leader deletes what its retention dropped.
    store.save_manifest(deposed)
    shipper._delete(deposed, dropped)
    assert not set(dropped) & set(store.names(SHARD))
