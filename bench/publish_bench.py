"""Publishing one large staged part: the time it takes and the memory the node holds.

A DataFrame write stages each shard's rows on the shard's leader, then publishes them
as one write; a part larger than one entry is replicated as pieces and applied by one
entry in one KV write (see docs/dataframes.md). This starts a standalone node (one
shard, fsync on), stages `--mb` megabytes of rows (13-byte keys, `--value-bytes` values)
through the data service as the DataFrame writer's tasks do, publishes them, and prints
per size: rows, the publish's duration, the node's resident memory before it, its peak
during it (sampled every 20 ms, with the kernel's high-water mark), and the growth
(peak minus before) over the part's size.

Usage: python bench/publish_bench.py [--mb 50,220] [--value-bytes 100]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pyarrow as pa
from etcd_peer import _RssSampler

from quorumstore.client.data_service import DataClient
from quorumstore.testing import standalone_server
from quorumstore.wire.metadata import ClientSerial

KEY_BYTES = 13
ROWS_PER_CHUNK = 100_000


def _node_pid(data_dir: Path) -> int:
    """The standalone server that `standalone_server` started on `data_dir`."""
    for child in psutil.Process().children():
        if "standalone" in child.cmdline() and str(data_dir) in child.cmdline():
            return child.pid
    raise RuntimeError(f"no standalone server on {data_dir} among this process's children")


def _stage(client: DataClient, write_id: str, rows: int, value_bytes: int) -> int:
    """Stages `rows` rows in chunks as the writer's tasks do; returns the chunk count."""
    value = pa.scalar(b"v" * value_bytes, pa.binary())
    chunks = 0
    for start in range(0, rows, ROWS_PER_CHUNK):
        count = min(rows, start + ROWS_PER_CHUNK) - start
        keys = pa.array([f"k{i:0{KEY_BYTES - 1}d}" for i in range(start, start + count)])
        client.stage(
            0, write_id, "part", chunks, pa.table({"key": keys, "value": pa.repeat(value, count)})
        )
        chunks += 1
    return chunks


def measure(mb: int, value_bytes: int) -> dict[str, float]:
    """Stages and publishes one part of `mb` megabytes on a fresh node."""
    rows = mb * 1_000_000 // (KEY_BYTES + value_bytes)
    with tempfile.TemporaryDirectory(prefix="publish-bench-") as tmp:
        data_dir = Path(tmp) / "node"
        with standalone_server(data_dir) as address, DataClient(address) as client:
            pid = _node_pid(data_dir)
            write_id = uuid.uuid4().hex
            chunks = _stage(client, write_id, rows, value_bytes)
            before_mb = psutil.Process(pid).memory_info().rss / 2**20
            sampler = _RssSampler(lambda: {0: pid}, 0.02)
            sampler.start()
            started = time.monotonic()
            result = client.publish(
                0, write_id, [("part", chunks, rows)], origin=ClientSerial("publish-bench", 1)
            )
            seconds = time.monotonic() - started
            peak_mb = sampler.finish()[0]
    if result.rows != rows:
        raise SystemExit(f"the publish wrote {result.rows} rows, not {rows}")
    return {"rows": rows, "seconds": seconds, "before_mb": before_mb, "peak_mb": peak_mb}


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mb takes sizes like 50,220, got {text!r}") from None
    if any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"--mb sizes must be at least 1, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=_sizes, default=[50, 220], help="part sizes, e.g. 50,220")
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args(argv)
    if args.value_bytes < 1:
        parser.error(f"--value-bytes must be at least 1, got {args.value_bytes}")
    print(f"one shard's part published on a standalone node, {args.value_bytes}-byte values")
    print(
        f"{'part MB':>8} {'rows':>11} {'publish s':>10} {'RSS before':>11} {'peak RSS':>10} {'growth/part':>11}"
    )
    for mb in args.mb:
        m = measure(mb, args.value_bytes)
        print(
            f"{mb:>8} {m['rows']:>11,} {m['seconds']:>10.1f} {m['before_mb']:>7,.0f} MiB"
            f" {m['peak_mb']:>6,.0f} MiB {(m['peak_mb'] - m['before_mb']) / mb * 1.048576:>11.1f}x",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
