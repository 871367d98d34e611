"""State-store benchmark: the same stateful aggregation on Spark's RocksDB provider and on
quorumstore's provider, in one run, with the ratios.

For each provider, in its own JVM (a fresh Python + Spark process per phase):

1. load:    build the state of `--keys` distinct keys (`--build-batches` micro-batches),
            then run `--batches` micro-batches that each update `--rows` random existing
            keys. Reported: median micro-batch duration of those, and the memory the
            executor holds for the state (the provider's own `memoryUsedBytes`; the
            JVM heap live after a full GC minus the same before the query; and the
            process's resident set minus the same before: everything the executor holds,
            on and off the heap, as the operating system counts it).
2. recover: a new process with empty executor state directories (new spark.local.dir)
            warms up on a small query of its own, then restarts the query from its
            checkpoint on one more micro-batch. Reported: that first micro-batch's duration,
            which includes loading the whole state.

The query is `groupBy(k).agg(count, sum)` in update mode over Parquet files (one file per
micro-batch), written to the `noop` sink; local[2], `--partitions` shuffle partitions.
RocksDB runs with Spark's defaults (changelog checkpointing off: every version is
checkpointed as files) unless `--rocksdb-changelog` turns changelog checkpointing on.
quorumstore is a 3-node cluster with replication factor 3 started here (`quorumstore
cluster`), unless `--address` names a running one.

Usage: python bench/state_store_bench.py [--keys 1000000] [--batches 10] [--rows 20000]
                                           [--rocksdb-changelog]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))  # runs from a checkout, installed or not

from quorumstore.spark.state_store import PROVIDER_CLASS, ROCKSDB_PROVIDER_CLASS, spark_confs

PROVIDERS = {"rocksdb": ROCKSDB_PROVIDER_CLASS, "quorumstore": PROVIDER_CLASS}
MAINTENANCE_INTERVAL = "5s"
ROCKSDB_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


# ------------------------------------------------------------------ input


def write_inputs(directory: Path, keys: int, build_batches: int, batches: int, rows: int) -> None:
    """Parquet files: the build batches cover every key once, then `batches` + 1 update
    batches (the last one is the recovery batch), with increasing modification times."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    rng = random.Random(7)
    per_build = -(-keys // build_batches)
    files = [
        list(range(start, min(keys, start + per_build))) for start in range(0, keys, per_build)
    ]
    files += [[rng.randrange(keys) for _ in range(rows)] for _ in range(batches + 1)]
    for i, ids in enumerate(files):
        table = pa.table({"k": [f"key-{n:09d}" for n in ids], "v": pa.array(ids, pa.int64())})
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def input_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("part-*.parquet"))


# ------------------------------------------------------------------ one phase (child process)


def run_phase(args: argparse.Namespace) -> dict:
    """Runs one phase of one provider in this process and returns its measurements."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQuery

    work = Path(args.work)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"state-store-bench-{args.provider}-{args.phase}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.local.dir", str(work / f"local-{args.provider}-{args.phase}"))
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.sql.streaming.stateStore.maintenanceInterval", MAINTENANCE_INTERVAL)
    )
    for key, value in spark_confs(args.address).items():
        builder = builder.config(key, value)
    builder = builder.config(
        "spark.sql.streaming.stateStore.providerClass", PROVIDERS[args.provider]
    )
    if args.rocksdb_changelog:
        builder = builder.config(ROCKSDB_CHANGELOG, "true")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark._jvm
    assert jvm is not None, "the bench runs PySpark classic, not Spark Connect"

    jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())

    def memory_after_gc() -> tuple[int, int]:
        """(heap live after a full GC, resident set) of the JVM.

        The heap is what each heap pool held right after the last collection (the pools'
        collection usage), not the heap in use when read: the query keeps running and
        maintenance keeps writing snapshots, so what they allocated since the GC would
        count as held. The resident set is the whole process: RocksDB's memtables and
        caches, the heap pages the JVM keeps, everything else."""
        for _ in range(3):
            jvm.java.lang.System.gc()
            time.sleep(0.2)
        pools = jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
        heap_type = jvm.java.lang.management.MemoryType.HEAP
        live = sum(
            pool.getCollectionUsage().getUsed()
            for pool in pools
            if pool.getType() == heap_type and pool.getCollectionUsage() is not None
        )
        status = Path(f"/proc/{jvm_pid}/status").read_text()
        rss = (
            int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            * 1024
        )
        return live, rss

    inputs = work / "in"
    stream = work / f"stream-{args.provider}"
    stream.mkdir(exist_ok=True)
    files = input_files(inputs)
    build_and_updates = len(files) - 1
    # The query sees the files copied so far: exactly the micro-batches of this phase.
    upto = build_and_updates if args.phase == "load" else len(files)
    for path in files[:upto]:
        target = stream / path.name
        if not target.exists():
            shutil.copy2(path, target)

    def aggregate(source: Path, checkpoint: Path) -> StreamingQuery:
        return (
            spark.readStream.schema("k string, v long")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    def finish(query: StreamingQuery) -> None:
        query.processAllAvailable()
        if query.exception() is not None:
            raise SystemExit(f"{args.provider} {args.phase} query failed: {query.exception()}")

    if args.phase == "recover":
        # Warm the new JVM up (class loading, code generation) on a query of its own, so that
        # the restarted query's first micro-batch measures loading the state.
        warm = work / f"warm-{args.provider}"
        warm.mkdir()
        shutil.copy2(files[-1], warm / files[-1].name)
        warm_up = aggregate(warm, work / f"checkpoint-warm-{args.provider}")
        finish(warm_up)
        warm_up.stop()

    heap_before, rss_before = memory_after_gc()
    query = aggregate(stream, work / f"checkpoint-{args.provider}")
    finish(query)
    # Measured while the query runs: its state stores are loaded (they unload once it stops).
    heap_after, rss_after = memory_after_gc()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    if args.phase == "load":
        time.sleep(float(MAINTENANCE_INTERVAL.rstrip("s")) + 2)  # let maintenance snapshot once
    query.stop()
    state = progress[-1]["stateOperators"][0]
    result = {
        "durations_ms": [p["durationMs"]["triggerExecution"] for p in progress],
        "commit_ms": [p["stateOperators"][0]["commitTimeMs"] for p in progress],
        "state_keys": state["numRowsTotal"],
        "state_memory_bytes": state["memoryUsedBytes"],
        "heap_delta_bytes": heap_after - heap_before,
        "rss_delta_bytes": rss_after - rss_before,
        "custom": state.get("customMetrics", {}),
    }
    spark.stop()
    return result


def phase(args: argparse.Namespace, provider: str, name: str) -> dict:
    """Runs a phase in a child process (its own JVM) and returns its measurements."""
    out = Path(args.work) / f"result-{provider}-{name}.json"
    cmd = [
        sys.executable,
        __file__,
        "--phase",
        name,
        "--provider",
        provider,
        "--work",
        args.work,
        "--partitions",
        str(args.partitions),
        "--result",
        str(out),
    ]
    if args.address:  # none: only the RocksDB provider runs (bench/archive_bench.py)
        cmd += ["--address", args.address]
    if args.rocksdb_changelog:
        cmd.append("--rocksdb-changelog")
    started = time.monotonic()
    subprocess.run(cmd, check=True)
    result = json.loads(out.read_text())
    result["process_s"] = time.monotonic() - started
    return result


def load_and_recover(args: argparse.Namespace, provider: str) -> dict[str, dict]:
    """The load phase, then the recover phase, of `provider`: each in a JVM of its own,
    over the inputs in `args.work` (`write_inputs`). `args` holds `work`, `address` (None
    for RocksDB alone), `partitions` and `rocksdb_changelog`."""
    results = {}
    for name in ("load", "recover"):
        print(f"{provider}: {name} ...", flush=True)
        results[name] = phase(args, provider, name)
    return results


# ------------------------------------------------------------------ the cluster


def free_base_port(count: int) -> int:
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65535 and all(_port_free(base + i) for i in range(count)):
            return base
    raise SystemExit("no run of free ports for the cluster")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def start_cluster(
    data_dir: Path,
    fsync: bool,
    *,
    shards: int = 4,
    base: int | None = None,
    extra: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """`quorumstore cluster` of 3 nodes on `base` (default: free ports) with `extra` flags,
    its output in `cluster.log` beside `data_dir`; returns once it prints its client
    address (every replica serves), with the process and the nodes' addresses."""
    if base is None:
        base = free_base_port(7)  # 3 nodes, the coordinator, 3 internal ports
    argv = [
        sys.executable,
        "-m",
        "quorumstore.cli",
        "cluster",
        "--nodes",
        "3",
        "--replication-factor",
        "3",
        "--shards",
        str(shards),
        "--data-dir",
        str(data_dir),
        "--base-port",
        str(base),
    ]
    if not fsync:
        argv.append("--no-fsync")
    argv += extra
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    with open(data_dir.parent / "cluster.log", "wb") as log:  # the child keeps its own handle
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"quorumstore cluster exited: see {data_dir.parent / 'cluster.log'}")
        if b"client address" in (data_dir.parent / "cluster.log").read_bytes():
            return process, ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        time.sleep(0.1)
    process.terminate()
    raise SystemExit("quorumstore cluster did not come up within 90 s")


# ------------------------------------------------------------------ report


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def report(args: argparse.Namespace, results: dict[str, dict[str, dict]]) -> None:
    def median_of_updates(field: str) -> dict[str, float]:
        return {p: statistics.median(r["load"][field][-args.batches :]) for p, r in results.items()}

    recovery = {p: r["recover"]["durations_ms"][0] for p, r in results.items()}
    memory = {p: r["load"]["state_memory_bytes"] for p, r in results.items()}
    heap = {p: r["load"]["heap_delta_bytes"] for p, r in results.items()}
    held = {p: r["load"]["rss_delta_bytes"] for p, r in results.items()}
    keys = {p: r["load"]["state_keys"] for p, r in results.items()}
    print()
    print(
        f"state-store bench: {args.keys:,} keys, {args.batches} update batches of "
        f"{args.rows:,} rows, {args.partitions} partitions, local[2]; quorumstore: {args.cluster}"
        f"; rocksdb changelog checkpointing {'on' if args.rocksdb_changelog else 'off'}"
    )
    print(f"{'':48}{'rocksdb':>14}{'quorumstore':>14}{'ratio q/r':>11}")

    def line(name: str, values: dict, fmt: Callable[[float], str], ratio: bool = True) -> None:
        r, q = values["rocksdb"], values["quorumstore"]
        rat = f"{q / r:.2f}" if ratio and r else "-"
        print(f"{name:48}{fmt(r):>14}{fmt(q):>14}{rat:>11}")

    def ms(v: float) -> str:
        return f"{v:,.0f}"

    line("state keys", keys, lambda v: f"{v:,}", ratio=False)
    line("median micro-batch (ms)", median_of_updates("durations_ms"), ms)
    line("  of which state commit (ms, sum of partitions)", median_of_updates("commit_ms"), ms)
    line("recovery: first batch after restart (ms)", recovery, ms)
    line("state memory, provider-reported", memory, mib)
    line("JVM heap live after GC, query running, minus before", heap, mib)
    line("executor memory held: resident set, minus before", held, mib)
    q = results["quorumstore"]["recover"]["custom"]
    print(
        f"quorumstore recovery: {q.get('quorumstoreStoreLoads', 0)} partitions loaded from the "
        f"cluster in {q.get('quorumstoreLoadTimeMs', 0):,} ms (summed over partitions)"
    )
    print(
        "rocksdb keeps its state off the JVM heap (native memory and local files): its "
        "provider-reported memory is RocksDB's own usage; quorumstore's is an estimate of its "
        "on-heap maps."
    )


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--build-batches", type=int, default=4)
    parser.add_argument("--batches", type=int, default=10, help="update micro-batches measured")
    parser.add_argument("--rows", type=int, default=20_000, help="rows per update micro-batch")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--address", help="a running quorumstore cluster (host:port[,...])")
    parser.add_argument(
        "--no-fsync", action="store_true", help="start the cluster without WAL fsync"
    )
    parser.add_argument(
        "--rocksdb-changelog",
        action="store_true",
        help="RocksDB with changelog checkpointing (Spark's default: off)",
    )
    parser.add_argument("--phase", choices=["load", "recover"], help=argparse.SUPPRESS)
    parser.add_argument("--provider", choices=list(PROVIDERS), help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.phase:
        Path(args.result).write_text(json.dumps(run_phase(args)))
        return 0

    with tempfile.TemporaryDirectory(prefix="state-store-bench-") as tmp:
        args.work = tmp
        cluster = None
        if args.address:
            args.cluster = f"running cluster at {args.address}"
        else:
            (Path(tmp) / "cluster").mkdir()
            cluster, args.address = start_cluster(
                Path(tmp) / "cluster" / "data", fsync=not args.no_fsync
            )
            args.cluster = (
                f"3 nodes, replication factor 3, fsync {'off' if args.no_fsync else 'on'}"
            )
        try:
            print(
                f"writing input: {args.keys:,} keys in {args.build_batches} files, then "
                f"{args.batches + 1} files of {args.rows:,} updates",
                flush=True,
            )
            write_inputs(Path(tmp) / "in", args.keys, args.build_batches, args.batches, args.rows)
            results = {provider: load_and_recover(args, provider) for provider in PROVIDERS}
            report(args, results)
        finally:
            if cluster is not None:
                cluster.terminate()
                cluster.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
