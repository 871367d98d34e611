"""bench/replication_floor_bench.py's floor: three real processes that commit batched puts
on a majority of fsynced copies, measured by the replication benchmark's own code."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
import replication_floor_bench as floor_bench
from replication_bench import Row

LOG_WAIT_S = 10.0


def _logs(base: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(base.glob("log-*"))}


def _wait_until_every_log_holds(base: Path, keys: list[bytes]) -> dict[str, bytes]:
    """Each of the three logs once it holds every key (a follower may lag by an entry)."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        logs = _logs(base)
        if len(logs) == 3 and all(k in data for data in logs.values() for k in keys):
            return logs
        if time.monotonic() > deadline:
            missing = {name: [k for k in keys if k not in data] for name, data in logs.items()}
            raise AssertionError(f"logs {sorted(logs)} miss keys: {missing}")
        time.sleep(0.05)


STREAMED = pytest.mark.parametrize("streamed", [False, True], ids=["Write", "WriteStream"])


@STREAMED
def test_concurrent_puts_share_writes_and_reach_every_copy(tmp_path: Path, streamed: bool) -> None:
    keys = [b"floor/%04d" % i for i in range(64)]

    async def scenario(leader: str) -> list[int]:
        client = floor_bench.FloorClient(leader, streamed=streamed)
        try:
            await asyncio.wait_for(client.put(b"floor/first", b"v"), floor_bench.READY_TIMEOUT_S)
            return await asyncio.gather(*(client.put(k, b"v" * 100) for k in keys))
        finally:
            await client.close()

    with floor_bench.FloorCluster(tmp_path) as cluster:
        versions = asyncio.run(scenario(cluster.leader))
        cluster.check_alive()
        _wait_until_every_log_holds(tmp_path, keys)
    # The 64 puts queued behind the first write went out together, as one entry (offset 1).
    assert versions == list(range(1_000_000, 1_000_064))


@STREAMED
def test_puts_commit_with_a_follower_killed_and_stop_when_both_are(
    tmp_path: Path, streamed: bool
) -> None:
    async def put(leader: str, key: bytes, timeout_s: float) -> int:
        client = floor_bench.FloorClient(leader, streamed=streamed)
        try:
            return await asyncio.wait_for(client.put(key, b"v"), timeout_s)
        finally:
            await client.close()

    with floor_bench.FloorCluster(tmp_path) as cluster:
        asyncio.run(put(cluster.leader, b"floor/before", floor_bench.READY_TIMEOUT_S))
        first_follower, second_follower, _leader = cluster.pids().values()
        os.kill(first_follower, signal.SIGKILL)
        # The leader's copy and the other follower's are a majority.
        asyncio.run(put(cluster.leader, b"floor/one-down", 10.0))
        os.kill(second_follower, signal.SIGKILL)
        with pytest.raises(TimeoutError):
            asyncio.run(put(cluster.leader, b"floor/two-down", 2.0))


@pytest.mark.parametrize("streamed", [False, True], ids=["Write", "WriteStream"])
def test_run_floor_measures_latency_throughput_and_cpu(tmp_path: Path, streamed: bool) -> None:
    args = argparse.Namespace(seconds=1.0, latency_n=100, inflight=8)
    with floor_bench.FloorCluster(tmp_path) as cluster:
        row = asyncio.run(floor_bench.run_floor(cluster, args, streamed=streamed))
    assert 0 < row.p50_ms <= row.p99_ms
    assert row.puts_s > 0 and row.load_p99_ms > 0
    assert row.nodes_cpu_us > 0 and row.driver_cpu_us > 0
    assert len(row.rss_mb) == 3


def test_report_sets_the_better_floor_against_the_bar(capsys: pytest.CaptureFixture[str]) -> None:
    def row(puts_s: float) -> Row:
        return Row(
            p50_ms=1, p99_ms=2, puts_s=puts_s, load_p99_ms=3, nodes_cpu_us=8, driver_cpu_us=2
        )

    args = argparse.Namespace(seconds=5.0, latency_n=300, inflight=64)
    floor_bench.print_report(row(1000), row(4000), row(4500), row(3000), args)
    out = capsys.readouterr().out
    [puts] = [line for line in out.splitlines() if line.startswith("  puts/s (64 in flight, 5 s)")]
    assert puts.split()[-7:] == ["1000", "4000", "4500", "3000", "4.00x", "4.50x", "3.00x"]
    assert out.rstrip().endswith(
        "best floor puts/s = 4.5x etcd (BELOW the 5x bar); quorumstore client reaches 75% of "
        "the Write floor, 67% of the best"
    )
    floor_bench.print_report(row(1000), row(5000), row(4000), row(3000), args)
    assert "best floor puts/s = 5.0x etcd (above the 5x bar)" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--seconds", "0"], ["--inflight", "0"], ["--latency-n", "99"]])
def test_refuses_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        floor_bench.main(argv)
