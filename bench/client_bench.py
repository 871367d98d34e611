"""Client benchmark: quorumstore's own client against the official `oxia` client.

Both clients talk to the same quorumstore cluster (3 nodes, replication factor 3,
WAL fsync on) on loopback. Each runs the same workloads with the same number of
concurrent callers, 100-byte values, over a key set it wrote itself:

* 80% get / 20% put (puts overwrite keys of the set);
* put only.

The official client (oxia 0.2.1) is synchronous, so its callers are threads sharing
one `oxia.Client`; quorumstore's blocking `Client` is driven the same way, and its
`AsyncClient` by as many asyncio tasks. Throughput counts the operations completed
inside the timed window, after a warm-up; any failed operation fails the run.

Usage: python bench/client_bench.py [--seconds S] [--callers N] [--keys K] [--shards N]
"""

from __future__ import annotations

# First: importing quorumstore turns gRPC's fork handlers off, which works only before
# grpc is imported (quorumstore/__init__.py).
import quorumstore  # noqa: F401

# isort: split
import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import oxia
from replication_bench import NODES, QuorumstoreCluster

from quorumstore import AsyncClient, Client
from quorumstore.testing import official_oxia_client

VALUE_BYTES = 100
WARMUP_S = 1.0
#: Workloads: name -> fraction of operations that are gets.
WORKLOADS = {"80% get / 20% put": 0.8, "100% put": 0.0}
#: How long closing the official client may take: its close() can hang joining its
#: discovery thread (see tests/process/conftest.py), so it is closed in the background.
OXIA_CLOSE_WAIT_S = 5.0


def _value() -> bytes:
    return os.urandom(VALUE_BYTES)


def _keys(prefix: str, count: int) -> list[str]:
    return [f"/bench/{prefix}/{i:06d}" for i in range(count)]


def run_threads(
    get: Callable[[str], object],
    put: Callable[[str, bytes], object],
    keys: list[str],
    read_fraction: float,
    callers: int,
    seconds: float,
) -> float:
    """Operations per second of `callers` threads looping over random gets and puts."""
    value = _value()
    start = time.monotonic()
    window_start, window_end = start + WARMUP_S, start + WARMUP_S + seconds
    counts = [0] * callers
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        rng = random.Random(index)
        try:
            while time.monotonic() < window_end and not errors:
                key = keys[rng.randrange(len(keys))]
                if rng.random() < read_fraction:
                    get(key)
                else:
                    put(key, value)
                if window_start <= time.monotonic() <= window_end:
                    counts[index] += 1
        except BaseException as e:  # noqa: BLE001 - the first failure fails the run
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"an operation failed: {errors[0]!r}") from errors[0]
    return sum(counts) / seconds


async def run_tasks(
    client: AsyncClient, keys: list[str], read_fraction: float, callers: int, seconds: float
) -> float:
    """Operations per second of `callers` asyncio tasks sharing one AsyncClient."""
    value = _value()
    loop = asyncio.get_running_loop()
    window_start = loop.time() + WARMUP_S
    window_end = window_start + seconds
    completed = 0

    async def worker(index: int) -> None:
        nonlocal completed
        rng = random.Random(index)
        while loop.time() < window_end:
            key = keys[rng.randrange(len(keys))]
            if rng.random() < read_fraction:
                await client.get(key)
            else:
                await client.put(key, value)
            if window_start <= loop.time() <= window_end:
                completed += 1

    async with asyncio.TaskGroup() as group:
        for i in range(callers):
            group.create_task(worker(i))
    return completed / seconds


def _preload_threads(put: Callable[[str, bytes], object], keys: list[str], callers: int) -> None:
    value = _value()
    chunks = [keys[i::callers] for i in range(callers)]
    threads = [
        threading.Thread(target=lambda chunk=chunk: [put(k, value) for k in chunk], daemon=True)
        for chunk in chunks
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _close_oxia(client: oxia.Client) -> None:
    closer = threading.Thread(target=client.close, name="oxia-close", daemon=True)
    closer.start()
    closer.join(OXIA_CLOSE_WAIT_S)


def bench_oxia(address: str, args: argparse.Namespace) -> dict[str, float]:
    client = official_oxia_client(address)
    try:
        keys = _keys("oxia", args.keys)
        _preload_threads(client.put, keys, args.callers)
        return {
            name: run_threads(client.get, client.put, keys, fraction, args.callers, args.seconds)
            for name, fraction in WORKLOADS.items()
        }
    finally:
        _close_oxia(client)


def bench_client(address: str, args: argparse.Namespace) -> dict[str, float]:
    with Client(address) as client:
        keys = _keys("client", args.keys)
        client.put_many((keys, [_value()] * len(keys)))
        return {
            name: run_threads(client.get, client.put, keys, fraction, args.callers, args.seconds)
            for name, fraction in WORKLOADS.items()
        }


async def bench_async_client(address: str, args: argparse.Namespace) -> dict[str, float]:
    async with AsyncClient(address) as client:
        keys = _keys("async", args.keys)
        await client.put_many((keys, [_value()] * len(keys)))
        return {
            name: await run_tasks(client, keys, fraction, args.callers, args.seconds)
            for name, fraction in WORKLOADS.items()
        }


def print_report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> bool:
    """The side-by-side table; True if quorumstore's clients are at least as fast."""
    columns = list(results)
    header = ["workload", *columns, "Client/oxia", "AsyncClient/oxia"]
    rows = [header]
    ok = True
    for name in WORKLOADS:
        theirs = results["oxia 0.2.1 Client"][name]
        ours = results["quorumstore Client"][name]
        ours_async = results["quorumstore AsyncClient"][name]
        ok = ok and ours >= theirs and ours_async >= theirs
        rows.append(
            [
                name,
                *(f"{results[c][name]:.0f} ops/s" for c in columns),
                f"{ours / theirs:.1f}x",
                f"{ours_async / theirs:.1f}x",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print(
        f"client benchmark: quorumstore cluster of {NODES} nodes, replication factor {NODES}, "
        f"{args.shards} shard(s), WAL fsync on, loopback, {os.cpu_count()} CPUs"
    )
    print(
        f"  {args.callers} concurrent callers per client, {VALUE_BYTES}-byte values, "
        f"{args.keys} keys, {args.seconds:g} s per run after {WARMUP_S:g} s warm-up"
    )
    for row in rows:
        print(
            "  "
            + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
            )
        )
    verdict = "at least as fast as" if ok else "SLOWER than"
    print(f"quorumstore's clients are {verdict} the official oxia client in every workload")
    return ok


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="timed window per run")
    parser.add_argument("--callers", type=int, default=64, help="concurrent callers per client")
    parser.add_argument("--keys", type=int, default=1000, help="keys each client works on")
    parser.add_argument("--shards", type=int, default=1, help="quorumstore shards")
    parser.add_argument(
        "--dir", type=Path, default=None, help="parent of the temporary data directory"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="client-bench-", dir=args.dir) as base,
            QuorumstoreCluster(Path(base), args.shards) as cluster,
        ):
            # The first shard's leader: the official client is then served without a relay
            # (quorumstore serves grpc-python clients as a gateway through the node they ask).
            address = cluster.leader_of(0)
            results = {
                "oxia 0.2.1 Client": bench_oxia(address, args),
                "quorumstore Client": bench_client(address, args),
                "quorumstore AsyncClient": asyncio.run(bench_async_client(address, args)),
            }
    except KeyboardInterrupt:
        print("interrupted; every quorumstore process was stopped", file=sys.stderr)
        return 130
    return 0 if print_report(results, args) else 1


if __name__ == "__main__":
    sys.exit(main())
