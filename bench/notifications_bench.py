"""Writes under notification subscribers: puts/s of 64 writers while N subscribers follow
the shard, for several N, on one standalone node (one shard, fsync on).

Each subscriber is an Oxia `GetNotifications` stream, as the official clients open one
per shard; all of them run in one separate process, so that the writers' process does
no subscriber work. Printed per N: the writers' puts/s and its ratio to the first N's
(0 by default: none), the notifications the subscribers received per second, and the node's CPU
time per put.

Usage: python bench/notifications_bench.py [--subscribers 0,10,30] [--seconds S]
"""

from __future__ import annotations

# First: importing quorumstore turns gRPC's fork handlers off, which works only before
# grpc is imported (quorumstore/__init__.py).
import quorumstore  # noqa: F401

# isort: split
import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil
from measure import measure_throughput

from quorumstore import AsyncClient
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc as pb_grpc
from quorumstore.testing import standalone_server

INFLIGHT = 64


async def _subscribe(address: str, count: int) -> None:
    """Follows shard 0 with `count` streams until stdin closes; prints the total received."""
    received = 0

    async def follow() -> None:
        nonlocal received
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.OxiaClientStub(channel)
            async for batch in stub.GetNotifications(pb.NotificationsRequest(shard=0)):
                received += len(batch.notifications)

    streams = [asyncio.create_task(follow()) for _ in range(count)]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for stream in streams:
        stream.cancel()
    print(received, flush=True)


async def _write(address: str, seconds: float) -> float:
    async with AsyncClient(address) as client:

        async def put(key: bytes, value: bytes) -> None:
            await client.put(key.decode(), value)

        return await measure_throughput(put, inflight=INFLIGHT, seconds=seconds, warmup_s=1.0)


def _run(
    address: str, node: psutil.Process, subscribers: int, seconds: float
) -> tuple[float, float, float]:
    """(puts/s, notifications received per second, node CPU µs per put) with `subscribers`."""
    follower = subprocess.Popen(
        [sys.executable, __file__, "--follow", address, str(subscribers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert follower.stdin is not None and follower.stdout is not None
    try:
        if follower.stdout.readline().strip() != "ready":
            raise RuntimeError("the subscriber process did not start")
        time.sleep(0.5)  # let the streams open
        cpu_before, started = node.cpu_times(), time.monotonic()
        puts_s = asyncio.run(_write(address, seconds))
        cpu_after, elapsed = node.cpu_times(), time.monotonic() - started
        follower.stdin.close()
        received = int(follower.stdout.readline())
    finally:
        follower.kill()
        follower.wait()
    node_cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    puts = puts_s * seconds
    return puts_s, received / elapsed, node_cpu_s / puts * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", default="0,10,30", help="comma-separated counts")
    parser.add_argument("--seconds", type=float, default=5.0, help="writing time per count")
    parser.add_argument("--follow", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.follow:
        asyncio.run(_subscribe(args.follow[0], int(args.follow[1])))
        return 0
    try:
        counts = [int(n) for n in args.subscribers.split(",")]
    except ValueError:
        parser.error(f"--subscribers takes comma-separated counts, got {args.subscribers!r}")
    if any(n < 0 for n in counts) or args.seconds <= 0:
        parser.error("subscriber counts must be >= 0 and --seconds positive")
    print(
        f"one standalone node, 1 shard, fsync on; {INFLIGHT} writers (AsyncClient), 100-byte "
        f"values, {args.seconds:g} s per row; subscribers in their own process"
    )
    print(
        f"{'subscribers':>11}  {'puts/s':>9}  {'vs ' + str(counts[0]):>7}  {'notifications/s':>15}  "
        f"{'node CPU per put':>16}"
    )
    with tempfile.TemporaryDirectory() as data, standalone_server(Path(data)) as address:
        node = next(
            p for p in psutil.process_iter(["cmdline"]) if data in " ".join(p.info["cmdline"] or [])
        )
        baseline = None
        for count in counts:
            puts_s, notified_s, cpu_us = _run(address, node, count, args.seconds)
            baseline = baseline or puts_s
            print(
                f"{count:>11}  {puts_s:>9,.0f}  {puts_s / baseline:>6.2f}x  {notified_s:>15,.0f}  "
                f"{cpu_us:>13.0f} µs",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
