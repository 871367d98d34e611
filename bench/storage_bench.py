"""WAL micro-benchmark: appends + group-commit fsync against a plain write+fsync loop.

For each batch size (rows per entry; one entry is one Arrow record batch of
(key string, value binary[100]) rows, IPC-encoded up front) and each group size G
(entries appended before one `sync`), the WAL and a plain ``os.write`` + ``os.fsync``
loop writing exactly the same bytes (the WAL's own first G records) run in the same
directory, alternating in short slices so that a drifting disk hurts both alike.
Only append+sync (resp. write+fsync) is timed; building the entries is not.

Usage: python bench/storage_bench.py [--seconds S] [--dir D]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))  # runs from a checkout, installed or not

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.protocol.types import LogEntry, LogPosition, make_entry
from quorumstore.storage.wal import Wal
from quorumstore.storage.wal_format import RECORD_HEADER

BATCH_SIZES = (1, 100, 1000)
GROUPS = (1, 16)
VALUE_BYTES = 100
SLICE_SECONDS = 0.1
SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary())])


@dataclass
class Tally:
    """Iterations run and the time spent inside the timed calls."""

    iterations: int = 0
    seconds: float = 0.0


def arrow_payload(rows: int, rng: random.Random) -> bytes:
    """One record batch of `rows` (key, 100-byte value) rows as Arrow IPC stream bytes."""
    keys = pa.array([f"key-{i:010d}" for i in range(rows)], pa.string())
    values = pa.array([rng.randbytes(VALUE_BYTES) for _ in range(rows)], pa.binary())
    return ipc_bytes(pa.record_batch([keys, values], schema=SCHEMA))


def run_wal(wal: Wal, payload: bytes, group: int, tally: Tally) -> None:
    """One slice of: build G entries (untimed), then time append + sync."""
    end = time.perf_counter() + SLICE_SECONDS
    while time.perf_counter() < end:
        entries: list[LogEntry] = []
        head = wal.head
        for _ in range(group):
            entry = make_entry(head, 1, payload)
            entries.append(entry)
            head = LogPosition(entry.term, entry.offset, entry.checksum)
        start = time.perf_counter()
        wal.append(entries)
        wal.sync()
        tally.seconds += time.perf_counter() - start
        tally.iterations += 1


def run_plain(fd: int, data: bytes, tally: Tally) -> None:
    """One slice of os.write + os.fsync of the bytes the WAL wrote for one group."""
    end = time.perf_counter() + SLICE_SECONDS
    while time.perf_counter() < end:
        start = time.perf_counter()
        os.write(fd, data)
        os.fsync(fd)
        tally.seconds += time.perf_counter() - start
        tally.iterations += 1


def measure(
    directory: Path, payload: bytes, group: int, seconds: float
) -> tuple[Tally, Tally, int]:
    """Alternate WAL and plain slices until each has `seconds`; returns both and group bytes."""
    wal_tally, plain_tally = Tally(), Tally()
    group_bytes = group * (RECORD_HEADER.size + len(payload))
    with Wal.open(directory / "wal", sync=True) as wal:
        run_wal(wal, payload, group, wal_tally)
        with open(directory / "wal" / f"{0:020d}.wal", "rb") as segment:
            data = segment.read(group_bytes)
        fd = os.open(directory / "plain", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while wal_tally.seconds < seconds or plain_tally.seconds < seconds:
                run_plain(fd, data, plain_tally)
                run_wal(wal, payload, group, wal_tally)
        finally:
            os.close(fd)
    assert wal.head.offset == wal_tally.iterations * group - 1, "the WAL holds what was timed"
    return wal_tally, plain_tally, group_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per side per row")
    parser.add_argument("--dir", type=Path, default=REPO, help="where to make the temp directory")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix=".storage_bench-", dir=args.dir))
    rng = random.Random(42)
    payloads = {rows: arrow_payload(rows, rng) for rows in BATCH_SIZES}
    print(f"WAL vs plain write+fsync in {root} (fsync on, {args.seconds:g} s per side per row)")
    header = (
        "batch",
        "group",
        "entry B",
        "wal entries/s",
        "wal records/s",
        "wal MB/s",
        "plain MB/s",
        "ratio",
    )
    print("{:>6} {:>6} {:>8} {:>14} {:>14} {:>9} {:>11} {:>6}".format(*header))
    try:
        for rows in BATCH_SIZES:
            for group in GROUPS:
                directory = root / f"b{rows}-g{group}"
                directory.mkdir()
                wal, plain, group_bytes = measure(directory, payloads[rows], group, args.seconds)
                shutil.rmtree(directory)
                entries_per_s = wal.iterations * group / wal.seconds
                wal_mb = wal.iterations * group_bytes / wal.seconds / 1e6
                plain_mb = plain.iterations * group_bytes / plain.seconds / 1e6
                print(
                    f"{rows:>6} {group:>6} {len(payloads[rows]):>8} {entries_per_s:>14,.0f} "
                    f"{entries_per_s * rows:>14,.0f} {wal_mb:>9.2f} {plain_mb:>11.2f} "
                    f"{wal_mb / plain_mb:>6.2f}"
                )
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
