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
import json
from dataclasses import dataclass, replace
from typing import Any

from quorumstore.protocol.messages import ShardKey
from quorumstore.protocol.types import EMPTY_POSITION, LogPosition

#: Manifest format; a reader refuses another.
FORMAT = 1


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

    def names(self) -> set[str]:
        return {s.name for s in self.snapshots} | {s.name for s in self.segments}

    def entries_since_snapshot(self) -> int:
        newest = self.snapshots[-1].position.offset if self.snapshots else -1
        return self.head.offset - newest

    def leftovers(self, names: list[str]) -> list[str]:
        """Of the object names found in the shard's prefix, those no manifest names and no
        writer can still name: below the oldest kept snapshot (uploads cut short)."""
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
                "snapshots": [
                    {
                        "name": s.name,
                        "position": _position(s.position),
                        "time_ms": s.time_ms,
                        "size": s.size,
                    }
                    for s in self.snapshots
                ],
                "segments": [
                    {
                        "name": s.name,
                        "first": s.first,
                        "last": _position(s.last),
                        "first_time_ms": s.first_time_ms,
                        "last_time_ms": s.last_time_ms,
                        "size": s.size,
                    }
                    for s in self.segments
                ],
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
                snapshots=tuple(
                    SnapshotRef(
                        s["name"], _from_position(s["position"]), int(s["time_ms"]), int(s["size"])
                    )
                    for s in raw["snapshots"]
                ),
                segments=tuple(
                    SegmentRef(
                        s["name"],
                        int(s["first"]),
                        _from_position(s["last"]),
                        int(s["first_time_ms"]),
                        int(s["last_time_ms"]),
                        int(s["size"]),
                    )
                    for s in raw["segments"]
                ),
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            if isinstance(e, ArchiveError):
                raise
            raise ArchiveError(f"archive manifest {where} is unreadable: {e!r}") from e


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
