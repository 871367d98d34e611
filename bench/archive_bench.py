"""Archive benchmark: what the archive costs writes, how far behind it runs, and how long
a restore of 10^6 keys takes beside Spark's RocksDB provider recovering as many, one run.

1. Writes. `quorumstore cluster`s of 3 nodes on loopback (replication factor 3, WAL
   fsync on, `--shards` shards), one per configuration, in `--rounds` interleaved rounds:
   no archive; `--archive-url` a local directory (shipped in the background, a round
   about every second); the same with `--archive-sync` (a write is answered only once
   its entry is archived); with `--s3`, an archive in a bucket of a moto S3 server on
   loopback (a process of its own), shipped in the background. Each takes the same
   load through one `AsyncClient`: `--latency-n` puts one at a time (p50, p99: what one
   write waits), then `--inflight` puts in flight for `--seconds` after a 1 s warm-up
   (bench/measure.py's throughput loop; the client batches concurrent puts per shard):
   puts/s, p50 and p99 of those puts, the node processes' CPU per put in the window,
   and puts per log entry. Meanwhile the coordinator's status (`quorumstore status`)
   is read every 0.1 s: the largest archive lag a shard's leader reported (committed
   entries not yet archived, and the age of the oldest: what losing every disk at that
   moment would lose), and after the load, the seconds until every shard's lag is 0.
   The leaders report to the coordinator on its ticks, so both are as of the last
   report. Medians over the rounds; the lag and the drain time are the worst round's.
2. Restore. A cluster of `--restore-shards` shards with a local archive (default
   archive settings) gets `--keys` keys of 24-byte values (a row of state_store_bench's
   aggregation state: null bits, count, sum) through `put_many`, until the archive
   holds them all (lag 0); it is stopped. Timed, each a command from its start:
   `quorumstore restore` into a new directory; `quorumstore cluster` with the archive on
   an empty data directory (it restores, then starts) until it serves and a read
   succeeds; then sampled keys are read back and checked. A restore rebuilds each shard
   once (its snapshot, then its segments) and copies it to each of the 3 members.
   Beside them, state_store_bench's RocksDB phases over as many keys (`--partitions`
   partitions, local[2]): the state built in a Spark process, then a new one, with
   empty executor directories, restarts the query from its checkpoint; its first
   micro-batch (loading the whole state, then one batch of `--rows` updates and its
   commit) is the recovery time. With Spark's default (changelog checkpointing off:
   each version checkpointed as files) and with changelog checkpointing on
   (`--rocksdb-changelog`, default both).

Usage: python bench/archive_bench.py [--seconds 10] [--inflight 64] [--latency-n 500]
                                     [--rounds 2] [--shards 1] [--s3] [--keys 1000000]
                                     [--restore-shards 4] [--rocksdb-changelog both]
                                     [--only writes|restore] [--dir D]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from measure import measure_latency, measure_throughput
from replication_bench import _cpu_seconds
from state_store_bench import REPO, free_base_port, load_and_recover, start_cluster, write_inputs

from quorumstore import AsyncClient
from quorumstore.cli.errors import CliError
from quorumstore.cli.status import fetch_status
from quorumstore.proto import replication_pb2 as pb

NODES = 3
WARMUP_S = 1.0
SAMPLE_S = 0.1
DRAIN_TIMEOUT_S = 300.0
#: Keys per `put_many` call while loading the restore's keys.
LOAD_CHUNK = 100_000
#: Keys read back from the restored cluster.
CHECKED_KEYS = 1000
BUCKET = "qs-archive-bench"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# ---------------------------------------------------------------------- clusters


@dataclass
class Running:
    """A started `quorumstore cluster`: its supervisor process and addresses."""

    process: subprocess.Popen[bytes]
    address: str

    @property
    def nodes(self) -> list[str]:
        return self.address.split(",")

    @property
    def admin(self) -> str:
        """The coordinator's status port: right after the nodes' ports."""
        host, _, port = self.nodes[0].rpartition(":")
        return f"{host}:{int(port) + NODES}"

    def node_pids(self) -> list[int]:
        """The `quorumstore node` processes (the coordinator is off the write path)."""
        return [
            child.pid
            for child in psutil.Process(self.process.pid).children(recursive=True)
            if "node" in child.cmdline()[3:4]
        ]


@contextmanager
def cluster(
    data_dir: Path, shards: int, flags: Sequence[str], base: int | None = None
) -> Iterator[Running]:
    """state_store_bench's `quorumstore cluster` (fsync on) with `flags`, stopped on exit
    as Ctrl-C stops it (the supervisor stops its nodes and coordinator)."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    process, address = start_cluster(data_dir, fsync=True, shards=shards, base=base, extra=flags)
    try:
        yield Running(process, address)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "python")}


# ---------------------------------------------------------------------- archive lag


@dataclass(frozen=True)
class ShardLag:
    """One shard's leader's last report: commit offset and, with an archive, its lag."""

    commit: int
    entries: int | None = None
    seconds: float = 0.0
    error: str = ""


def shard_lags(status: pb.ClusterStatus) -> dict[str, ShardLag]:
    """Shard -> its current leader's report (as `quorumstore status` picks it); shards
    without one are left out."""
    leaders = {
        (r.namespace, r.shard, r.node, r.term): r for r in status.replicas if r.role == pb.LEADER
    }
    lags = {}
    for m in status.metadata.shards:
        report = leaders.get((m.namespace, m.shard, m.leader, m.term))
        if report is None:
            continue
        if report.HasField("archive"):
            a = report.archive
            lags[f"{m.namespace}/{m.shard}"] = ShardLag(
                report.commit_offset, a.lag_entries, a.lag_seconds, a.error
            )
        else:
            lags[f"{m.namespace}/{m.shard}"] = ShardLag(report.commit_offset)
    return lags


def status_lags(admin: str) -> dict[str, ShardLag]:
    return shard_lags(fetch_status(admin, timeout=2))


class LagSampler:
    """Reads the coordinator's status every SAMPLE_S on a thread of its own and keeps the
    largest archive lag any shard reported, and any upload error."""

    def __init__(self, admin: str) -> None:
        self._admin = admin
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)
        self.max_entries = 0
        self.max_seconds = 0.0
        self.samples = 0
        self.errors: set[str] = set()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                lags = status_lags(self._admin)
            except CliError:
                continue
            self.samples += 1
            for lag in lags.values():
                if lag.entries is not None:
                    self.max_entries = max(self.max_entries, lag.entries)
                    self.max_seconds = max(self.max_seconds, lag.seconds)
                if lag.error:
                    self.errors.add(lag.error)


def wait_archived(admin: str, shards: int, timeout_s: float = DRAIN_TIMEOUT_S) -> float:
    """Seconds until every shard's leader reports an archive lag of 0 and no error."""
    started = time.monotonic()
    last: dict[str, ShardLag] = {}
    while time.monotonic() - started < timeout_s:
        try:
            last = status_lags(admin)
        except CliError:
            pass
        else:
            if len(last) == shards and all(
                lag.entries == 0 and not lag.error for lag in last.values()
            ):
                return time.monotonic() - started
        time.sleep(SAMPLE_S / 2)
    raise TimeoutError(f"the archive did not catch up within {timeout_s:g} s: {last}")


# ---------------------------------------------------------------------- writes


@dataclass
class WriteRun:
    """One configuration's numbers in one round."""

    single_p50_ms: float = 0.0
    single_p99_ms: float = 0.0
    puts_s: float = 0.0
    load_p50_ms: float = 0.0
    load_p99_ms: float = 0.0
    node_cpu_us: float = 0.0
    puts_per_entry: float = 0.0
    archived: bool = False
    max_lag_entries: int = 0
    max_lag_s: float = 0.0
    drained_s: float = 0.0
    errors: set[str] = field(default_factory=set)


async def measure_writes(running: Running, args: argparse.Namespace, archived: bool) -> WriteRun:
    """The single puts, then the loaded window with the lag sampled, then the drain."""
    run = WriteRun(archived=archived)
    loop = asyncio.get_running_loop()
    async with AsyncClient(running.nodes) as client:

        async def put(key: bytes, value: bytes) -> None:
            await client.put(key.decode(), value)

        run.single_p50_ms, run.single_p99_ms = await measure_latency(put, n=args.latency_n)

        samples: list[tuple[float, float]] = []  # (completed at, latency ms)
        cpu: list[float] = []
        pids = running.node_pids()

        async def timed(key: bytes, value: bytes) -> None:
            start = loop.time()
            await client.put(key.decode(), value)
            end = loop.time()
            samples.append((end, (end - start) * 1000.0))

        before = await asyncio.to_thread(status_lags, running.admin)
        with LagSampler(running.admin) as sampler:
            # The window measure_throughput counts puts in.
            window_start = loop.time() + WARMUP_S
            loop.call_at(window_start, lambda: cpu.append(_cpu_seconds(pids)))
            loop.call_at(window_start + args.seconds, lambda: cpu.append(_cpu_seconds(pids)))
            run.puts_s = await measure_throughput(
                timed, inflight=args.inflight, seconds=args.seconds, warmup_s=WARMUP_S
            )
        after = await asyncio.to_thread(status_lags, running.admin)
        if archived:
            run.drained_s = await asyncio.to_thread(wait_archived, running.admin, args.shards)
    window = [ms for at, ms in samples if window_start <= at <= window_start + args.seconds]
    cuts = statistics.quantiles(window, n=100, method="inclusive")
    run.load_p50_ms, run.load_p99_ms = cuts[49], cuts[98]
    run.node_cpu_us = (cpu[1] - cpu[0]) * 1e6 / (run.puts_s * args.seconds)
    entries = sum(after[s].commit - before[s].commit for s in after if s in before)
    run.puts_per_entry = len(samples) / entries if entries else 0.0
    run.max_lag_entries, run.max_lag_s = sampler.max_entries, sampler.max_seconds
    run.errors = sampler.errors
    return run


@contextmanager
def moto_s3(work: Path) -> Iterator[str]:
    """A moto S3 server on loopback, in a process of its own, with the bench's bucket;
    yields its endpoint. The cluster's processes find it through fsspec's environment
    configuration (FSSPEC_S3_ENDPOINT_URL), set here for the bench's lifetime."""
    import s3fs

    port = free_base_port(1)
    endpoint = f"http://127.0.0.1:{port}"
    with open(work / "moto.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    saved = {k: os.environ.get(k) for k in [*S3_ENV, "FSSPEC_S3_ENDPOINT_URL"]}
    os.environ.update({**S3_ENV, "FSSPEC_S3_ENDPOINT_URL": endpoint})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"moto server did not start: see {work / 'moto.log'}")
                time.sleep(0.1)
        s3fs.S3FileSystem(
            key=S3_ENV["AWS_ACCESS_KEY_ID"],
            secret=S3_ENV["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=endpoint,
        ).mkdir(BUCKET)
        yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        process.terminate()
        process.wait(30)


def write_configs(work: Path, round_: int, s3: bool) -> dict[str, list[str]]:
    """Configuration name -> the archive flags of its cluster (a new archive each round)."""
    local = ["--archive-url", str(work / f"archive-{round_}")]
    configs = {
        "no archive": [],
        "local archive": local,
        "local archive, sync": [
            "--archive-url",
            str(work / f"archive-sync-{round_}"),
            "--archive-sync",
        ],
    }
    if s3:
        configs["S3 archive (moto)"] = ["--archive-url", f"s3://{BUCKET}/round-{round_}"]
    return configs


def bench_writes(work: Path, args: argparse.Namespace) -> dict[str, list[WriteRun]]:
    runs: dict[str, list[WriteRun]] = {}
    for round_ in range(args.rounds):
        for i, (name, flags) in enumerate(write_configs(work, round_, args.s3).items()):
            print(f"writes, round {round_ + 1}/{args.rounds}: {name} ...", flush=True)
            with cluster(work / f"writes-{round_}-{i}" / "data", args.shards, flags) as running:
                run = asyncio.run(measure_writes(running, args, archived=bool(flags)))
            runs.setdefault(name, []).append(run)
    return runs


# ---------------------------------------------------------------------- restore


def state_key(n: int) -> str:
    return f"state/key-{n:09d}"


def state_value(n: int) -> bytes:
    """A row of the aggregation's state as Spark stores it: null bits, count, sum."""
    return struct.pack("<qqq", 0, 1, n)


async def load_keys(nodes: list[str], keys: int) -> float:
    """Seconds to put `keys` keys with `put_many`, LOAD_CHUNK at a time."""
    started = time.monotonic()
    async with AsyncClient(nodes) as client:
        for start in range(0, keys, LOAD_CHUNK):
            ids = range(start, min(keys, start + LOAD_CHUNK))
            await client.put_many(([state_key(n) for n in ids], [state_value(n) for n in ids]))
    return time.monotonic() - started


async def read_back(nodes: list[str], keys: int, started: float) -> tuple[float, int]:
    """(seconds from `started` until the first read succeeded, wrong or missing values
    among CHECKED_KEYS sampled keys, the first and last included)."""
    async with AsyncClient(nodes) as client:
        await client.get(state_key(keys - 1))
        first_read = time.monotonic() - started
        rng = random.Random(11)
        ids = {0, keys - 1, *(rng.randrange(keys) for _ in range(CHECKED_KEYS - 2))}
        records = await asyncio.gather(
            *(client.get(state_key(n)) for n in ids), return_exceptions=True
        )
    wrong = sum(
        1
        for n, record in zip(ids, records, strict=True)
        if isinstance(record, BaseException) or record.value != state_value(n)
    )
    return first_read, wrong


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass
class RestoreRun:
    load_s: float = 0.0
    archived_after_s: float = 0.0
    archive_bytes: int = 0
    restore_s: float = 0.0
    restored_bytes: int = 0
    cli_startup_s: float = 0.0
    #: Per shard: the snapshot's size (MiB), and the entries replayed after it.
    snapshots_mib: list[float] = field(default_factory=list)
    entries_replayed: list[int] = field(default_factory=list)
    cluster_serving_s: float = 0.0
    cluster_first_read_s: float = 0.0
    wrong: int = 0


def bench_restore(work: Path, args: argparse.Namespace) -> RestoreRun:
    run = RestoreRun()
    archive = work / "restore-archive"
    flags = ["--archive-url", str(archive)]
    base = free_base_port(2 * NODES + 1)
    print(f"restore: loading {args.keys:,} keys ...", flush=True)
    with cluster(work / "restore-source" / "data", args.restore_shards, flags, base) as running:
        run.load_s = asyncio.run(load_keys(running.nodes, args.keys))
        run.archived_after_s = wait_archived(running.admin, args.restore_shards)
    run.archive_bytes = size_of(archive)

    print("restore: quorumstore restore ...", flush=True)
    restored = work / "restored"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "quorumstore.cli", "restore", "--archive-url", str(archive),
         "--data-dir", str(restored)],
        capture_output=True, text=True, env=cli_env(), check=False,
    )  # fmt: skip
    run.restore_s = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"quorumstore restore failed:\n{result.stdout}{result.stderr}")
    run.restored_bytes = size_of(restored)
    snapshots = re.findall(r"snapshot at offset (\d+) loaded \(([\d.]+) MiB\)", result.stdout)
    restored_at = re.findall(r"restored at offset (\d+)", result.stdout)
    run.snapshots_mib = [float(mib) for _, mib in snapshots]
    run.entries_replayed = [
        int(last) - int(offset) for (offset, _), last in zip(snapshots, restored_at, strict=True)
    ]
    shutil.rmtree(restored)
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "quorumstore.cli", "restore", "--help"],
        capture_output=True, env=cli_env(), check=True,
    )  # fmt: skip
    run.cli_startup_s = time.monotonic() - started

    print("restore: quorumstore cluster on an empty data directory ...", flush=True)
    started = time.monotonic()
    with cluster(work / "restore-empty" / "data", args.restore_shards, flags, base) as running:
        run.cluster_serving_s = time.monotonic() - started
        run.cluster_first_read_s, run.wrong = asyncio.run(
            read_back(running.nodes, args.keys, started)
        )
    return run


def bench_rocksdb(work: Path, args: argparse.Namespace) -> dict[str, dict[str, dict]]:
    """state_store_bench's RocksDB load and recover phases, per changelog setting."""
    inputs = work / "state-inputs"
    print(f"rocksdb: writing input for {args.keys:,} keys ...", flush=True)
    write_inputs(inputs, args.keys, args.build_batches, args.batches, args.rows)
    settings = {"off": [False], "on": [True], "both": [False, True]}[args.rocksdb_changelog]
    results = {}
    for changelog in settings:
        name = f"changelog {'on' if changelog else 'off'}"
        phases = work / f"rocksdb-{name.replace(' ', '-')}"
        phases.mkdir()
        (phases / "in").symlink_to(inputs)
        print(f"rocksdb, {name}:", flush=True)
        results[name] = load_and_recover(
            argparse.Namespace(
                work=str(phases),
                address=None,
                partitions=args.partitions,
                rocksdb_changelog=changelog,
            ),
            "rocksdb",
        )
    return results


# ---------------------------------------------------------------------- report


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else "-"


@dataclass(frozen=True)
class WriteSummary:
    """A configuration's rounds: medians, and the worst lag and drain."""

    runs: list[WriteRun]

    def median(self, name: str) -> float:
        return statistics.median(getattr(r, name) for r in self.runs)

    @property
    def archived(self) -> bool:
        return self.runs[0].archived

    def lag(self) -> str:
        entries = max(r.max_lag_entries for r in self.runs)
        puts = entries * self.median("puts_per_entry")
        seconds = max(r.max_lag_s for r in self.runs)
        return f"{entries} entries (~{puts:,.0f} puts), {seconds:.1f} s" if self.archived else "-"

    def drained(self) -> str:
        return f"{max(r.drained_s for r in self.runs):.2f} s" if self.archived else "-"


def report_writes(runs: dict[str, list[WriteRun]], args: argparse.Namespace) -> list[str]:
    """Prints the write table; returns the summary lines."""
    print()
    print(
        f"writes: {NODES} nodes, replication factor {NODES}, WAL fsync on, loopback, "
        f"{os.cpu_count()} CPUs, {args.shards} shard(s); 100-byte values; {args.latency_n} "
        f"single puts, then {args.inflight} in flight for {args.seconds:g} s; "
        f"{args.rounds} round(s): medians, lag and drain the worst round's"
    )
    header = ("", "puts/s", "ratio", "p50 ms", "p99 ms", "1-put p50", "1-put p99",
              "CPU/put", "puts/entry", "max archive lag", "lag 0 after")  # fmt: skip
    rows = [header]
    configs = {name: WriteSummary(rs) for name, rs in runs.items()}
    plain = configs["no archive"]
    summary = []
    for name, c in configs.items():
        rows.append(
            (
                name,
                f"{c.median('puts_s'):,.0f}",
                _ratio(c.median("puts_s"), plain.median("puts_s")),
                f"{c.median('load_p50_ms'):.2f}",
                f"{c.median('load_p99_ms'):.2f}",
                f"{c.median('single_p50_ms'):.2f}",
                f"{c.median('single_p99_ms'):.2f}",
                f"{c.median('node_cpu_us'):.0f} us",
                f"{c.median('puts_per_entry'):.1f}",
                c.lag(),
                c.drained(),
            )
        )
        if name == "no archive":
            continue

        def against(field_name: str, unit: str, fmt: str = ".2f", c: WriteSummary = c) -> str:
            ours, theirs = c.median(field_name), plain.median(field_name)
            return f"{ours:{fmt}}{unit} = {_ratio(ours, theirs)} no archive's {theirs:{fmt}}{unit}"

        summary += [
            f"puts/s, {name}: {against('puts_s', '', ',.0f')}",
            f"put p50 under load, {name}: {against('load_p50_ms', ' ms')}",
            f"put p99 under load, {name}: {against('load_p99_ms', ' ms')}",
            f"single put p50, {name}: {against('single_p50_ms', ' ms')}",
            f"archive lag under load, {name}: at most {c.lag()}; 0 {c.drained()} after the load",
        ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print(
            "  "
            + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
            )
        )
    if args.rounds > 1:
        rounds = "; ".join(
            f"{name} " + ", ".join(f"{r.puts_s:,.0f}" for r in rs) for name, rs in runs.items()
        )
        print(f"  puts/s per round: {rounds}")
    for name, rs in runs.items():
        for error in sorted(set().union(*(r.errors for r in rs))):
            print(f"  {name}: an upload failed during the load: {error}")
    return summary


def report_restore(
    run: RestoreRun, rocksdb: dict[str, dict[str, dict]], args: argparse.Namespace
) -> list[str]:
    """Prints the restore table; returns the summary lines."""
    print()
    print(
        f"restore: {args.keys:,} keys, 24-byte values; quorumstore: {args.restore_shards} "
        f"shards, {NODES} replicas each, fsync on, a local archive; RocksDB: "
        f"{args.partitions} partitions, local[2], {args.build_batches} batches of keys then "
        f"{args.batches} of {args.rows:,} updates"
    )
    print(
        f"  loaded with put_many in {run.load_s:.1f} s, all archived {run.archived_after_s:.1f} s "
        f"later; archive {run.archive_bytes / 2**20:.1f} MiB; restored data "
        f"{run.restored_bytes / 2**20:.1f} MiB ({NODES} replicas)"
    )
    print(
        "  the restore read per shard a snapshot of "
        + ", ".join(f"{mib:.1f}" for mib in run.snapshots_mib)
        + " MiB, then replayed "
        + ", ".join(str(n) for n in run.entries_replayed)
        + " archived entries"
    )
    references = {
        name: phases["recover"]["durations_ms"][0] / 1e3 for name, phases in rocksdb.items()
    }
    ours = {
        "quorumstore restore, into a new directory": run.restore_s,
        "quorumstore cluster on an empty directory, until it serves": run.cluster_serving_s,
        "quorumstore cluster on an empty directory, until a read succeeds": (
            run.cluster_first_read_s
        ),
    }
    width = max(len(name) for name in ours) + 2
    for name, seconds in ours.items():
        ratios = "  ".join(f"{_ratio(seconds, ref)} RocksDB {n}" for n, ref in references.items())
        print(f"  {name:{width}}{seconds:7.2f} s  {ratios}")
    for n, ref in references.items():
        print(f"  {f'RocksDB ({n}): first micro-batch after restart':{width}}{ref:7.2f} s")
        recovered = rocksdb[n]["recover"]["state_keys"]
        if recovered != args.keys:
            print(f"  RocksDB ({n}) recovered {recovered:,} keys, not {args.keys:,}")
    print(f"  (the quorumstore command line alone starts in {run.cli_startup_s:.2f} s)")
    verdict = "intact" if run.wrong == 0 else f"WRONG OR MISSING: {run.wrong}"
    print(f"  {CHECKED_KEYS:,} sampled keys read back from the restored cluster: {verdict}")
    summary = []
    for name, seconds in ours.items():
        if "until it serves" in name:
            continue
        ratios = ", ".join(f"{_ratio(seconds, ref)} RocksDB {n}" for n, ref in references.items())
        summary.append(f"{args.keys:,} keys, {name}: {seconds:.2f} s = {ratios}")
    for n, ref in references.items():
        summary.append(f"{args.keys:,} keys, RocksDB recovery ({n}), first batch: {ref:.2f} s")
    return summary


# ---------------------------------------------------------------------- main


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="loaded window per run")
    parser.add_argument("--inflight", type=int, default=64, help="puts in flight")
    parser.add_argument("--latency-n", type=int, default=500, help="single puts timed")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of writes")
    parser.add_argument("--shards", type=int, default=1, help="shards of the write clusters")
    parser.add_argument("--s3", action="store_true", help="also an archive on moto's S3 server")
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys restored")
    parser.add_argument("--restore-shards", type=int, default=4)
    parser.add_argument(
        "--rocksdb-changelog", choices=["off", "on", "both"], default="both",
        help="RocksDB's changelog checkpointing (Spark's default: off)",
    )  # fmt: skip
    parser.add_argument("--partitions", type=int, default=4, help="RocksDB's partitions")
    parser.add_argument("--build-batches", type=int, default=4, help="RocksDB: batches of keys")
    parser.add_argument("--batches", type=int, default=10, help="RocksDB: update batches")
    parser.add_argument("--rows", type=int, default=20_000, help="RocksDB: rows per update")
    parser.add_argument("--only", choices=["writes", "restore"], help="one part alone")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    args = parser.parse_args(argv)
    if min(args.seconds, args.inflight, args.rounds, args.shards, args.keys) <= 0:
        parser.error("every number must be positive")
    if args.latency_n < 100:
        parser.error("--latency-n: a p99 needs at least 100 puts")
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    summary: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="archive-bench-", dir=args.dir) as tmp:
            work = Path(tmp)
            if args.only != "restore":
                if args.s3:
                    with moto_s3(work):
                        runs = bench_writes(work, args)
                else:
                    runs = bench_writes(work, args)
                summary += report_writes(runs, args)
            if args.only != "writes":
                restore = bench_restore(work, args)
                rocksdb = bench_rocksdb(work, args)
                summary += report_restore(restore, rocksdb, args)
    except KeyboardInterrupt:
        print("interrupted; every process the bench started was stopped", file=sys.stderr)
        return 130
    print()
    print("summary")
    for line in summary:
        print(f"  {line}")
    print(f"(ran {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
