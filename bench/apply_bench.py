"""Apply micro-benchmark: does applying an entry get slower as a shard takes writes?

A shard's state machine applies N exactly-once entries of one put each (the shape of a
busy client's small writes) to a fresh RocksDB KV, with the entries' timestamps one
millisecond apart, and prints the median apply time of each block of entries. Every
exactly-once write replaces its client's serial-index key, leaving a tombstone; a scan
that walks those tombstones makes each apply slower than the one before. The ratio of
the last block's median to the first's should stay near 1.

Usage: python bench/apply_bench.py [--entries N] [--clients C] [--dir D]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))  # runs from a checkout, installed or not

from quorumstore.protocol.types import LogEntry
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import WriteBatchBuilder
from quorumstore.wire.metadata import ClientSerial

#: A realistic wall clock (ms since the epoch) for the entries' timestamps.
START_MS = 1_790_000_000_000


def entry_payload(index: int, clients: int) -> bytes:
    batch = WriteBatchBuilder()
    batch.add_put(f"bench/apply/{index:010d}", b"x" * 100)
    return batch.build(START_MS + index, ClientSerial(f"client/{index % clients}", index))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=8000)
    parser.add_argument("--clients", type=int, default=4, help="exactly-once client ids")
    parser.add_argument("--blocks", type=int, default=4, help="blocks of entries reported")
    parser.add_argument("--dir", help="parent of the temporary KV directory")
    args = parser.parse_args(argv)
    payloads = [entry_payload(i, args.clients) for i in range(args.entries)]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        kv = RocksKv(Path(tmp) / "kv")
        machine = ShardStateMachine(kv)
        seconds = []
        for offset, payload in enumerate(payloads):
            started = time.perf_counter()
            machine.apply([LogEntry(1, offset, 0, payload)])
            seconds.append(time.perf_counter() - started)
        kv.close()
    size = args.entries // args.blocks
    medians = [statistics.median(seconds[i * size : (i + 1) * size]) for i in range(args.blocks)]
    print(f"apply of one-put exactly-once entries, {args.clients} clients, RocksDB KV:")
    for i, median in enumerate(medians):
        print(f"  entries {i * size:>6}-{(i + 1) * size - 1:<6} median {median * 1e6:7.0f} us")
    print(f"  last block / first block: {medians[-1] / medians[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
