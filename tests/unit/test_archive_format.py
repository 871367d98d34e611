"""The archive's manifest logic (retention, fencing, restore plans, leftovers) and object
encodings, without I/O but the local store's."""

from __future__ import annotations

import asyncio
import io
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
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
from quorumstore.archive.restore import LatestRestore, rebuild_shard
from quorumstore.archive.shipper import ArchiveSettings, ArchiveShipper
from quorumstore.archive.store import ArchiveStore
from quorumstore.protocol.coordinator import initial_metadata
from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition, chain_checksum
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.snapshot import iter_snapshot_chunks
from quorumstore.storage.state_machine import ShardStateMachine
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


def test_a_restore_plan_reads_back_as_written_and_names_only_archived_objects() -> None:
    manifest = _archive(_log(20))
    metadata = initial_metadata(["n1", "n2", "n3"], {"default": 1}, 3)
    restore = LatestRestore("/a", "abc123", metadata, {SHARD: plan_restore(manifest, 15, None)})
    assert LatestRestore.from_json(restore.to_json(), "p") == restore
    with pytest.raises(ArchiveError, match="p holds no restore plan"):
        LatestRestore.from_json(restore.to_json()[:-3], "p")
    # Object names are paths under the shard's prefix: a plan must not climb out of it.
    climbing = restore.to_json().replace(b"snapshots/", b"snapshots/../../", 1)
    with pytest.raises(ArchiveError, match="is not the name of an archived object"):
        LatestRestore.from_json(climbing, "p")


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


# ------------------------------------------------------------------ merged segments


def _small_segments(entries: list[LogEntry], upto: int) -> Manifest:
    """A snapshot at 0, then one segment per entry 1..upto (archive-sync rounds)."""
    manifest, _ = Manifest.empty(SHARD, 1).with_snapshot(_snapshot(entries, 0, 1000), keep=3)
    for offset in range(1, upto + 1):
        manifest = manifest.with_segment(_segment(entries, offset, offset))
    return manifest


def _merged(entries: list[LogEntry], run: tuple[SegmentRef, ...]) -> SegmentRef:
    first, last = run[0].first, run[-1].last.offset
    return SegmentRef(
        segment_name(first, last, f"m{first}"),
        first,
        _position(entries[last]),
        run[0].first_time_ms,
        run[-1].last_time_ms,
        sum(s.size for s in run),
    )


def test_a_merged_segment_replaces_exactly_the_run_it_covers() -> None:
    entries = _log(30)
    manifest = _small_segments(entries, 20)
    run = manifest.segments[2:7]  # entries 3-7
    merged = manifest.with_merged(_merged(entries, run))
    assert [(s.first, s.last.offset) for s in merged.segments][:4] == [
        (1, 1),
        (2, 2),
        (3, 7),
        (8, 8),
    ]
    assert len(merged.segments) == 16
    assert (merged.head, merged.head_time_ms, merged.snapshots) == (
        manifest.head,
        manifest.head_time_ms,
        manifest.snapshots,
    )
    assert manifest.names() - merged.names() == {s.name for s in run}
    assert Manifest.from_json(merged.to_json(), "m") == merged
    for bad in [
        _merged(entries, run[:1]),  # one segment: nothing to merge
        replace(_merged(entries, run), first=0),  # starts where no segment does
        replace(_merged(entries, run), last=_position(entries[6])),  # ends early
        replace(_merged(entries, run), last=LogPosition(1, 7, 12345)),  # another checksum
        replace(_merged(entries, run), first_time_ms=999),
        replace(_merged(entries, run), last_time_ms=1008),
    ]:
        with pytest.raises(ValueError):
            manifest.with_merged(bad)


def test_no_merge_spans_a_snapshot_or_a_gap() -> None:
    entries = _log(40)
    manifest = _small_segments(entries, 12)
    manifest, _ = manifest.with_snapshot(_snapshot(entries, 12, 1012), keep=5)
    for offset in range(13, 20):
        manifest = manifest.with_segment(_segment(entries, offset, offset))
    manifest, _ = manifest.with_snapshot(_snapshot(entries, 25, 1025), keep=5)  # past the head
    for offset in range(26, 34):
        manifest = manifest.with_segment(_segment(entries, offset, offset))
    across_snapshot = tuple(s for s in manifest.segments if 10 <= s.first <= 14)
    across_gap = tuple(s for s in manifest.segments if 18 <= s.first <= 27)
    for run in (across_snapshot, across_gap):
        with pytest.raises(ValueError, match="gap or a snapshot"):
            manifest.with_merged(_merged(entries, run))
    # Runs stop at both, so every point restores as before.
    while run := manifest.merge_run(fanout=3, max_entries=64, max_bytes=1 << 20):
        manifest = manifest.with_merged(_merged(entries, run))
    spans = [(s.first, s.last.offset) for s in manifest.segments]
    assert [(a, b) for a, b in spans if a <= 12 < b or (a <= 19 and b >= 26)] == []
    assert len(spans) < len(entries) // 3
    for offset in [5, 12, 16, 19, 26, 30, 33]:
        plan = plan_restore(manifest, offset, None)
        assert plan.segments == () or plan.segments[0].first == plan.snapshot.position.offset + 1


def _simulate(sizes: list[int], fanout: int, max_entries: int, snapshot_every: int) -> list[int]:
    """Rounds of `sizes` entries each, each followed by the merges a shipper does (up
    to 8); returns the segment count after every round."""
    entries = [LogEntry(1, offset, offset, b"") for offset in range(sum(sizes) + 1)]
    manifest, _ = Manifest.empty(SHARD, 1).with_snapshot(_snapshot(entries, 0, 1000), keep=3)
    counts = []
    for size in sizes:
        first = manifest.head.offset + 1
        manifest = manifest.with_segment(_segment(entries, first, first + size - 1))
        if manifest.entries_since_snapshot() >= snapshot_every:
            snap = _snapshot(entries, manifest.head.offset, 1000 + manifest.head.offset)
            manifest, _ = manifest.with_snapshot(snap, keep=3)
        for _ in range(8):
            run = manifest.merge_run(fanout, max_entries, max_bytes=1 << 30)
            if not run:
                break
            manifest = manifest.with_merged(_merged(entries, run))
        counts.append(len(manifest.segments))
    return counts


def test_the_manifest_stays_bounded_however_many_rounds_ran() -> None:
    # One entry per round (archive-sync), 3 kept snapshots 2,000 entries apart.
    counts = _simulate([1] * 12_000, fanout=8, max_entries=512, snapshot_every=2000)
    # Per interval: at most 2000 / 256 large segments and fewer than 8 small ones
    # between two of them; 3 intervals kept plus the one being written.
    assert max(counts) <= 4 * (8 + 9 * 7), max(counts)
    assert max(counts) < 50  # in practice: a few merged levels per interval
    # Rounds of mixed sizes never strand more than fanout - 1 small segments in a row.
    sizes = [random.Random(7).choice([1, 2, 5, 9, 17, 40, 300]) for _ in range(4000)]
    counts = _simulate(sizes, fanout=8, max_entries=512, snapshot_every=20_000)
    assert max(counts) <= 3 * (sum(sizes) // 256 + 1) * 8, max(counts)


def _quiet(line: str) -> None:
    pass


class _Leader:
    """What `ArchiveShipper._merge_segments` asks of a shard replica."""

    shard = SHARD

    class replica:  # the attribute ArchiveSource names
        term = 1

    @staticmethod
    def is_leader() -> bool:
        return True


def test_merging_through_the_shipper_restores_every_point_as_before(tmp_path: Path) -> None:
    """1-entry segments with snapshots at -1 (empty) and 60, merged by the shipper until
    no run is left: every restore (latest, by offset, by time) rebuilds the same KV at
    the same position, and the merged-away objects stay until retention passes them."""
    store = ArchiveStore(str(tmp_path / "archive"))
    count, middle = 150, 60
    entries, previous = [], EMPTY_POSITION.checksum
    for offset in range(count):
        batch = WriteBatchBuilder()
        batch.add_put(f"/k/{offset % 37:02d}", b"v%d" % offset)
        if offset % 11 == 0:
            batch.add_delete(f"/k/{(offset + 5) % 37:02d}")
        payload = batch.build(10_000 + offset // 3)  # times shared by neighbours
        previous = chain_checksum(previous, 1, offset, payload)
        entries.append(LogEntry(1, offset, previous, payload))
    times = entry_times(entries, 0)

    def snapshot_at(position: LogPosition, time_ms: int) -> SnapshotRef:
        kv = RocksKv(tmp_path / f"kv{position.offset}")
        ShardStateMachine(kv).apply(entries[: position.offset + 1])
        view = kv.snapshot()
        name = snapshot_name(position.offset, "s")
        size = store.put_stream(SHARD, name, frame_chunks(iter_snapshot_chunks(view, position)))
        view.close()
        kv.close()
        return SnapshotRef(name, position, time_ms, size)

    manifest, _ = Manifest.empty(SHARD, 1).with_snapshot(snapshot_at(EMPTY_POSITION, 1), keep=3)
    for entry, time_ms in zip(entries, times):
        name = segment_name(entry.offset, entry.offset, "one")
        size = store.put(SHARD, name, encode_segment([entry], [time_ms]))
        ref = SegmentRef(name, entry.offset, _position(entry), time_ms, time_ms, size)
        manifest = manifest.with_segment(ref)
        if entry.offset == middle:
            snap = snapshot_at(_position(entry), time_ms)
            manifest, _ = manifest.with_snapshot(snap, keep=3)
    store.save_manifest(manifest)

    points: list[tuple[int | None, int | None]] = [(None, None)]
    points += [(offset, None) for offset in (0, 7, 59, 60, 61, 100, count - 1)]
    points += [(None, t) for t in (times[0], times[30], times[61], times[90] + 1, times[-1])]

    def restored(m: Manifest, tag: str) -> list[tuple[LogPosition, list[tuple[bytes, bytes]]]]:
        out = []
        for i, (offset, time_ms) in enumerate(points):
            path = tmp_path / f"{tag}{i}"
            position = rebuild_shard(store, SHARD, plan_restore(m, offset, time_ms), path, _quiet)
            kv = RocksKv(path)
            out.append((position, [(k, bytes(v)) for k, v in kv.scan(b"", None)]))
            kv.close()
        return out

    before = restored(manifest, "before")
    assert [p.offset for p, _ in before][:8] == [count - 1, 0, 7, 59, 60, 61, 100, count - 1]

    settings = ArchiveSettings(segment_entries=32, segment_bytes=1 << 20, merge_fanout=4)
    with ThreadPoolExecutor(1) as executor:
        shipper = ArchiveShipper(store, settings, list, executor, "n1")
        merged = manifest
        while True:
            again = asyncio.run(shipper._merge_segments(_Leader(), merged))  # type: ignore[arg-type]
            if again == merged:
                break
            merged = again
    assert store.load_manifest(SHARD) == merged
    assert len(merged.segments) < 20 and merged.head == manifest.head
    assert restored(merged, "after") == before
    # Nothing deleted yet: restores planned from the old manifest still find their objects.
    assert manifest.names() <= set(store.names(SHARD))
    unnamed = set(store.names(SHARD)) - merged.names()
    assert manifest.names() - merged.names() <= unnamed  # and the merges of lower levels
    assert all(name.startswith("segments/") for name in unnamed)
    # Once retention passes them, they are leftovers and go.
    newest = snapshot_at(_position(entries[-1]), times[-1])
    kept, dropped = merged.with_snapshot(newest, keep=1)
    store.save_manifest(kept)
    shipper._delete(kept, dropped)
    # (A piece ending right at the oldest snapshot goes with the next retention.)
    assert set(store.names(SHARD)) - kept.names() == {segment_name(count - 1, count - 1, "one")}
