"""A node's archive shipper: a background task that copies the shards it leads to the
archive, off the write path.

Only a shard's leader ships it: the leader holds every committed entry, and one writer
per shard uploads each entry once. A leader learns where the archive stands from the
shard's manifest (`manifest.py`), not from memory, so a new leader continues from
where the last one stopped, whichever node that was. Every round (a second apart, or at
once when an archive-sync write waits) it, per led shard:

1. reads the manifest, refusing one a newer term wrote, and checks that the archived
   head is an entry of its own log (same chain checksum): the archive of another
   history, such as one a point-in-time restore branched from, is never extended;
2. uploads a KV snapshot first when the archive has none, or when the log no longer
   holds the entries after the archived head (WAL retention trimmed them while the
   archive was unreachable): the chain restarts at the snapshot;
3. uploads committed entries after the head as segments, each followed by a manifest
   that names it;
4. once `snapshot_entries` entries were archived since the last snapshot, uploads
   another (the entries up to its position first); the manifest then drops the
   snapshots beyond `keep_snapshots` and the segments no kept snapshot needs, whose
   objects are deleted;
5. merges runs of small segments into one (`Manifest.merge_run`), so that the manifest,
   read and written whole every round, stays small however small the rounds are (one
   entry each with `--archive-sync`). The merged segment holds the same entries and
   times under a fresh name; the manifest that names it instead of the run is saved as
   any other. The objects of the run are not deleted then: a restore or export planned
   from an earlier manifest may still read them. They are leftovers from then on, and
   go when retention passes them (`Manifest.leftovers`), as they would have unmerged.

A failed round is logged and retried the next; writes go on meanwhile, and the lag
(`lag`) grows until the archive is back.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

from quorumstore.archive.manifest import (
    ArchiveError,
    Manifest,
    SegmentRef,
    SnapshotRef,
    segment_name,
    snapshot_name,
)
from quorumstore.archive.objects import (
    check_chain,
    decode_segment,
    encode_segment,
    entry_times,
    frame_chunks,
)
from quorumstore.archive.store import ArchiveStore
from quorumstore.protocol.messages import ShardKey
from quorumstore.protocol.types import LogEntry, LogPosition
from quorumstore.storage.kv import KvStore
from quorumstore.storage.reads import ShardReader
from quorumstore.storage.snapshot import iter_snapshot_chunks

log = logging.getLogger(__name__)

#: Entries up to a snapshot's position searched for its time (`_snapshot_time`).
_SNAPSHOT_TIME_LOOKBACK = 64
#: Merges per shard and round at most (each takes `merge_fanout` segments or fewer): a
#: round adds one segment, so one would do; more catch up with a manifest grown before.
_MERGES_PER_ROUND = 8


@dataclass(frozen=True)
class ArchiveSettings:
    #: A write is answered only once its entry is archived (docs/archive.md).
    sync: bool = False
    #: Entries archived between two snapshots.
    snapshot_entries: int = 100_000
    #: Snapshots kept; the segments after the oldest of them are kept too.
    keep_snapshots: int = 3
    #: Seconds between rounds (an archive-sync write starts one at once).
    interval_s: float = 1.0
    #: Bounds of one segment.
    segment_entries: int = 4096
    segment_bytes: int = 16 << 20
    #: Small segments merged into one at a time (`Manifest.merge_run`).
    merge_fanout: int = 16

    def __post_init__(self) -> None:
        if (
            self.snapshot_entries < 1
            or self.keep_snapshots < 1
            or self.interval_s <= 0
            or self.merge_fanout < 2
        ):
            raise ValueError(
                "the archive needs snapshot_entries >= 1, keep_snapshots >= 1, "
                f"interval_s > 0 and merge_fanout >= 2, got {self}"
            )


class _Log(Protocol):
    @property
    def base(self) -> LogPosition: ...

    @property
    def head(self) -> LogPosition: ...

    def position_at(self, offset: int) -> LogPosition: ...

    def read(self, from_offset: int, max_entries: int, max_bytes: int) -> Sequence[LogEntry]: ...


class _Replica(Protocol):
    @property
    def term(self) -> int: ...

    @property
    def commit_offset(self) -> int: ...


class ArchiveSource(Protocol):
    """A shard replica the shipper reads (a `ShardHost`)."""

    @property
    def shard(self) -> ShardKey: ...

    @property
    def wal(self) -> _Log: ...

    @property
    def kv(self) -> KvStore: ...

    @property
    def replica(self) -> _Replica: ...

    def is_leader(self) -> bool: ...


@dataclass(frozen=True)
class ArchiveLag:
    archived_offset: int
    #: Committed entries not archived yet.
    entries: int
    #: Age of the oldest of them.
    seconds: float
    #: Why the last round failed; empty once one succeeds.
    error: str


@dataclass
class _ShardState:
    head: int = -1
    error: str = ""
    #: (commit offset, monotonic time first seen): when entries past the head committed.
    commits: collections.deque[tuple[int, float]] = field(default_factory=collections.deque)
    #: Archive-sync writes waiting: (offset, future).
    waiters: list[tuple[int, asyncio.Future[bool]]] = field(default_factory=list)

    def saw_commit(self, offset: int) -> None:
        if offset > self.head and (not self.commits or offset > self.commits[-1][0]):
            self.commits.append((offset, time.monotonic()))

    def archived(self, head: int) -> None:
        self.head = head
        # The last sample at or below the head still dates the entries right after it.
        while len(self.commits) > 1 and self.commits[1][0] <= head:
            self.commits.popleft()
        if self.commits and self.commits[0][0] <= head:
            self.commits.popleft()
        self._resolve(lambda offset: offset <= head, True)

    def abandon(self) -> None:
        self._resolve(lambda offset: True, False)

    def _resolve(self, which: Callable[[int], bool], value: bool) -> None:
        keep = []
        for offset, future in self.waiters:
            if which(offset):
                if not future.done():
                    future.set_result(value)
            else:
                keep.append((offset, future))
        self.waiters = keep


class ArchiveShipper:
    def __init__(
        self,
        store: ArchiveStore,
        settings: ArchiveSettings,
        sources: Callable[[], list[ArchiveSource]],
        executor: Executor,
        name: str,
    ):
        self.store = store
        self.settings = settings
        self._sources = sources
        self._io = executor
        self._name = name
        self._states: dict[ShardKey, _ShardState] = {}
        self._wake = asyncio.Event()

    async def run(self) -> None:
        """Ships until cancelled."""
        try:
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), self.settings.interval_s)
                except TimeoutError:
                    pass
                self._wake.clear()
                await self._round()
        finally:
            for state in self._states.values():
                state.abandon()

    def lag(self, source: ArchiveSource) -> ArchiveLag:
        state = self._states.setdefault(source.shard, _ShardState())
        commit = source.replica.commit_offset
        state.saw_commit(commit)
        entries = max(0, commit - state.head)
        seconds = time.monotonic() - state.commits[0][1] if entries and state.commits else 0.0
        return ArchiveLag(state.head, entries, seconds, state.error)

    async def archived(self, shard: ShardKey, offset: int) -> bool:
        """Whether the entry at `offset` made it to the archive (False: this node stopped
        leading the shard first, or the shipper stopped)."""
        state = self._states.setdefault(shard, _ShardState())
        if state.head >= offset:
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        state.waiters.append((offset, future))
        self._wake.set()
        return await future

    async def _round(self) -> None:
        led = {s.shard: s for s in self._sources() if s.is_leader()}
        for shard, state in self._states.items():
            if shard not in led:
                state.abandon()
        for shard, source in sorted(led.items()):
            state = self._states.setdefault(shard, _ShardState())
            state.saw_commit(source.replica.commit_offset)
            try:
                await self._ship(source, state)
                state.error = ""
            except Exception as e:  # noqa: BLE001 - an unreachable archive is retried next round
                error = f"{type(e).__name__}: {e}"
                if error != state.error:
                    log.warning(
                        "node %s: archiving shard %s/%s failed (%s); writes go on, retrying",
                        self._name,
                        shard[0],
                        shard[1],
                        error,
                    )
                state.error = error

    async def _io_call(self, fn: Callable[..., object], *args: object) -> object:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    async def _load(self, shard: ShardKey, term: int) -> Manifest:
        loaded = await self._io_call(self.store.load_manifest, shard)
        assert loaded is None or isinstance(loaded, Manifest)
        return (loaded or Manifest.empty(shard, term)).fence(term)

    async def _save(self, base: Manifest, new: Manifest) -> None:
        """Saves `new`, made from `base`, unless a newer term wrote the manifest since."""
        await self._load(base.shard, base.term)
        await self._io_call(self.store.save_manifest, new)

    async def _ship(self, source: ArchiveSource, state: _ShardState) -> None:
        shard, term = source.shard, source.replica.term
        manifest = await self._load(shard, term)
        state.archived(manifest.head.offset)
        _check_same_history(source, manifest)
        if not manifest.snapshots or manifest.head.offset < source.wal.base.offset:
            # The first snapshot, or the log lost what follows the head: the chain restarts.
            manifest = await self._ship_snapshot(source, manifest, state)
        manifest = await self._ship_entries(source, manifest, state, source.replica.commit_offset)
        if manifest.entries_since_snapshot() >= self.settings.snapshot_entries:
            manifest = await self._ship_snapshot(source, manifest, state)
        await self._merge_segments(source, manifest)

    async def _merge_segments(self, source: ArchiveSource, manifest: Manifest) -> Manifest:
        """Merges runs of small segments (`Manifest.merge_run`), while leading in the
        manifest's term, and saves the manifest that names the merged ones instead."""
        merged = manifest
        for _ in range(_MERGES_PER_ROUND):
            if not (source.is_leader() and source.replica.term == manifest.term):
                break
            run = merged.merge_run(
                self.settings.merge_fanout,
                self.settings.segment_entries,
                self.settings.segment_bytes,
            )
            if not run:
                break
            segment = await self._io_call(self._merge, merged.shard, run)
            assert isinstance(segment, SegmentRef)
            merged = merged.with_merged(segment)
        if merged is not manifest:
            await self._save(manifest, merged)
        return merged

    def _merge(self, shard: ShardKey, run: Sequence[SegmentRef]) -> SegmentRef:
        """Uploads one segment holding the entries and times of `run`, read back from the
        archive (which holds them whether or not the log still does, and holds the times
        exactly as archived) and checked to chain."""
        entries: list[LogEntry] = []
        times: list[int] = []
        for segment in run:
            got, got_times = decode_segment(self.store.get(shard, segment.name), segment.name)
            if [e.offset for e in got] != list(range(segment.first, segment.last.offset + 1)):
                raise ArchiveError(
                    f"archived segment {segment.name} does not hold the entries "
                    f"{segment.first}-{segment.last.offset} its name says"
                )
            entries += got
            times += got_times
        first, last = entries[0], run[-1].last
        start = LogPosition(first.term, first.offset, first.checksum)
        if check_chain(start, entries[1:], f"{run[0].name} to {run[-1].name}") != last:
            raise ArchiveError(
                f"archived segments {run[0].name} to {run[-1].name} do not end at {last}"
            )
        name = segment_name(first.offset, last.offset, uuid.uuid4().hex)
        size = self.store.put(shard, name, encode_segment(entries, times))
        return SegmentRef(name, first.offset, last, times[0], times[-1], size)

    async def _ship_entries(
        self, source: ArchiveSource, manifest: Manifest, state: _ShardState, upto: int
    ) -> Manifest:
        """Archives the committed entries after the head through `upto`, while leading in
        the manifest's term."""
        while (
            source.is_leader()
            and source.replica.term == manifest.term
            and manifest.head.offset < upto
        ):
            start = manifest.head.offset + 1
            entries = source.wal.read(
                start,
                min(self.settings.segment_entries, upto - start + 1),
                self.settings.segment_bytes,
            )
            if not entries:
                break
            manifest = await self._ship_segment(manifest, entries)
            state.archived(manifest.head.offset)
        return manifest

    async def _ship_segment(self, manifest: Manifest, entries: Sequence[LogEntry]) -> Manifest:
        def upload() -> SegmentRef:
            times = entry_times(entries, manifest.head_time_ms)
            first, last = entries[0], entries[-1]
            name = segment_name(first.offset, last.offset, uuid.uuid4().hex)
            size = self.store.put(manifest.shard, name, encode_segment(entries, times))
            return SegmentRef(
                name,
                first.offset,
                LogPosition(last.term, last.offset, last.checksum),
                times[0],
                times[-1],
                size,
            )

        segment = await self._io_call(upload)
        assert isinstance(segment, SegmentRef)
        new = manifest.with_segment(segment)
        await self._save(manifest, new)
        return new

    async def _ship_snapshot(
        self, source: ArchiveSource, manifest: Manifest, state: _ShardState
    ) -> Manifest:
        """Archives a snapshot of the KV; the entries up to its position first, where the
        log still holds them, so that no point before it loses its entries."""
        view = source.kv.snapshot()
        try:
            position = ShardReader(view).applied_position
            if manifest.snapshots and manifest.head.offset >= source.wal.base.offset:
                manifest = await self._ship_entries(source, manifest, state, position.offset)
                if manifest.head.offset < position.offset:
                    return manifest  # stopped leading meanwhile
            name = snapshot_name(position.offset, uuid.uuid4().hex)
            taken_ms = _snapshot_time(source.wal, position, manifest)

            def upload() -> int:
                chunks = frame_chunks(iter_snapshot_chunks(view, position))
                return self.store.put_stream(manifest.shard, name, chunks)

            size = await self._io_call(upload)
        finally:
            view.close()
        assert isinstance(size, int)
        snapshot = SnapshotRef(name, position, taken_ms, size)
        new, dropped = manifest.with_snapshot(snapshot, self.settings.keep_snapshots)
        await self._save(manifest, new)
        log.info(
            "node %s: archived a snapshot of shard %s/%s at %s (%d bytes)",
            self._name,
            manifest.shard[0],
            manifest.shard[1],
            position,
            size,
        )
        await self._io_call(self._delete, new, dropped)
        state.archived(new.head.offset)
        return new

    def _delete(self, manifest: Manifest, dropped: list[str]) -> None:
        """Deletes what retention dropped and what cut uploads and merges left below it
        (`Manifest.leftovers`), only while the archive's manifest is still the one this
        leader saved: a newer leader may have saved one since that still names what this
        one dropped, and its own retention deletes what it drops."""
        if self.store.load_manifest(manifest.shard) != manifest:
            log.info(
                "node %s: shard %s/%s's manifest changed since this leader saved it; "
                "leaving retention to its writer",
                self._name,
                manifest.shard[0],
                manifest.shard[1],
            )
            return
        leftovers = manifest.leftovers(self.store.names(manifest.shard))
        self.store.delete(manifest.shard, sorted(set(dropped) | set(leftovers)))


def _snapshot_time(wal: _Log, position: LogPosition, manifest: Manifest) -> int:
    """The time of the entry a snapshot ends with (the latest time among the entries up
    to it: no-ops carry none), so that a point in time after it finds the snapshot; the
    wall clock (later than all it holds) where the log holds no time for it."""
    stamp = 0
    if wal.base.offset < position.offset <= wal.head.offset:
        first = max(wal.base.offset + 1, position.offset - _SNAPSHOT_TIME_LOOKBACK + 1)
        entries = wal.read(first, position.offset - first + 1, 1 << 62)
        stamp = entry_times(entries, 0)[-1]
    if position.offset >= manifest.head.offset:
        stamp = max(stamp, manifest.head_time_ms) if stamp else 0
    return stamp or int(time.time() * 1000)


def _check_same_history(source: ArchiveSource, manifest: Manifest) -> None:
    """Raises ArchiveError if the archived head is not an entry of this leader's log. A
    leader holds every committed entry, and only committed entries are archived, so an
    archive past its log, or with another entry at its head, holds another history."""
    head, wal = manifest.head, source.wal
    if head.offset < 0 or head.offset < wal.base.offset:
        return  # nothing archived, or before what the log holds: a snapshot follows
    if head.offset > wal.head.offset or wal.position_at(head.offset).checksum != head.checksum:
        raise ArchiveError(
            f"the archive of shard {manifest.shard[0]}/{manifest.shard[1]} holds another history than this cluster "
            f"(archived head {head}, log head {wal.head}); a cluster restored to an earlier "
            "point must archive to another URL"
        )
