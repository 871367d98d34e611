"""Availability under one faulty node, as each kind of client sees it.

Three nodes on three hosts and the coordinator on a fourth (network namespaces); the
clients run in the root namespace, which reaches every host. Six workers of one client
kind do put, get and version-conditional put on 40 keys, recorded for the
linearizability checker. A run is a fault-free phase, whose median of ok operations
per second is the reference, then a phase under a seeded nemesis that every 1-3 s
gives one node a fault for 3-6 s:

- **pause**: a shard leader's process is stopped (SIGSTOP) and continued;
- **isolate**: a node's host is cut off from the network, clients included;
- **cut off**: a shard leader's host is cut off from the coordinator and the other
  nodes while clients still reach it.

What is measured: the share of the faulty phase's seconds in which the ok operations
stay at or above 20% of the fault-free median, and each fault's recovery: the time
from the fault until every shard has answered an operation invoked after it.
`bench/availability_bench.py` prints it for every client kind;
`test_availability.py` holds a short run to the same bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from netns import Host, Hosts

from campaign import agreed_keys
from cluster_harness import LocalCluster, close_in_background
from quorumstore import AsyncClient, Client
from quorumstore.testing import official_oxia_client
from quorumstore.verification import linearizability
from quorumstore.verification.history import (
    KEY_NOT_FOUND,
    MUST_NOT_EXIST,
    UNEXPECTED_VERSION_ID,
    Completion,
    Invocation,
    Status,
    operations,
)
from quorumstore.verification.recorder import (
    OfficialClient,
    OurAsyncClient,
    OurClient,
    Recorder,
)

KEYS = 40
WORKERS = 6
SHARDS = 3
#: The coordinator's default failure timeout, which the recovery bound adds to.
FAILURE_TIMEOUT_S = 0.5
#: A fault's recovery may take this long beyond the failure timeout.
RECOVERY_SLACK_S = 1.0
#: The faulty phase must stay at or above this share of the fault-free median ...
THROUGHPUT_FLOOR = 0.2
#: ... in at least this share of its seconds.
SECONDS_ABOVE_FLOOR = 0.8
#: How long a worker waits after an answer that was not one (the application's retry).
RETRY_PAUSE_S = 0.02
MAX_STATES = 500_000
FAULT_KINDS = ("pause", "isolate", "cut off")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    node: str
    start: float
    end: float


class RecordingClient(Protocol):
    def put(self, key: str, value: str, expected_version_id: int | None = None) -> Completion: ...

    def get(self, key: str) -> Completion: ...


def keys_of_both_clients(cluster: LocalCluster) -> dict[str, int]:
    """KEYS keys, spread over the shards, that quorumstore's client and the official one
    route to the same shard (`campaign.agreed_keys`): key -> shard."""
    official = official_oxia_client(cluster.nodes[0])
    try:
        with Client(",".join(cluster.nodes)) as ours:
            per_shard = -(-KEYS // cluster.shards)
            chosen = agreed_keys(ours, official, cluster.shards, per_shard, "/avail/")
    finally:
        close_in_background(official)
    return dict(list(chosen.items())[:KEYS])


class _Choices:
    """A worker's next operation: 40% get, 30% put, 30% put conditional on the version
    it saw last."""

    def __init__(self, keys: list[str], rnd: random.Random, name: str) -> None:
        self.keys, self.rnd, self.name = keys, rnd, name
        self.seen: dict[str, int] = {}
        self.count = itertools.count()

    def next(self) -> tuple[str, str, str, int | None]:
        key, roll, n = self.rnd.choice(self.keys), self.rnd.random(), next(self.count)
        if roll < 0.4:
            return "get", key, "", None
        expected = self.seen.get(key, MUST_NOT_EXIST) if roll >= 0.7 else None
        return "put", key, f"{self.name}:{n}", expected

    def learn(self, key: str, done: Completion) -> bool:
        """Keeps the version the answer showed; False when it was no answer (retry later)."""
        if done.status == Status.OK:
            version = done.record.version if done.record is not None else done.version
            if version is not None:
                self.seen[key] = version.version_id
            return True
        if done.error == KEY_NOT_FOUND:
            self.seen[key] = MUST_NOT_EXIST
        return done.error in (KEY_NOT_FOUND, UNEXPECTED_VERSION_ID)


def _thread_worker(client: RecordingClient, choices: _Choices, stop: threading.Event) -> None:
    while not stop.is_set():
        op, key, value, expected = choices.next()
        done = client.get(key) if op == "get" else client.put(key, value, expected)
        if not choices.learn(key, done):
            stop.wait(RETRY_PAUSE_S)


class ClientKind(Protocol):
    """Starts WORKERS recorded workers on the cluster; the returned function stops them
    (waiting for their last operations) and closes their clients."""

    def __call__(
        self, cluster: LocalCluster, keys: list[str], recorder: Recorder, seed: int
    ) -> Callable[[], None]: ...


def _threads(
    clients: list[RecordingClient], keys: list[str], seed: int, close: Callable[[], None]
) -> Callable[[], None]:
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_thread_worker,
            args=(c, _Choices(keys, random.Random(seed * 100 + i), f"w{i}"), stop),
            daemon=True,
        )
        for i, c in enumerate(clients)
    ]
    for thread in threads:
        thread.start()

    def stopped() -> None:
        stop.set()
        for thread in threads:
            thread.join(60)
        close()

    return stopped


def official_gateway(
    cluster: LocalCluster, keys: list[str], recorder: Recorder, seed: int
) -> Callable[[], None]:
    """The official `oxia` client, each worker's own, talking to one node (in turn) as its
    service address: gateway mode, its node relays."""
    clients = [official_oxia_client(cluster.nodes[i % len(cluster.nodes)]) for i in range(WORKERS)]

    def close() -> None:
        for client in clients:
            close_in_background(client)

    recording: list[RecordingClient] = [
        OfficialClient(recorder, i + 1, c) for i, c in enumerate(clients)
    ]
    return _threads(recording, keys, seed, close)


def ours_sync(
    cluster: LocalCluster, keys: list[str], recorder: Recorder, seed: int
) -> Callable[[], None]:
    """quorumstore's blocking `Client`, shared by the worker threads."""
    client = Client(",".join(cluster.nodes))
    recording: list[RecordingClient] = [OurClient(recorder, i + 1, client) for i in range(WORKERS)]
    return _threads(recording, keys, seed, client.close)


def ours_async(
    cluster: LocalCluster, keys: list[str], recorder: Recorder, seed: int
) -> Callable[[], None]:
    """quorumstore's `AsyncClient`, shared by WORKERS tasks on one event loop."""
    stop = threading.Event()
    started = threading.Event()
    failure: list[BaseException] = []

    async def worker(client: OurAsyncClient, choices: _Choices) -> None:
        while not stop.is_set():
            op, key, value, expected = choices.next()
            done = await (client.get(key) if op == "get" else client.put(key, value, expected))
            if not choices.learn(key, done):
                await asyncio.sleep(RETRY_PAUSE_S)

    async def main() -> None:
        async with AsyncClient(",".join(cluster.nodes)) as client:
            started.set()
            await asyncio.gather(
                *(
                    worker(
                        OurAsyncClient(recorder, i + 1, client),
                        _Choices(keys, random.Random(seed * 100 + i), f"w{i}"),
                    )
                    for i in range(WORKERS)
                )
            )

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - reported by stopped()
            failure.append(e)
            started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(60)

    def stopped() -> None:
        stop.set()
        thread.join(60)
        if failure:
            raise failure[0]

    return stopped


CLIENT_KINDS: dict[str, ClientKind] = {
    "official-gateway": official_gateway,
    "ours-sync": ours_sync,
    "ours-async": ours_async,
}


def node_fault_nemesis(
    hosts: Hosts,
    cluster: LocalCluster,
    seed: int,
    stop: threading.Event,
    faults: list[Fault],
    until: float,
    on_fault: Callable[[], None] = lambda: None,
) -> None:
    """Every 1-3 s, one fault of FAULT_KINDS on one node for 3-6 s; appends each to
    `faults` once healed and calls `on_fault` as each takes effect. Nodes are on
    hosts[0..2], the coordinator on hosts[3]. A fault that could not be held in full
    before `until` (the phase's end, on the monotonic clock) is not started: cut short
    at the end, it left no time to see a recovery."""
    rnd = random.Random(seed)
    everyone = list(hosts)
    host_of: dict[str, Host] = dict(zip(cluster.nodes, everyone, strict=False))
    while not stop.wait(rnd.uniform(1.0, 3.0)):
        kind, hold_s = rnd.choice(FAULT_KINDS), rnd.uniform(3.0, 6.0)
        if time.monotonic() + hold_s > until:
            break
        shard = rnd.randrange(cluster.shards)
        node = cluster.leader_of(shard) if kind != "isolate" else rnd.choice(cluster.nodes)
        if node is None:
            continue
        if kind == "pause":
            cluster.pause(node)
        elif kind == "isolate":
            hosts.isolate(host_of[node])
        else:
            hosts.partition([[host_of[node]], [h for h in everyone if h is not host_of[node]]])
        start = time.monotonic()  # once in effect: a partition takes several iptables calls
        on_fault()
        try:
            stop.wait(hold_s)  # a stop ends the fault early, so the run ends healed
        finally:
            if kind == "pause":
                cluster.resume(node)
            elif kind == "isolate":
                hosts.heal(host_of[node])
            else:
                hosts.heal_partition()
            faults.append(Fault(kind, node, start, time.monotonic()))


@dataclass
class Phase:
    """One phase of a run: its start and length, and the work done in each second (ok
    operations, or rows for the Spark kinds)."""

    start: float
    seconds: float
    per_second: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.per_second)


def points_phase(times: list[float], start: float, seconds: float) -> Phase:
    """A phase counting one unit of work at each of `times` (ok completions)."""
    counts = [0.0] * int(seconds)
    for at in times:
        second = int(at - start)
        if 0 <= second < len(counts):
            counts[second] += 1
    return Phase(start, seconds, counts)


@dataclass(frozen=True, slots=True)
class Span:
    """Work that took a while (a Spark job, a micro-batch): `amount` units done between
    `start` and `end`, counted evenly over that time."""

    start: float
    end: float
    amount: float


def spans_phase(spans: list[Span], start: float, seconds: float) -> Phase:
    """A phase in which each span's work is spread evenly over its seconds: a job that
    waited on a fault lowers the rate of every second it spanned."""
    amounts = [0.0] * int(seconds)
    for span in spans:
        length = max(span.end - span.start, 1e-6)
        first, last = int(span.start - start), int(span.end - start)
        for second in range(max(first, 0), min(last, len(amounts) - 1) + 1):
            lo, hi = max(span.start, start + second), min(span.end, start + second + 1)
            amounts[second] += span.amount * max(hi - lo, 0.0) / length
    return Phase(start, seconds, amounts)


def recovery_s(fault: Fault, answered: dict[int, list[tuple[float, float]]]) -> float:
    """Seconds from the fault until every shard answered an operation invoked after it
    (inf if one never did). `answered`: shard -> (invoked, answered) of ok operations."""
    return max(
        min((done for invoked, done in spans if invoked >= fault.start), default=float("inf"))
        - fault.start
        for spans in answered.values()
    )


@dataclass
class RunResult:
    kind: str
    fault_free: Phase
    faulty: Phase
    faults: list[Fault]
    recoveries: list[float]
    #: What was checked afterwards, and whether it held (the history's linearizability,
    #: or for the Spark kinds their results).
    correct: bool
    check_report: str
    unit: str = "ok ops/s"

    @property
    def floor(self) -> float:
        return THROUGHPUT_FLOOR * self.fault_free.median

    @property
    def seconds_below(self) -> int:
        return sum(n < self.floor for n in self.faulty.per_second)

    @property
    def share_above(self) -> float:
        return 1 - self.seconds_below / len(self.faulty.per_second)

    @property
    def recovery_bound_s(self) -> float:
        return FAILURE_TIMEOUT_S + RECOVERY_SLACK_S

    @property
    def holds(self) -> bool:
        return self.holds_within(0.0)

    def holds_within(self, allowance_s: float) -> bool:
        """Whether the run met the criterion with `allowance_s` more for each recovery."""
        return (
            self.correct
            and self.share_above >= SECONDS_ABOVE_FLOOR
            and all(r <= self.recovery_bound_s + allowance_s for r in self.recoveries)
        )

    def report(self) -> str:
        return "\n".join([self.summary(), *self.fault_lines()])

    def summary(self) -> str:
        recoveries = sorted(self.recoveries)
        slowest = max(
            zip(self.recoveries, self.faults, strict=True), key=lambda p: p[0], default=None
        )
        return (
            f"{self.kind}: fault-free median {self.fault_free.median:.0f} {self.unit}; under "
            f"faults median {self.faulty.median:.0f} {self.unit}, {self.seconds_below} of "
            f"{len(self.faulty.per_second)} s under 20% of the fault-free median "
            f"({self.share_above:.0%} at or above); {len(self.faults)} faults, recovery "
            f"median {statistics.median(recoveries) if recoveries else 0:.2f} s, max "
            f"{recoveries[-1] if recoveries else 0:.2f} s"
            + (f" ({slowest[1].kind} of {slowest[1].node})" if slowest else "")
            + f" (bound {self.recovery_bound_s:.1f} s); {self.check_report}"
        )

    def fault_lines(self) -> Iterator[str]:
        for fault, recovery in zip(self.faults, self.recoveries, strict=True):
            yield (
                f"  {fault.start - self.faulty.start:5.1f} s {fault.kind} {fault.node} for "
                f"{fault.end - fault.start:.1f} s: recovered {recovery:.2f} s later"
            )


@dataclass
class Phases:
    """When a run's two phases started, and the faults of the second."""

    fault_free_start: float
    faulty_start: float
    seconds: float
    faults: list[Fault]


def run_phases(
    hosts: Hosts,
    cluster: LocalCluster,
    seconds: float,
    seed: int,
    on_fault: Callable[[], None] = lambda: None,
) -> Phases:
    """Sleeps through a fault-free phase and then a phase under the nemesis, `seconds`
    each, while the workers (started by the caller) run; ends with every fault healed.
    `on_fault` is called as each fault takes effect."""
    stop_nemesis = threading.Event()
    faults: list[Fault] = []
    nemesis: threading.Thread | None = None
    try:
        fault_free_start = time.monotonic()
        time.sleep(seconds)
        faulty_start = time.monotonic()
        nemesis = threading.Thread(
            target=node_fault_nemesis,
            args=(hosts, cluster, seed, stop_nemesis, faults, faulty_start + seconds, on_fault),
        )
        nemesis.start()
        time.sleep(seconds)
    finally:
        stop_nemesis.set()
        if nemesis is not None:
            nemesis.join()
        hosts.heal_all()
    faults = [f for f in faults if f.start < faulty_start + seconds]
    return Phases(fault_free_start, faulty_start, seconds, faults)


def measure(hosts: Hosts, cluster: LocalCluster, kind: str, seconds: float, seed: int) -> RunResult:
    """A fault-free phase and a faulty phase of `seconds` each, with the `kind` of client,
    on the started `cluster` whose nodes are on `hosts`."""
    shard_of = keys_of_both_clients(cluster)
    recorder = Recorder()
    stop_workers = CLIENT_KINDS[kind](cluster, sorted(shard_of), recorder, seed)
    try:
        time.sleep(1.0)  # connections made and warm
        phases = run_phases(hosts, cluster, seconds, seed)
    finally:
        stop_workers()
    events = recorder.events
    invoked: dict[int, Invocation] = {e.op_id: e for e in events if isinstance(e, Invocation)}
    ok = [e for e in events if isinstance(e, Completion) and e.status == Status.OK]
    answered: dict[int, list[tuple[float, float]]] = {s: [] for s in range(cluster.shards)}
    for c in ok:
        call = invoked[c.op_id]
        answered[shard_of[call.key]].append((call.time, c.time))
    checked = linearizability.check(events, MAX_STATES)
    times = [c.time for c in ok]
    verdict = "linearizable" if checked.linearizable else "NOT LINEARIZABLE"
    return RunResult(
        kind,
        points_phase(times, phases.fault_free_start, seconds),
        points_phase(times, phases.faulty_start, seconds),
        phases.faults,
        [recovery_s(f, answered) for f in phases.faults],
        checked.linearizable,
        f"{len(operations(events))} operations {verdict}"
        + ("" if checked.linearizable else f"\n{checked.report()}"),
    )


@contextlib.contextmanager
def running_cluster(hosts: Hosts, root: Any) -> Iterator[LocalCluster]:
    """A started 3-node cluster (3 shards, replication factor 3) on hosts[0..2], its
    coordinator on hosts[3]; afterwards every fault is healed and every process stopped
    (the hosts' faults printed first if the block raised)."""
    cluster = LocalCluster(root, nodes=3, shards=SHARDS, replication_factor=3, places=list(hosts))
    try:
        cluster.start()
        yield cluster
    except BaseException:
        print(hosts.describe())
        raise
    finally:
        hosts.heal_all()
        cluster.close()
