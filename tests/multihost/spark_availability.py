"""The Spark client kinds of availability.py: the JVM state-store provider, the DataFrame
sink and source, and the change feed, each in a Spark session (local mode, in the root
namespace like the other clients) against the cluster on the hosts.

Their work comes in spans (a job, a micro-batch), so a second's throughput is the rows
of the spans it overlaps, each span's rows spread evenly over its time, and a fault's
recovery is the time from the fault until the first span started after it ended, less
a fault-free span's median length: how much longer than usual the work started after
the fault took to come back.

- **state-store**: a rate source (200 rows/s) counted by 20 keys with quorumstore's
  provider, micro-batches back to back; checked: the counts sum to the rows read.
- **dataframe**: three loops at once of a 50-row append to new keys and a read of them
  back (the throughput), and a probe: the same job started as each fault takes effect,
  and run again until it succeeds, in a scheduler pool of its own that takes the next
  free task slots (the recovery; in the fault-free phase it runs as often, so its
  usual length is measured under the same load). Jobs last seconds, so a
  recovery read from the loops' jobs would also count the wait until a loop is free to
  start one, which no fault caused. Checked: every read returned all of its job's rows,
  and a final read holds every acknowledged job's rows.
- **change-feed**: quorumstore's client puts 100 keys/s while a streaming query reads the
  change feed; checked: every acknowledged put is in the feed.
"""

from __future__ import annotations

import contextlib
import datetime
import queue
import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from availability import Fault, Phases, RunResult, Span, run_phases, spans_phase
from netns import Hosts

from cluster_harness import LocalCluster
from quorumstore import Client

SPARK_KINDS = ("state-store", "dataframe", "change-feed")
RATE_ROWS_PER_S = 200
STATE_KEYS = 20
DATAFRAME_ROWS = 50
#: Job loops of the dataframe kind, running at once.
DATAFRAME_LOOPS = 3
#: Seconds between the dataframe kind's probe jobs in the fault-free phase: about as
#: often as the nemesis's faults (1-3 s apart, each held 3-6 s).
PROBE_GAP_S = (4.0, 9.0)
#: The dataframe probe's scheduler pool: its tasks take the executors' next free slots,
#: so its length varies with the cluster's answers, not with the loops' queued tasks.
PROBE_POOL = "probe"
PROBE_POOL_XML = f"""<?xml version="1.0"?>
<allocations>
  <pool name="{PROBE_POOL}"><schedulingMode>FIFO</schedulingMode><weight>100</weight><minShare>2</minShare></pool>
</allocations>
"""
FEED_PUTS_PER_S = 100
#: How long a streaming query may take to catch up once the faults end.
DRAIN_TIMEOUT_S = 120.0


def spark_session(address: str, local_dir: Path) -> Any:
    """A local Spark session with quorumstore's provider and data source on `address`."""
    from pyspark.sql import SparkSession

    from quorumstore.spark.datasource import register
    from quorumstore.spark.state_store import spark_confs

    local_dir.mkdir(parents=True, exist_ok=True)
    pools = local_dir / "scheduler-pools.xml"
    pools.write_text(PROBE_POOL_XML)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("quorumstore availability")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.scheduler.allocation.file", str(pools))
    )
    for key, value in spark_confs(address, local_dir=str(local_dir)).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark, address=address)
    return spark


def _monotonic(iso: str, offset: float) -> float:
    """A progress report's UTC timestamp on the monotonic clock (`offset`: wall - mono)."""
    at = datetime.datetime.fromisoformat(iso)  # Python 3.11 reads the trailing Z
    return at.timestamp() - offset


def _batches(query: Any, offset: float) -> list[Span]:
    """The query's micro-batches that read rows, as spans of rows."""
    seen: dict[int, Span] = {}
    for progress in query.recentProgress:
        rows = progress.numInputRows
        duration_s = progress.batchDuration / 1000
        start = _monotonic(progress.timestamp, offset)
        if rows:
            seen[progress.batchId] = Span(start, start + duration_s, float(rows))
    return [seen[b] for b in sorted(seen)]


def recovery_after(fault: Fault, spans: list[Span], usual_s: float) -> float:
    """Seconds from the fault until the first span started after it ended, less a usual
    span's length (inf if none did)."""
    first = min((s.end for s in spans if s.start >= fault.start), default=float("inf"))
    return max(first - fault.start - usual_s, 0.0)


def _usual_s(spans: list[Span], phases: Phases) -> tuple[float, float]:
    """The median and 90th percentile length of the fault-free phase's spans."""
    fault_free = [
        s.end - s.start
        for s in spans
        if phases.fault_free_start <= s.start and s.end <= phases.faulty_start
    ]
    usual_s = statistics.median(fault_free) if fault_free else 0.0
    p90_s = statistics.quantiles(fault_free, n=10)[8] if len(fault_free) >= 2 else usual_s
    return usual_s, p90_s


def _result(
    kind: str,
    spans: list[Span],
    phases: Phases,
    correct: bool,
    report: str,
    probes: list[Span] | None = None,
) -> RunResult:
    """The run's result; recoveries are read from `probes` (spans started as each fault
    took effect) where given, else from `spans`."""
    usual_s, p90_s = _usual_s(spans, phases)
    # How much a fault-free span varies: a recovery is read against it.
    lengths = f"usual span {usual_s:.2f} s (fault-free 90th percentile {p90_s:.2f} s)"
    timed, timed_usual_s = spans, usual_s
    if probes is not None:
        probe_usual_s, probe_p90_s = _usual_s(probes, phases)
        lengths += f", usual probe {probe_usual_s:.2f} s (90th percentile {probe_p90_s:.2f} s)"
        # Without a fault-free probe (a short run), a job's usual length stands in.
        timed, timed_usual_s = probes, probe_usual_s or usual_s
    return RunResult(
        kind,
        spans_phase(spans, phases.fault_free_start, phases.seconds),
        spans_phase(spans, phases.faulty_start, phases.seconds),
        phases.faults,
        [recovery_after(f, timed, timed_usual_s) for f in phases.faults],
        correct,
        f"{lengths}; {report}",
        unit="rows/s",
    )


def _state_store(
    spark: Any, run: Callable[..., Phases], checkpoint: Path, offset: float
) -> RunResult:
    from pyspark.sql import functions as F

    counts = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", RATE_ROWS_PER_S)
        .load()
        .groupBy((F.col("value") % STATE_KEYS).alias("k"))
        .count()
    )
    query = (
        counts.writeStream.outputMode("complete")
        .format("memory")
        .queryName("availability_counts")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        phases = run()
    finally:
        query.stop()
    spans = _batches(query, offset)
    read = int(sum(s.amount for s in spans))
    counted = spark.sql("SELECT COALESCE(SUM(count), 0) AS n FROM availability_counts").first()[0]
    report = f"{len(spans)} micro-batches; the counts sum to {counted} of {read} rows read"
    # The stop may end a micro-batch after its output reached the sink and before its
    # progress was reported: then the counts hold every row it planned to read too.
    planned = _rate_rows_planned(checkpoint)
    if counted != read and counted == planned:
        report += f" and {planned - read} of the micro-batch the stop ended"
    return _result("state-store", spans, phases, counted in (read, planned), report)


def _rate_rows_planned(checkpoint: Path) -> int:
    """The rows the rate source produced up to the last micro-batch the query planned
    (its offset is the seconds since the start, the last line of the offsets log)."""
    logged = [f for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()]
    last = max(logged, key=lambda f: int(f.name))
    return int(last.read_text().splitlines()[-1]) * RATE_ROWS_PER_S


def _dataframe(spark: Any, run: Callable[..., Phases]) -> RunResult:
    """`DATAFRAME_LOOPS` job loops and the probe (module docstring), each on a thread of
    its own, the phases on this one."""
    from pyspark.sql import functions as F

    spans: list[Span] = []
    probes: list[Span] = []
    failures: list[str] = []
    timings: list[tuple[float, str, float]] = []  # (job's seconds, job, its write's seconds)
    lock = threading.Lock()
    warmed = threading.Barrier(DATAFRAME_LOOPS + 2)
    stop = threading.Event()
    faults: queue.SimpleQueue[None] = queue.SimpleQueue()

    def job(prefix: str) -> tuple[float, float, int]:
        started = time.monotonic()
        rows = spark.range(DATAFRAME_ROWS).select(
            F.format_string(f"{prefix}%03d", "id").alias("key"),
            F.col("id").cast("string").cast("binary").alias("value"),
        )
        rows.write.format("quorumstore").mode("append").save()
        written = time.monotonic()
        read = spark.read.format("quorumstore").option("keyPrefix", prefix).load().count()
        return started, written, read

    def checked_job(name: str) -> bool:
        """Runs job `name`; whether it succeeded (its failure is reported)."""
        try:
            started, written, read = job(f"/df/{name}/")
        except Exception as e:  # noqa: BLE001 - a failed job is an outcome to report
            # The end of a data source error's text holds its Python exception.
            with lock:
                failures.append(f"job {name}: {type(e).__name__}: ...{str(e)[-400:]}")
            return False
        ended = time.monotonic()
        with lock:
            if read != DATAFRAME_ROWS:
                failures.append(f"job {name}: read {read} of {DATAFRAME_ROWS} rows back")
            timings.append((ended - started, name, written - started))
        return True

    def warm_up(name: str) -> None:
        # A thread's writes find the Python data source only in its active session.
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
        job(f"/df/{name}/warm-up/")  # starts the Python workers; not measured
        warmed.wait()

    def loop(index: int) -> None:
        warm_up(str(index))
        n = 0
        while not stop.is_set():
            started = time.monotonic()
            if checked_job(f"{index}/{n:07d}"):
                with lock:
                    spans.append(Span(started, time.monotonic(), float(DATAFRAME_ROWS)))
            n += 1

    def probe() -> None:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", PROBE_POOL)
        warm_up("probe")
        rnd = random.Random(0)
        faulty = False
        n = 0
        while not stop.is_set():
            try:
                faults.get(timeout=rnd.uniform(*PROBE_GAP_S))
                faulty = True
            except queue.Empty:
                if faulty:  # in the faulty phase it starts only at faults
                    continue
            if stop.is_set():  # woken by the end of the run, not by a fault
                return
            started = time.monotonic()
            while not checked_job(f"probe/{n:07d}"):
                n += 1  # the application's retry, at once
                if stop.is_set():
                    return
            with lock:
                probes.append(Span(started, time.monotonic(), float(DATAFRAME_ROWS)))
            n += 1

    threads = [
        threading.Thread(target=loop, args=(i,), name=f"dataframe-{i}", daemon=True)
        for i in range(DATAFRAME_LOOPS)
    ]
    threads.append(threading.Thread(target=probe, name="dataframe-probe", daemon=True))
    for thread in threads:
        thread.start()
    warmed.wait(timeout=300)
    try:
        phases = run(lambda: faults.put(None))
    finally:
        stop.set()
        faults.put(None)  # wakes the probe
        for thread in threads:
            thread.join()
    stored = spark.read.format("quorumstore").option("keyPrefix", "/df/").load().count()
    # Every job that returned, with the warm-ups.
    acknowledged = (len(timings) + len(threads)) * DATAFRAME_ROWS
    correct = not any("read" in f for f in failures) and stored >= acknowledged
    report = (
        f"{DATAFRAME_LOOPS} loops and a probe; {len(timings)} jobs of {DATAFRAME_ROWS} rows "
        f"acknowledged and read back ({len(probes)} probes), {len(failures)} failed"
        f"{': ' + failures[0] if failures else ''}; {stored} rows stored (every "
        f"acknowledged one: {stored >= acknowledged})"
    )
    if timings:
        total, name, write = max(timings)
        report += f"; slowest job {name}: {total:.2f} s, its write {write:.2f} s"
    return _result("dataframe", spans, phases, correct, report, probes)


def _change_feed(
    spark: Any, cluster: LocalCluster, run: Callable[..., Phases], checkpoint: Path, offset: float
) -> RunResult:
    changes = (
        spark.readStream.format("quorumstore")
        .option("startingOffsets", "latest")
        .option("keyPrefix", "/feed/")
        .load()
    )
    query = (
        changes.select("key")
        .writeStream.format("memory")
        .queryName("availability_feed")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )
    acknowledged: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        with Client(",".join(cluster.nodes)) as client:
            n = 0
            while not stop.wait(1 / FEED_PUTS_PER_S):
                key = f"/feed/{n:08d}"
                with contextlib.suppress(Exception):  # unacknowledged: not expected in the feed
                    client.put(key, b"x")
                    acknowledged.append(key)
                n += 1

    try:
        while not query.recentProgress:  # started from the latest offsets before any put
            time.sleep(0.1)
        putter = threading.Thread(target=writer, daemon=True)
        putter.start()
        try:
            phases = run()
        finally:
            stop.set()
            putter.join(60)
        query.processAllAvailable()
    finally:
        query.stop()
    spans = _batches(query, offset)
    fed = {row.key for row in spark.sql("SELECT key FROM availability_feed").collect()}
    missing = [k for k in acknowledged if k not in fed]
    report = f"{len(acknowledged)} puts acknowledged, {len(missing)} missing from the feed" + (
        f" (first {missing[0]})" if missing else ""
    )
    return _result("change-feed", spans, phases, not missing, report)


def measure_spark(
    spark: Any,
    hosts: Hosts,
    cluster: LocalCluster,
    kind: str,
    seconds: float,
    seed: int,
    root: Path,
) -> RunResult:
    """`kind`'s fault-free and faulty phases, as availability.measure does for clients."""
    offset = time.time() - time.monotonic()

    def run(on_fault: Callable[[], None] = lambda: None) -> Phases:
        time.sleep(2.0)  # the first jobs or micro-batches, which start Python workers, done
        return run_phases(hosts, cluster, seconds, seed, on_fault)

    if kind == "state-store":
        return _state_store(spark, run, root / "state-checkpoint", offset)
    if kind == "dataframe":
        return _dataframe(spark, run)
    if kind == "change-feed":
        return _change_feed(spark, cluster, run, root / "feed-checkpoint", offset)
    raise ValueError(f"unknown Spark client kind {kind!r}; known: {', '.join(SPARK_KINDS)}")
