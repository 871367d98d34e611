"""A shard's archive manifest: the only index of what the archive holds, and the plans made
from it. No I/O here: `store.py` reads and writes manifests, `shipper.py` and
`restore.py` act on the plans.

Objects (segments of committed entries, KV snapshots) are uploaded under fresh names
first and named by a manifest only once complete, and a manifest is replaced whole in
one step; so a reader sees completed objects only, whatever an upload killed halfway
left behind.

Leaders of successive terms write one shard's manifest. Each appends to the manifest it
read, starting right after its `head`, so every manifest is gap-free from each snapshot
on; a writer refuses a manifest written in a newer term than its own (`ArchiveFenced`).
A snapshot whose position lies past the head (the log no longer held what came between)
restarts the chain there.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from quorumstore.protocol.messages import ShardKey
from quorumstore.protocol.types import EMPTY_POSITION, LogPosition

#: Manifest format; a reader refuses another.
FORMAT = 1
#: An archived object's name (`segment_name`, `snapshot_name`): read as a path under its
#: shard's prefix, so nothing that could climb out of it.
_OBJECT_NAME = re.compile(r"(segments|snapshots)/[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


class ArchiveError(ValueError):
    """The archive cannot give what was asked: nothing archived, a point outside what is
    kept, a damaged object. Its message says which and what to do."""


class ArchiveFenced(ArchiveError):
    """A leader of a newer term writes this shard's manifest."""


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    name: str
    position: LogPosition
    #: Wall clock when taken: every entry it holds was written before.
    time_ms: int
    size: int


@dataclass(frozen=True, slots=True)
class SegmentRef:
    name: str
    first: int
    #: Position of its last entry.
    last: LogPosition
    #: Entry times (the leaders' clocks, never decreasing along the log) of its ends.
    first_time_ms: int
    last_time_ms: int
    size: int


@dataclass(frozen=True, slots=True)
class Manifest:
    shard: ShardKey
    #: Term of the leader that wrote it.
    term: int
    #: Last archived position: the newest snapshot's or the last segment's end.
    head: LogPosition
    head_time_ms: int
    snapshots: tuple[SnapshotRef, ...] = ()
    segments: tuple[SegmentRef, ...] = ()

    @staticmethod
    def empty(shard: ShardKey, term: int) -> Manifest:
        return Manifest(shard, term, EMPTY_POSITION, 0)

    def fence(self, term: int) -> Manifest:
        """This manifest to be written by the leader of `term`; raises ArchiveFenced if
        a newer leader wrote it."""
        if self.term > term:
            raise ArchiveFenced(
                f"the archive of shard {_name(self.shard)} is written by a leader of term "
                f"{self.term}, newer than {term}"
            )
        return replace(self, term=term)

    def with_segment(self, segment: SegmentRef) -> Manifest:
        if segment.first != self.head.offset + 1:
            raise ValueError(
                f"segment {segment.name} starts at {segment.first}, not after the head {self.head}"
            )
        return replace(
            self,
            head=segment.last,
            head_time_ms=max(self.head_time_ms, segment.last_time_ms),
            segments=(*self.segments, segment),
        )

    def with_snapshot(self, snapshot: SnapshotRef, keep: int) -> tuple[Manifest, list[str]]:
        """The manifest with `snapshot` added and the oldest snapshots beyond `keep`
        dropped, with the segments no kept snapshot needs; and the dropped objects' names."""
        snapshots = sorted((*self.snapshots, snapshot), key=lambda s: s.position.offset)
        kept = tuple(snapshots[-keep:])
        oldest = kept[0].position.offset
        segments = tuple(s for s in self.segments if s.last.offset > oldest)
        ahead = snapshot.position.offset > self.head.offset
        manifest = replace(
            self,
            snapshots=kept,
            segments=segments,
            head=snapshot.position if ahead else self.head,
            head_time_ms=max(self.head_time_ms, snapshot.time_ms) if ahead else self.head_time_ms,
        )
        return manifest, sorted(self.names() - manifest.names())

    def with_merged(self, merged: SegmentRef) -> Manifest:
        """The manifest with the run of consecutive segments that `merged` covers end to
        end (the same entries in one object: `merge_run` picks such runs) replaced by it.
        ValueError unless the run is two segments or more, gap-free, crosses no snapshot
        and ends where `merged` does, with the same times at both ends."""
        starts = [i for i, s in enumerate(self.segments) if s.first == merged.first]
        ends = [i for i, s in enumerate(self.segments) if s.last.offset == merged.last.offset]
        if not starts or not ends or ends[0] <= starts[0]:
            raise ValueError(
                f"segment {merged.name} ({merged.first}-{merged.last.offset}) covers no run "
                "of two or more segments of the manifest"
            )
        start, end = starts[0], ends[0]
        run = self.segments[start : end + 1]
        if not self._mergeable(run):
            raise ValueError(
                f"segments {run[0].first}-{run[-1].last.offset} have a gap or a snapshot "
                "inside; they cannot be merged"
            )
        if (merged.last, merged.first_time_ms, merged.last_time_ms) != (
            run[-1].last,
            run[0].first_time_ms,
            run[-1].last_time_ms,
        ):
            raise ValueError(
                f"segment {merged.name} does not end at the position or times of the "
                f"segments {run[0].first}-{run[-1].last.offset} it replaces"
            )
        return replace(self, segments=(*self.segments[:start], merged, *self.segments[end + 1 :]))

    def merge_run(self, fanout: int, max_entries: int, max_bytes: int) -> tuple[SegmentRef, ...]:
        """The next run of segments to merge into one (`with_merged`), or () when none.

        A segment is small while it holds at most half of `max_entries` and of
        `max_bytes`; its level is log_fanout of its entries. The run is the first
        `fanout` neighbours (gap-free, no snapshot inside) that are all small and of a
        level at most l, for the lowest l that has such neighbours, cut to what fits
        in `max_entries` and `max_bytes` (at least two segments do: each is small). So
        entries are rewritten about once per level, and once no run is left, fewer
        than `fanout` small segments lie between two large ones, snapshots or gaps:
        the manifest holds a bounded number of segments per snapshot interval, however
        many rounds made them."""
        groups: list[list[SegmentRef]] = [[]]
        for segment in self.segments:
            small = 2 * _entries(segment) <= max_entries and 2 * segment.size <= max_bytes
            if not small or not self._mergeable((segment,)):
                groups.append([])
                continue
            if groups[-1] and not self._mergeable((groups[-1][-1], segment)):
                groups.append([])
            groups[-1].append(segment)
        level = 0
        while fanout**level <= max_entries:
            for group in groups:
                window: list[SegmentRef] = []
                for segment in group:
                    if _entries(segment) >= fanout ** (level + 1):
                        window = []
                        continue
                    window.append(segment)
                    if len(window) == fanout:
                        return _fitting(window, max_entries, max_bytes)
            level += 1
        return ()

    def _mergeable(self, run: tuple[SegmentRef, ...]) -> bool:
        """Whether `run` is gap-free and no snapshot lies inside it (a restore starting at
        a snapshot needs a segment that starts right after it)."""
        for before, after in itertools.pairwise(run):
            if after.first != before.last.offset + 1:
                return False
        first, last = run[0].first, run[-1].last.offset
        return not any(first <= s.position.offset < last for s in self.snapshots)

    def names(self) -> set[str]:
        return {s.name for s in self.snapshots} | {s.name for s in self.segments}

    def entries_since_snapshot(self) -> int:
        newest = self.snapshots[-1].position.offset if self.snapshots else -1
        return self.head.offset - newest

    def leftovers(self, names: list[str]) -> list[str]:
        """Of the object names found in the shard's prefix, those no manifest names and no
        writer can still name: below the oldest kept snapshot (uploads cut short, and
        segments merged into one, which restores planned before the merge may read until
        retention passes them)."""
        if not self.snapshots:
            return []
        oldest = self.snapshots[0].position.offset
        named = self.names()
        return [n for n in names if n not in named and _last_offset(n) < oldest]

    # ------------------------------------------------------------------ encoding

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "shard": [self.shard[0], self.shard[1]],
                "term": self.term,
                "head": _position(self.head),
                "head_time_ms": self.head_time_ms,
                "snapshots": [_snapshot_to_json(s) for s in self.snapshots],
                "segments": [_segment_to_json(s) for s in self.segments],
            },
            indent=1,
        ).encode()

    @staticmethod
    def from_json(data: bytes, where: str) -> Manifest:
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise ArchiveError(
                    f"archive manifest {where} has format {raw.get('format')!r}; this "
                    f"quorumstore reads format {FORMAT}"
                )
            return Manifest(
                shard=(str(raw["shard"][0]), int(raw["shard"][1])),
                term=int(raw["term"]),
                head=_from_position(raw["head"]),
                head_time_ms=int(raw["head_time_ms"]),
                snapshots=tuple(_snapshot_from_json(s) for s in raw["snapshots"]),
                segments=tuple(_segment_from_json(s) for s in raw["segments"]),
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            if isinstance(e, ArchiveError):
                raise
            raise ArchiveError(f"archive manifest {where} is unreadable: {e!r}") from e


def _snapshot_to_json(s: SnapshotRef) -> dict[str, Any]:
    return {"name": s.name, "position": _position(s.position), "time_ms": s.time_ms, "size": s.size}


def _snapshot_from_json(raw: Any) -> SnapshotRef:
    return SnapshotRef(
        _object_name(raw["name"]),
        _from_position(raw["position"]),
        int(raw["time_ms"]),
        int(raw["size"]),
    )


def _segment_to_json(s: SegmentRef) -> dict[str, Any]:
    return {
        "name": s.name,
        "first": s.first,
        "last": _position(s.last),
        "first_time_ms": s.first_time_ms,
        "last_time_ms": s.last_time_ms,
        "size": s.size,
    }


def _segment_from_json(raw: Any) -> SegmentRef:
    return SegmentRef(
        _object_name(raw["name"]),
        int(raw["first"]),
        _from_position(raw["last"]),
        int(raw["first_time_ms"]),
        int(raw["last_time_ms"]),
        int(raw["size"]),
    )


def _object_name(raw: Any) -> str:
    """An archived object's name, which is joined to its shard's prefix: one plain name."""
    name = str(raw)
    if not _OBJECT_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not the name of an archived object")
    return name


def _entries(segment: SegmentRef) -> int:
    return segment.last.offset - segment.first + 1


def _fitting(window: list[SegmentRef], max_entries: int, max_bytes: int) -> tuple[SegmentRef, ...]:
    """The longest start of `window` whose entries and bytes fit in one segment."""
    entries = size = count = 0
    for segment in window:
        entries += _entries(segment)
        size += segment.size
        if entries > max_entries or size > max_bytes:
            break
        count += 1
    return tuple(window[:count]) if count >= 2 else ()


def segment_name(first: int, last: int, unique: str) -> str:
    """Named by offsets (`leftovers` reads the last one back) and a unique part, so an
    upload never overwrites another's object."""
    return f"segments/{first:020d}-{last:020d}-{unique}.arrow"


def snapshot_name(offset: int, unique: str) -> str:
    return f"snapshots/{max(offset, -1) + 1:020d}-{unique}.snapshot"


def _last_offset(name: str) -> int:
    """The last offset an object name covers (`segment_name`, `snapshot_name`, or the
    temporary name of a local upload of one, which starts with a dot); a name in neither
    form covers everything, so that it is never taken for a leftover."""
    kind, _, rest = name.partition("/")
    parts = rest.lstrip(".").split("-")
    try:
        if kind == "segments":
            return int(parts[1])
        if kind == "snapshots":
            return int(parts[0]) - 1
    except (ValueError, IndexError):
        pass
    return _NEVER


#: What `_last_offset` gives a name it does not know.
_NEVER = 1 << 63


# ------------------------------------------------------------------ restore plans


@dataclass(frozen=True, slots=True)
class RestorePlan:
    snapshot: SnapshotRef
    #: Segments to apply after the snapshot, in order; entries past the target are skipped.
    segments: tuple[SegmentRef, ...]
    #: The last offset to apply (at a time: the head, the entries' times decide).
    target_offset: int
    #: With a time: apply no entry written after it.
    time_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "snapshot": _snapshot_to_json(self.snapshot),
            "segments": [_segment_to_json(s) for s in self.segments],
            "target_offset": self.target_offset,
            "time_ms": self.time_ms,
        }

    @staticmethod
    def from_json(raw: Any) -> RestorePlan:
        """The plan `to_json` made; ValueError (or KeyError, TypeError) if it is not one."""
        time_ms = raw["time_ms"]
        return RestorePlan(
            _snapshot_from_json(raw["snapshot"]),
            tuple(_segment_from_json(s) for s in raw["segments"]),
            int(raw["target_offset"]),
            None if time_ms is None else int(time_ms),
        )


def plan_restore(manifest: Manifest, offset: int | None, time_ms: int | None) -> RestorePlan:
    """The snapshot and segments that rebuild the shard at `offset`, at `time_ms`, or (both
    None) at the last archived entry; ArchiveError saying why when they are not kept."""
    shard = _name(manifest.shard)
    if not manifest.snapshots:
        raise ArchiveError(f"shard {shard} has no snapshot in the archive yet")
    oldest = manifest.snapshots[0]
    if time_ms is not None:
        candidates = [s for s in manifest.snapshots if s.time_ms <= time_ms]
        if not candidates:
            raise ArchiveError(
                f"shard {shard}: {_iso(time_ms)} is before the oldest kept snapshot, taken "
                f"at {_iso(oldest.time_ms)}; give a later time"
            )
        target = manifest.head.offset
    else:
        target = manifest.head.offset if offset is None else offset
        if target > manifest.head.offset:
            raise ArchiveError(
                f"shard {shard}: offset {target} is past the last archived entry "
                f"{manifest.head.offset}"
            )
        candidates = [s for s in manifest.snapshots if s.position.offset <= target]
        if not candidates:
            raise ArchiveError(
                f"shard {shard}: offset {target} is before the oldest kept snapshot, at "
                f"offset {oldest.position.offset}; give a later offset"
            )
    snapshot = candidates[-1]
    chain: list[SegmentRef] = []
    after = snapshot.position.offset
    for segment in manifest.segments:
        if after >= target or (time_ms is not None and segment.first_time_ms > time_ms):
            break
        if segment.last.offset <= after:
            continue
        if segment.first != after + 1:
            raise ArchiveError(
                f"shard {shard}: the archive holds no entries {after + 1}-{segment.first - 1}, "
                "which this point needs; pick a point at or after a later snapshot"
            )
        chain.append(segment)
        after = segment.last.offset
    if time_ms is None and after < target:
        raise ArchiveError(
            f"shard {shard}: the archive holds no entries {after + 1}-{target}, which this "
            "point needs; pick a point at or after a later snapshot"
        )
    return RestorePlan(snapshot, tuple(chain), min(target, after), time_ms)


def _position(p: LogPosition) -> list[int]:
    return [p.term, p.offset, p.checksum]


def _from_position(raw: Any) -> LogPosition:
    term, offset, checksum = raw
    return LogPosition(int(term), int(offset), int(checksum))


def _name(shard: ShardKey) -> str:
    return f"{shard[0]}/{shard[1]}"


def _iso(time_ms: int) -> str:
    return datetime.datetime.fromtimestamp(time_ms / 1000, datetime.UTC).isoformat()
