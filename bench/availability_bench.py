"""Availability under one faulty node, per client kind: how much of the time clients keep
going while a node is paused, isolated or cut off, and how fast every shard answers again.

Runs as root (hosts are network namespaces; tests/multihost/ builds them). For each
client kind in ``--kinds``, a fresh cluster (3 nodes on 3 hosts, 3 shards, replication
factor 3, the coordinator on a fourth host) and six workers of that kind doing put, get
and version-conditional put on 40 keys: ``--seconds`` without faults (the reference
median of ok operations per second), then ``--seconds`` under a seeded nemesis that
every 1-3 s pauses a shard leader, isolates a node's host, or cuts a leader off from the
coordinator and the other nodes (clients still reach it), each for 3-6 s (none is
started that could not be held in full before the phase ends). Prints, per
kind, the seconds under 20% of the fault-free median, each fault's recovery (until
every shard answered an operation invoked after the fault), and whether the recorded
history is linearizable. The criterion: at least 80% of the seconds at or above 20%,
every recovery within 1 s plus the failure timeout (0.5 s).

The Spark kinds (state-store: quorumstore's provider in a streaming aggregation;
dataframe: DataFrame appends and reads back in three loops; change-feed: a streaming
read of the change feed while our client puts) measure rows per second, each job's or
micro-batch's rows spread over its time, and a fault's recovery as the delay of the
first micro-batch started after it beyond a fault-free one's median length; for the
dataframe kind, of a probe job started as the fault takes effect beyond a probe's
fault-free median (tests/multihost/spark_availability.py). They share one cluster and
one Spark session.

Usage: python bench/availability_bench.py [--seconds 60] [--seed 1] [--kinds K,...]
  kinds: official-gateway, ours-sync, ours-async, state-store, dataframe, change-feed
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "multihost")]

from availability import CLIENT_KINDS, RunResult, measure, running_cluster
from netns import Hosts
from spark_availability import SPARK_KINDS, measure_spark, spark_session


def report(result: RunResult) -> bool:
    print(result.report(), flush=True)
    rates = ", ".join(f"{n:.0f}" for n in result.faulty.per_second)
    print(f"  {result.unit} in each second under faults: {rates}", flush=True)
    return result.holds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase")
    parser.add_argument("--seed", type=int, default=1, help="the nemesis's seed")
    every = [*CLIENT_KINDS, *SPARK_KINDS]
    parser.add_argument("--kinds", default=",".join(every), help="client kinds to run")
    parser.add_argument("--dir", help="where clusters keep their data and logs")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(every))
    if unknown:
        parser.error(f"unknown client kind(s) {', '.join(unknown)}; known: {', '.join(every)}")
    base = Path(args.dir or tempfile.mkdtemp(prefix="qs-availability-"))
    held = True
    with Hosts(4) as hosts:
        for kind in [k for k in kinds if k in CLIENT_KINDS]:
            with running_cluster(hosts, base / kind) as cluster:
                held &= report(measure(hosts, cluster, kind, args.seconds, args.seed))
        spark_kinds = [k for k in kinds if k in SPARK_KINDS]
        if spark_kinds:  # one cluster and one session: a JVM loads the provider jar once
            with running_cluster(hosts, base / "spark") as cluster:
                spark = spark_session(",".join(cluster.nodes), base / "spark-local")
                for kind in spark_kinds:
                    result = measure_spark(
                        spark, hosts, cluster, kind, args.seconds, args.seed, base / kind
                    )
                    held &= report(result)
                spark.stop()
    print(f"criterion {'met' if held else 'NOT met'} by every kind run (seed {args.seed})")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
