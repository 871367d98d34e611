"""The write-ahead log on real files: round trips, recovery, crash leftovers and limits."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from quorumstore.protocol.types import (
    EMPTY_POSITION,
    LogEntry,
    LogPosition,
    chain_checksum,
    make_entry,
)
from quorumstore.storage.wal import Wal
from quorumstore.storage.wal_format import RECORD_HEADER, WalError

HEADER = RECORD_HEADER.size
FIRST_SEGMENT = "00000000000000000000.wal"
UNLIMITED = 1 << 40


def payload(offset: int, size: int) -> bytes:
    """Distinct bytes per offset, so a mix-up between entries cannot go unnoticed."""
    return (f"<{offset}>".encode() * (size // 3 + 1))[:size]


def position(entry: LogEntry) -> LogPosition:
    return LogPosition(entry.term, entry.offset, entry.checksum)


def chain(previous: LogPosition, terms: Sequence[int], size: int = 40) -> list[LogEntry]:
    """Entries after `previous`, one per term in `terms`."""
    entries = []
    for term in terms:
        entry = make_entry(previous, term, payload(previous.offset + 1, size))
        entries.append(entry)
        previous = position(entry)
    return entries


def segment_names(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".wal"))


def read_all(wal: Wal) -> list[LogEntry]:
    return list(wal.read(wal.base.offset + 1, UNLIMITED, UNLIMITED))


def flip_byte(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def wal_dir(tmp_path: Path) -> Path:
    return tmp_path / "wal"


# --- append, read, reopen ---------------------------------------------------------------


def test_append_read_round_trip(wal_dir: Path) -> None:
    entries = chain(EMPTY_POSITION, [1] * 5 + [2] * 5 + [4] * 5)
    with Wal.open(wal_dir) as wal:
        assert wal.head == wal.base == wal.synced_head == EMPTY_POSITION
        wal.append(entries[:1])
        wal.append(entries[1:9])
        wal.append(entries[9:])
        wal.append([])
        assert wal.head == position(entries[-1])
        assert wal.synced_head == EMPTY_POSITION
        wal.sync()
        assert wal.synced_head == wal.head
        assert read_all(wal) == entries
        assert list(wal.read(6, 3, UNLIMITED)) == entries[6:9]
        assert [wal.position_at(e.offset) for e in entries] == [position(e) for e in entries]
        assert wal.position_at(-1) == EMPTY_POSITION


def test_reopen_recovers_head_base_and_checksums(wal_dir: Path) -> None:
    entries = chain(EMPTY_POSITION, [1] * 20 + [3] * 20, size=60)
    with Wal.open(wal_dir, segment_bytes=400) as wal:
        wal.append(entries)
        wal.sync()
        wal.trim_before(15)
        base, head = wal.base, wal.head
    with Wal.open(wal_dir, segment_bytes=400) as wal:
        assert (wal.base, wal.head, wal.synced_head) == (base, head, head)
        assert read_all(wal) == entries[base.offset + 1 :]
        for entry in entries[base.offset + 1 :]:
            assert wal.position_at(entry.offset) == position(entry)
        wal.append(chain(wal.head, [5]))
        assert wal.head.offset == 40


def test_segments_are_named_by_first_offset_and_roll_after_whole_records(wal_dir: Path) -> None:
    size = 64
    record = HEADER + size
    with Wal.open(wal_dir, segment_bytes=3 * record - 1) as wal:
        wal.append(chain(EMPTY_POSITION, [1] * 10, size=size))
    assert segment_names(wal_dir) == [f"{first:020d}.wal" for first in (0, 3, 6, 9)]
    sizes = [(wal_dir / name).stat().st_size for name in segment_names(wal_dir)]
    assert sizes == [3 * record, 3 * record, 3 * record, record]


def test_sync_false_still_appends_and_recovers(wal_dir: Path) -> None:
    entries = chain(EMPTY_POSITION, [2] * 30)
    with Wal.open(wal_dir, segment_bytes=300, sync=False) as wal:
        wal.append(entries)
        wal.sync()
        assert wal.synced_head == wal.head
        wal.truncate_after(25)
        wal.trim_before(10)
        base = wal.base
    with Wal.open(wal_dir, sync=False) as wal:
        assert wal.base == base
        assert wal.head == position(entries[25])
        assert read_all(wal) == entries[base.offset + 1 : 26]


def test_sync_runs_on_a_worker_thread(wal_dir: Path) -> None:
    with Wal.open(wal_dir) as wal, ThreadPoolExecutor(max_workers=1) as pool:
        for batch in range(3):
            wal.append(chain(wal.head, [1] * 4))
            pool.submit(wal.sync).result()
            assert wal.synced_head == wal.head
            assert wal.head.offset == 4 * batch + 3


def test_second_open_of_the_same_directory_is_refused(wal_dir: Path) -> None:
    with Wal.open(wal_dir), pytest.raises(WalError, match="already open"):
        Wal.open(wal_dir)
    Wal.open(wal_dir).close()


def test_closed_wal_refuses_use(wal_dir: Path) -> None:
    wal = Wal.open(wal_dir)
    wal.close()
    wal.close()
    with pytest.raises(WalError, match="closed"):
        wal.append(chain(EMPTY_POSITION, [1]))
    with pytest.raises(WalError, match="closed"):
        wal.read(0, 1, 1)


def test_open_creates_missing_parents(tmp_path: Path) -> None:
    with Wal.open(tmp_path / "a" / "b" / "wal") as wal:
        wal.append(chain(EMPTY_POSITION, [1]))
        wal.sync()
    assert segment_names(tmp_path / "a" / "b" / "wal") == [FIRST_SEGMENT]


# --- validation -------------------------------------------------------------------------


def _gap(head: LogPosition) -> list[LogEntry]:
    return chain(LogPosition(head.term, head.offset + 1, head.checksum), [2])


def _repeat(head: LogPosition) -> list[LogEntry]:
    return chain(LogPosition(head.term, head.offset - 1, head.checksum), [2])


def _hole_inside(head: LogPosition) -> list[LogEntry]:
    first, _, third = chain(head, [2, 2, 2])
    return [first, third]


def _bad_checksum(head: LogPosition) -> list[LogEntry]:
    entry = chain(head, [2])[0]
    return [LogEntry(entry.term, entry.offset, entry.checksum ^ 1, entry.payload)]


def _wrong_previous(head: LogPosition) -> list[LogEntry]:
    return chain(LogPosition(head.term, head.offset, head.checksum ^ 1), [2])


def _lower_term(head: LogPosition) -> list[LogEntry]:
    return chain(head, [1])


def _lower_term_inside(head: LogPosition) -> list[LogEntry]:
    return chain(head, [3, 2])


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (_gap, "does not follow"),
        (_repeat, "does not follow"),
        (_hole_inside, "does not follow"),
        (_bad_checksum, "checksum"),
        (_wrong_previous, "checksum"),
        (_lower_term, "lower term"),
        (_lower_term_inside, "lower term"),
    ],
)
def test_append_rejects_entries_that_do_not_chain(wal_dir: Path, build, message: str) -> None:
    good = chain(EMPTY_POSITION, [2] * 3)
    with Wal.open(wal_dir) as wal:
        wal.append(good)
        size = (wal_dir / FIRST_SEGMENT).stat().st_size
        with pytest.raises(WalError, match=message):
            wal.append(build(wal.head))
        assert wal.head == position(good[-1])
        assert (wal_dir / FIRST_SEGMENT).stat().st_size == size
        more = chain(wal.head, [2, 3])
        wal.append(more)
        assert read_all(wal) == good + more


def test_first_entry_must_follow_the_empty_log(wal_dir: Path) -> None:
    entry = make_entry(LogPosition(1, 0, 0), 1, b"x")
    with Wal.open(wal_dir) as wal, pytest.raises(WalError, match="does not follow"):
        wal.append([entry])


# --- torn tail and corruption -----------------------------------------------------------

SIZE = 100
RECORD = HEADER + SIZE


def _synced_then_unsynced(wal_dir: Path) -> tuple[list[LogEntry], int]:
    """Five synced entries and three more that were appended but never synced."""
    entries = chain(EMPTY_POSITION, [1] * 5 + [2] * 3, size=SIZE)
    with Wal.open(wal_dir) as wal:
        wal.append(entries[:5])
        wal.sync()
        wal.append(entries[5:])
    return entries, 5 * RECORD


@pytest.mark.parametrize(
    "cut",
    [
        1,  # mid-header
        HEADER - 1,  # header one byte short
        HEADER,  # whole header, no payload
        HEADER + SIZE // 2,  # mid-payload
        RECORD - 1,  # one byte short of a record
        RECORD,  # a whole unsynced record survived
        RECORD + 7,
        2 * RECORD + HEADER + 1,
        3 * RECORD - 1,
    ],
)
def test_torn_tail_is_cut_and_synced_entries_survive(wal_dir: Path, cut: int) -> None:
    entries, synced_bytes = _synced_then_unsynced(wal_dir)
    segment = wal_dir / FIRST_SEGMENT
    os.truncate(segment, synced_bytes + cut)
    whole = cut // RECORD
    with Wal.open(wal_dir) as wal:
        survivors = entries[: 5 + whole]
        assert wal.head == wal.synced_head == position(survivors[-1])
        assert read_all(wal) == survivors
        assert segment.stat().st_size == len(survivors) * RECORD
        more = chain(wal.head, [7, 7])
        wal.append(more)
        wal.sync()
    with Wal.open(wal_dir) as wal:
        assert read_all(wal) == survivors + more


@pytest.mark.parametrize("garbage", [b"\0" * 500, b"\xff" * 3, b"QWAL" + b"\0" * 40])
def test_garbage_after_the_last_record_is_a_torn_tail(wal_dir: Path, garbage: bytes) -> None:
    entries, _ = _synced_then_unsynced(wal_dir)
    with open(wal_dir / FIRST_SEGMENT, "ab") as file:
        file.write(garbage)
    with Wal.open(wal_dir) as wal:
        assert read_all(wal) == entries
    assert (wal_dir / FIRST_SEGMENT).stat().st_size == len(entries) * RECORD


def test_bad_crc_in_the_last_record_is_a_torn_tail(wal_dir: Path) -> None:
    entries, _ = _synced_then_unsynced(wal_dir)
    flip_byte(wal_dir / FIRST_SEGMENT, 7 * RECORD + HEADER + 3)
    with Wal.open(wal_dir) as wal:
        assert read_all(wal) == entries[:7]


def test_a_torn_tail_that_empties_the_last_segment_removes_it(wal_dir: Path) -> None:
    entries = chain(EMPTY_POSITION, [1] * 4, size=SIZE)
    with Wal.open(wal_dir, segment_bytes=2 * RECORD) as wal:
        wal.append(entries)
    os.truncate(wal_dir / "00000000000000000002.wal", HEADER // 2)
    with Wal.open(wal_dir, segment_bytes=2 * RECORD) as wal:
        assert read_all(wal) == entries[:2]
        assert segment_names(wal_dir) == [FIRST_SEGMENT]
        wal.append(entries[2:])
        assert read_all(wal) == entries


@pytest.mark.parametrize("pos", [3 * RECORD, 3 * RECORD + 8, 3 * RECORD + HEADER + 5])
def test_corruption_followed_by_valid_records_raises(wal_dir: Path, pos: int) -> None:
    _synced_then_unsynced(wal_dir)
    flip_byte(wal_dir / FIRST_SEGMENT, pos)
    with pytest.raises(WalError, match=rf"{FIRST_SEGMENT}.*byte {3 * RECORD}\b"):
        Wal.open(wal_dir)


def test_corruption_in_a_non_last_segment_raises(wal_dir: Path) -> None:
    with Wal.open(wal_dir, segment_bytes=2 * RECORD) as wal:
        wal.append(chain(EMPTY_POSITION, [1] * 6, size=SIZE))
        wal.sync()
    flip_byte(wal_dir / "00000000000000000002.wal", RECORD + HEADER)
    with pytest.raises(WalError, match=rf"00000000000000000002\.wal.*byte {RECORD}\b"):
        Wal.open(wal_dir)


def test_a_cut_non_last_segment_raises(wal_dir: Path) -> None:
    with Wal.open(wal_dir, segment_bytes=2 * RECORD) as wal:
        wal.append(chain(EMPTY_POSITION, [1] * 6, size=SIZE))
        wal.sync()
    os.truncate(wal_dir / FIRST_SEGMENT, RECORD + 10)
    with pytest.raises(WalError, match=rf"{FIRST_SEGMENT}.*byte {RECORD}\b"):
        Wal.open(wal_dir)


def test_a_missing_segment_raises(wal_dir: Path) -> None:
    with Wal.open(wal_dir, segment_bytes=2 * RECORD) as wal:
        wal.append(chain(EMPTY_POSITION, [1] * 6, size=SIZE))
        wal.sync()
    (wal_dir / "00000000000000000002.wal").unlink()
    with pytest.raises(WalError, match="missing"):
        Wal.open(wal_dir)


def test_a_record_that_does_not_chain_raises(wal_dir: Path) -> None:
    """A well-formed record (good CRC) with the wrong chain checksum is damage, not a tear."""
    entries = chain(EMPTY_POSITION, [1] * 3, size=SIZE)
    with Wal.open(wal_dir) as wal:
        wal.append(entries)
    forged = chain(LogPosition(9, 1, 123), [9], size=SIZE)[0]
    fields = struct.pack("<IIqqQ", int.from_bytes(b"QWAL", "little"), SIZE, 9, 2, forged.checksum)
    record = fields + struct.pack("<I", zlib.crc32(forged.payload, zlib.crc32(fields)))
    os.truncate(wal_dir / FIRST_SEGMENT, 2 * RECORD)
    with open(wal_dir / FIRST_SEGMENT, "ab") as file:
        file.write(record + forged.payload)
    with pytest.raises(WalError, match=rf"byte {2 * RECORD}\b.*chain"):
        Wal.open(wal_dir)


# --- truncate_after ---------------------------------------------------------------------

SMALL = 3 * (HEADER + 40)  # three records of chain()'s default size per segment


@pytest.mark.parametrize("offset", [-1, 0, 2, 3, 4, 10, 18, 19])
def test_truncate_after_across_segments(wal_dir: Path, offset: int) -> None:
    entries = chain(EMPTY_POSITION, [1] * 10 + [2] * 10)
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        wal.append(entries)
        wal.truncate_after(offset)
        kept = entries[: offset + 1]
        assert wal.head == (position(kept[-1]) if kept else EMPTY_POSITION)
        # Cutting makes what remains durable; truncating after the head is a no-op.
        assert wal.synced_head == (wal.head if offset < 19 else EMPTY_POSITION)
        assert read_all(wal) == kept
        assert all(int(name[:20]) <= offset for name in segment_names(wal_dir))
        assert wal.last_position_in_term_at_most(2, 100) == wal.head
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        assert read_all(wal) == kept
        more = chain(wal.head, [3] * 5)
        wal.append(more)
        wal.sync()
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        assert read_all(wal) == kept + more


def test_truncate_after_outside_the_log_raises(wal_dir: Path) -> None:
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        wal.append(chain(EMPTY_POSITION, [1] * 10))
        wal.trim_before(5)
        with pytest.raises(WalError, match="cannot truncate"):
            wal.truncate_after(10)
        with pytest.raises(WalError, match="cannot truncate"):
            wal.truncate_after(wal.base.offset - 1)
        wal.truncate_after(wal.base.offset)
        assert wal.head == wal.base
        assert segment_names(wal_dir) == []


# --- trim_before ------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 2, 3, 4, 7, 13, 19, 20, 100])
def test_trim_before_deletes_only_whole_segments_below(wal_dir: Path, offset: int) -> None:
    entries = chain(EMPTY_POSITION, [1] * 10 + [2] * 10)
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        wal.append(entries)
        firsts = [int(name[:20]) for name in segment_names(wal_dir)]
        wal.trim_before(offset)
        # A segment goes iff it is not the last one and its successor starts at or below offset.
        expected = [
            f for i, f in enumerate(firsts) if i == len(firsts) - 1 or firsts[i + 1] > offset
        ]
        assert [int(name[:20]) for name in segment_names(wal_dir)] == expected
        assert wal.base.offset == expected[0] - 1 < offset
        if wal.base.offset >= 0:
            assert wal.base == position(entries[wal.base.offset])
        else:
            assert wal.base == EMPTY_POSITION
        assert read_all(wal) == entries[wal.base.offset + 1 :]
        base = wal.base
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        assert wal.base == base
        assert read_all(wal) == entries[base.offset + 1 :]
        assert wal.head == position(entries[-1])


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=30),
    segment_bytes=st.integers(1, 1000),
    trim=st.integers(0, 30),
    upto=st.integers(-1, 35),
    max_bytes=st.integers(0, 3000),
)
def test_first_offset_within_counts_the_records_bytes_back_from_upto(
    tmp_path: Path, sizes: list[int], segment_bytes: int, trim: int, upto: int, max_bytes: int
) -> None:
    """What WAL retention keeps under its byte bound, against a sum over the records."""
    entries: list[LogEntry] = []
    previous = EMPTY_POSITION
    for size in sizes:
        entries.append(make_entry(previous, 1, payload(previous.offset + 1, size)))
        previous = position(entries[-1])
    with Wal.open(Path(tempfile.mkdtemp(dir=tmp_path)), segment_bytes=segment_bytes) as wal:
        wal.append(entries)
        wal.trim_before(trim)
        first_held = wal.base.offset + 1
        last = min(upto, wal.head.offset)
        expected = last + 1
        while expected > first_held:
            held = sum(HEADER + len(e.payload) for e in entries[expected - 1 : last + 1])
            if held > max_bytes:
                break
            expected -= 1
        assert wal.first_offset_within(upto, max_bytes) == expected


def test_read_below_the_base_asks_for_a_snapshot(wal_dir: Path) -> None:
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        wal.append(chain(EMPTY_POSITION, [1] * 10))
        wal.trim_before(7)
        assert wal.base.offset == 5
        with pytest.raises(WalError, match="snapshot"):
            wal.read(5, 10, UNLIMITED)
        assert wal.read(6, 10, UNLIMITED)[0].offset == 6


def test_interrupted_trim_is_finished_on_open(wal_dir: Path, tmp_path: Path) -> None:
    """A crash after the base file was replaced but before the unlinks reached the disk."""
    entries = chain(EMPTY_POSITION, [1] * 12)
    saved = tmp_path / "saved"
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        wal.append(entries)
        wal.sync()
        shutil.copytree(wal_dir, saved)
        wal.trim_before(8)
        base = wal.base
    for name in segment_names(saved):
        if not (wal_dir / name).exists():
            shutil.copy(saved / name, wal_dir / name)
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        assert wal.base == base
        assert read_all(wal) == entries[base.offset + 1 :]
    assert int(segment_names(wal_dir)[0][:20]) == base.offset + 1


# --- reset ------------------------------------------------------------------------------


def test_reset_starts_an_empty_log_after_the_snapshot(wal_dir: Path) -> None:
    snapshot = LogPosition(7, 100, 0xDEADBEEF)
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        wal.append(chain(EMPTY_POSITION, [1] * 10))
        wal.reset(snapshot)
        assert wal.base == wal.head == wal.synced_head == snapshot
        assert segment_names(wal_dir) == []
        assert wal.read(101, 10, UNLIMITED) == []
        with pytest.raises(WalError, match="snapshot"):
            wal.read(100, 10, UNLIMITED)
        with pytest.raises(WalError, match="lower term"):
            wal.append(chain(snapshot, [6]))
        more = chain(snapshot, [7, 8])
        wal.append(more)
        assert segment_names(wal_dir) == [f"{101:020d}.wal"]
        assert wal.last_position_in_term_at_most(6, 200) == snapshot
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        assert wal.base == snapshot
        assert read_all(wal) == more


def _set_base_flags(wal_dir: Path, flags: int) -> None:
    """Rewrite the documented base file (magic, flags, term, offset, checksum, crc)."""
    magic, _, term, offset, checksum, _ = struct.unpack("<IIqqQI", (wal_dir / "base").read_bytes())
    fields = struct.pack("<IIqqQ", magic, flags, term, offset, checksum)
    (wal_dir / "base").write_bytes(fields + struct.pack("<I", zlib.crc32(fields)))


def test_interrupted_reset_is_finished_on_open(wal_dir: Path, tmp_path: Path) -> None:
    """A crash after the 'resetting' base file was written but before the unlinks landed."""
    snapshot = LogPosition(7, 4, 0xFEED)
    saved = tmp_path / "saved"
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        wal.append(chain(EMPTY_POSITION, [1] * 10))
        wal.sync()
        shutil.copytree(wal_dir, saved)
        wal.reset(snapshot)
    for name in segment_names(saved):
        shutil.copy(saved / name, wal_dir / name)
    _set_base_flags(wal_dir, 1)
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        assert wal.base == wal.head == snapshot
        assert segment_names(wal_dir) == []
    with Wal.open(wal_dir) as wal:
        assert wal.base == wal.head == snapshot


def test_a_damaged_base_file_raises(wal_dir: Path) -> None:
    with Wal.open(wal_dir) as wal:
        wal.reset(LogPosition(1, 5, 9))
    flip_byte(wal_dir / "base", 12)
    with pytest.raises(WalError, match="base"):
        Wal.open(wal_dir)


# --- failed writes and fsyncs -----------------------------------------------------------


class StorageFaults:
    """Makes the next `os.write`, `os.fdatasync` or `os.fsync` fail, as on a full disk
    (ENOSPC) or a disk losing a write (EIO); once failed, the call works again, so a WAL
    that retried would see success where the data may be gone."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed: dict[str, int] = {}
        for name in ("write", "fdatasync", "fsync"):
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def fail_next(self, call: str, errno_: int) -> None:
        self.armed[call] = errno_

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            errno_ = self.armed.pop(name, None)
            if errno_ is not None:
                raise OSError(errno_, os.strerror(errno_))
            return real(*args)

        return call


def _append_one(wal: Wal) -> None:
    wal.append(chain(wal.head, [1]))


def _sync_on_a_thread(wal: Wal) -> None:
    """The node's group commit: the fdatasync on another thread, its result recorded back."""
    ticket = wal.prepare_sync()
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(ticket.run).result()
    wal.complete_sync(ticket)


#: Each: the failing call and its errno, what the WAL's error names, and what it breaks,
#: after 5 synced entries in segments of 3 (`SMALL`), the last with room for one more.
FAULTS: dict[str, tuple[str, int, str, Callable[[Wal], object]]] = {
    "group commit": ("fdatasync", errno.EIO, "fsync of", lambda w: (_append_one(w), w.sync())),
    "group commit on a thread": (
        "fdatasync",
        errno.EIO,
        "fsync of",
        lambda w: (_append_one(w), _sync_on_a_thread(w)),
    ),
    "write on a full disk": ("write", errno.ENOSPC, "writing to", _append_one),
    "sealing a full segment": (
        "fdatasync",
        errno.EIO,
        "starting segment",
        lambda w: w.append(chain(w.head, [1, 1])),  # the second entry rolls to a new segment
    ),
    "truncate": ("fdatasync", errno.EIO, "truncating", lambda w: w.truncate_after(2)),
    "trim": ("fsync", errno.EIO, "trimming", lambda w: w.trim_before(4)),
    "reset": ("fsync", errno.EIO, "resetting", lambda w: w.reset(LogPosition(1, 9, 9))),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_write_or_fsync_is_never_taken_for_durable_and_never_retried(
    wal_dir: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """After a failed write or fsync the kernel may have dropped the data while a second
    fsync succeeds (it reports an error once): the WAL must not count anything past its
    last good sync as durable, and must refuse every later use, syncs included, until it
    is opened again from what is on disk (the replica stops; see ARCHITECTURE.md)."""
    call, errno_, where, mutation = FAULTS[fault]
    faults = StorageFaults(monkeypatch)
    entries = chain(EMPTY_POSITION, [1] * 5)
    with Wal.open(wal_dir, segment_bytes=SMALL) as wal:
        wal.append(entries)
        wal.sync()
        faults.fail_next(call, errno_)
        with pytest.raises(WalError, match=f"{where} .*{os.strerror(errno_)}"):
            mutation(wal)
        assert wal.synced_head.offset <= entries[-1].offset
        for use in (wal.sync, lambda: _append_one(wal), lambda: wal.trim_before(1)):
            with pytest.raises(WalError, match="unusable"):
                use()
        assert wal.synced_head.offset <= entries[-1].offset
    Wal.open(wal_dir, segment_bytes=SMALL).close()  # what is on disk recovers


# --- read limits ------------------------------------------------------------------------


@pytest.mark.parametrize("reopen", [False, True], ids=["cache", "disk"])
def test_read_limits(wal_dir: Path, reopen: bool) -> None:
    entries = chain(EMPTY_POSITION, [1] * 30, size=50)
    wal = Wal.open(wal_dir, segment_bytes=SMALL)
    wal.append(entries)
    if reopen:  # a reopened WAL has an empty tail cache, so every read goes to disk
        wal.close()
        wal = Wal.open(wal_dir, segment_bytes=SMALL)
    with wal:
        assert list(wal.read(0, 5, UNLIMITED)) == entries[:5]
        assert list(wal.read(3, UNLIMITED, 150)) == entries[3:6]
        assert list(wal.read(3, UNLIMITED, 149)) == entries[3:5]
        assert list(wal.read(3, 1, 1)) == entries[3:4]  # one entry even over max_bytes
        assert list(wal.read(3, 0, 0)) == entries[3:4]
        assert list(wal.read(28, 10, UNLIMITED)) == entries[28:]
        assert list(wal.read(1, 25, UNLIMITED)) == entries[1:26]  # spans segments
        assert wal.read(30, 10, UNLIMITED) == []
        assert wal.read(99, 10, UNLIMITED) == []


def test_reads_beyond_the_tail_cache_come_from_disk(wal_dir: Path) -> None:
    entries = chain(EMPTY_POSITION, [1] * 6000, size=8)
    with Wal.open(wal_dir, segment_bytes=4096) as wal:
        for start in range(0, len(entries), 100):
            wal.append(entries[start : start + 100])
        assert read_all(wal) == entries
        assert list(wal.read(5990, 100, UNLIMITED)) == entries[5990:]


def test_disk_reads_detect_damage(wal_dir: Path) -> None:
    entries = chain(EMPTY_POSITION, [1] * 5, size=SIZE)
    with Wal.open(wal_dir) as wal:
        wal.append(entries)
    with Wal.open(wal_dir) as wal:
        flip_byte(wal_dir / FIRST_SEGMENT, RECORD + HEADER)
        with pytest.raises(WalError, match=rf"byte {RECORD}\b"):
            wal.read(0, 5, UNLIMITED)


# --- last_position_in_term_at_most ------------------------------------------------------


def brute_force_last_position(
    base: LogPosition, entries: list[LogEntry], term: int, offset: int
) -> LogPosition:
    matches = [position(e) for e in entries if e.term <= term and e.offset <= offset]
    return matches[-1] if matches else base


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base_term=st.integers(-1, 3),
    base_offset=st.integers(-1, 5),
    steps=st.lists(st.integers(0, 2), max_size=40),
    trim_at=st.integers(-2, 45),
    queries=st.lists(st.tuples(st.integers(-2, 12), st.integers(-3, 50)), min_size=1, max_size=20),
)
def test_last_position_in_term_at_most_matches_brute_force(
    base_term: int,
    base_offset: int,
    steps: list[int],
    trim_at: int,
    queries: list[tuple[int, int]],
) -> None:
    base = LogPosition(base_term, base_offset, 77) if base_offset >= 0 else EMPTY_POSITION
    terms, term = [], max(base.term, 0)
    for step in steps:
        term += step
        terms.append(term)
    entries = chain(base, terms, size=20)
    with (
        tempfile.TemporaryDirectory() as directory,
        Wal.open(directory, segment_bytes=2 * (HEADER + 20), sync=False) as wal,
    ):
        wal.reset(base)
        wal.append(entries)
        wal.trim_before(trim_at)
        live = [e for e in entries if e.offset > wal.base.offset]
        for query_term, query_offset in queries:
            expected = brute_force_last_position(wal.base, live, query_term, query_offset)
            assert wal.last_position_in_term_at_most(query_term, query_offset) == expected


# --- model-based: random operations against a list --------------------------------------


class WalAgainstAModel(RuleBasedStateMachine):
    """Every operation, including reopening, keeps the WAL equal to a plain list of entries."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp()
        self.wal = Wal.open(self.directory, segment_bytes=200, sync=False)
        self.base = EMPTY_POSITION
        self.entries: list[LogEntry] = []

    def head(self) -> LogPosition:
        return position(self.entries[-1]) if self.entries else self.base

    @rule(bumps=st.lists(st.integers(0, 1), min_size=1, max_size=8), size=st.integers(0, 90))
    def append(self, bumps: list[int], size: int) -> None:
        terms, term = [], max(self.head().term, 0)
        for bump in bumps:
            term += bump
            terms.append(term)
        entries = chain(self.head(), terms, size=size)
        self.wal.append(entries)
        self.entries += entries

    @rule()
    def sync(self) -> None:
        self.wal.sync()
        assert self.wal.synced_head == self.head()

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.base.offset, self.head().offset))
        self.wal.truncate_after(offset)
        self.entries = [e for e in self.entries if e.offset <= offset]

    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.base.offset, self.head().offset + 2))
        self.wal.trim_before(offset)
        new_base = self.wal.base
        assert new_base.offset < max(offset, self.base.offset + 1)
        if new_base != self.base:
            assert new_base == position(self.entries[new_base.offset - self.base.offset - 1])
        self.entries = [e for e in self.entries if e.offset > new_base.offset]
        self.base = new_base

    @rule(term_bump=st.integers(0, 2), offset_bump=st.integers(0, 20))
    def reset(self, term_bump: int, offset_bump: int) -> None:
        head = self.head()
        self.base = LogPosition(max(head.term, 0) + term_bump, head.offset + offset_bump, 4242)
        self.wal.reset(self.base)
        self.entries = []

    @rule()
    def reopen(self) -> None:
        self.wal.close()
        self.wal = Wal.open(self.directory, segment_bytes=200, sync=False)

    @rule(data=st.data(), max_entries=st.integers(0, 10), max_bytes=st.integers(0, 300))
    def read(self, data: st.DataObject, max_entries: int, max_bytes: int) -> None:
        start = data.draw(st.integers(self.base.offset + 1, self.head().offset + 2))
        got = list(self.wal.read(start, max_entries, max_bytes))
        expected, total = [], 0
        for entry in self.entries[start - self.base.offset - 1 :]:
            total += len(entry.payload)
            if expected and (len(expected) >= max_entries or total > max_bytes):
                break
            expected.append(entry)
        assert got == expected

    @invariant()
    def matches_the_model(self) -> None:
        assert self.wal.base == self.base
        assert self.wal.head == self.head()
        for entry in self.entries[-3:]:
            assert self.wal.position_at(entry.offset) == position(entry)
            assert entry.checksum == chain_checksum(
                self.wal.position_at(entry.offset - 1).checksum,
                entry.term,
                entry.offset,
                entry.payload,
            )

    def teardown(self) -> None:
        self.wal.close()
        shutil.rmtree(self.directory)


TestWalAgainstAModel = WalAgainstAModel.TestCase
TestWalAgainstAModel.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
