"""A Jepsen-style campaign, whatever the faults: recorded clients read and write while a
nemesis injects faults, then the history must be linearizable, complete and
exactly-once (docs/verification.md).

Recorded through `quorumstore.verification.recorder`:

- register workers, on quorumstore's `Client` and on the official `oxia` client, run
  get / put / conditional put / delete / range scan on a few keys;
- set workers put unique keys through quorumstore's `Client` (exactly-once serials,
  retries on leader change).

Afterwards a final scan reads everything back and the history is checked. A failing
history is saved as JSONL in QS_NEMESIS_HISTORY_DIR (default: the test's temporary
directory); the path is printed. The seed fixes the nemesis's schedule and the
workers' choices, not the timing.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster_harness import LocalCluster, close_in_background
from quorumstore import Client
from quorumstore.testing import official_oxia_client
from quorumstore.verification import completeness, linearizability
from quorumstore.verification.history import (
    KEY_NOT_FOUND,
    MUST_NOT_EXIST,
    UNEXPECTED_VERSION_ID,
    Record,
    Status,
    operations,
)
from quorumstore.verification.recorder import OfficialClient, OurClient, Recorder

#: A nemesis: injects faults into the cluster until the event is set, drawing from the
#: random source, and appends a line per fault to the log; it leaves everything healed.
Nemesis = Callable[[LocalCluster, random.Random, threading.Event, list[str]], None]

#: Register keys per shard (both clients route them to that shard; see agreed_keys).
REGISTER_KEYS_PER_SHARD = 3
OUR_REGISTER_WORKERS = 3
OFFICIAL_REGISTER_WORKERS = 2
SET_WORKERS = 6
#: How long our client retries an operation across leader changes before giving up.
REQUEST_TIMEOUT_S = 30.0
#: How long a worker may still take to finish its last operation after the faults end.
FINISH_TIMEOUT_S = 60.0
#: Model states the checker may visit per key before calling it inconclusive.
MAX_STATES = 500_000


def agreed_keys(
    ours: Client, official: Any, shards: int, per_shard: int, prefix: str
) -> dict[str, int]:
    """`per_shard` keys of each shard (`prefix` and a number) that both clients route to
    that shard: key -> shard.

    The official client 0.2.1 hashes keys with XXH64 where Oxia's servers and its other
    clients use XXH3 (see quorumstore/client/routing.py): on about half the keys of a
    2-shard cluster it writes and reads another shard than every other client, so the
    two see two registers under one key (the first run of this campaign showed it as
    deletes answering existed=False and two records created under one key). Workloads
    that drive both share only the keys on which they agree.
    """
    found: dict[int, list[str]] = defaultdict(list)
    for i in itertools.count():
        key = f"{prefix}{i}"
        shard = ours.shard_for(key)
        if shard == official._service_discovery.get_shard(key).shard:  # its own routing
            found[shard].append(key)
        if all(len(found[s]) >= per_shard for s in range(shards)):
            return {k: s for s in range(shards) for k in found[s][:per_shard]}
    raise AssertionError("unreachable: itertools.count() does not end")


def _register_worker(
    client: OurClient | OfficialClient, keys: list[str], rnd: random.Random, stop: threading.Event
) -> None:
    """Random operations on the register keys; conditional puts expect the version
    this worker saw last."""
    seen: dict[str, int] = {}
    n = 0
    while not stop.is_set():
        key = rnd.choice(keys)
        roll = rnd.random()
        if roll < 0.3:
            done = client.get(key)
        elif roll < 0.5:
            done = client.put(key, f"{client.process}:{n}")
        elif roll < 0.7:
            done = client.put(key, f"{client.process}:{n}", seen.get(key, MUST_NOT_EXIST))
        elif roll < 0.8:
            done = client.delete(key)
        else:
            done = client.range_scan("/reg/", "/reg/~")
        if done.status == Status.OK:
            version = done.record.version if done.record is not None else done.version
            if version is not None:
                seen[key] = version.version_id
            elif done.existed is not None:
                seen[key] = MUST_NOT_EXIST
        elif done.error == KEY_NOT_FOUND:
            seen[key] = MUST_NOT_EXIST
        elif (
            done.error != UNEXPECTED_VERSION_ID
        ):  # unavailable or refused: back off, as an application would
            stop.wait(rnd.uniform(0.05, 0.3))
        n += 1
        time.sleep(rnd.uniform(0, 0.01))


def _set_worker(client: OurClient, seed: int, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        client.put(f"/set/{client.process:03d}/{n:07d}", f"{seed}:{client.process}:{n}")
        n += 1


def pause_or_kill(
    cluster: LocalCluster, rnd: random.Random, victim: str, at: str, log: list[str]
) -> None:
    """One process fault on `victim` (a node or "coordinator"), logged at time `at`:
    SIGSTOP for 0.2-2.5 s (it wakes up in a world that moved on), or kill -9 and a
    restart 0.2-1.5 s later; returns with the victim running."""
    if rnd.random() < 0.7:
        pause_s = rnd.uniform(0.2, 2.5)
        log.append(f"{at} pause {victim} {pause_s:.1f} s")
        cluster.pause(victim)
        try:
            time.sleep(pause_s)
        finally:
            cluster.resume(victim)
    elif victim == "coordinator":
        log.append(f"{at} kill -9 coordinator")
        cluster.kill9_coordinator()
        time.sleep(rnd.uniform(0.2, 1.5))
        cluster.restart_coordinator()
    else:
        log.append(f"{at} kill -9 {victim}")
        cluster.kill9(victim)
        time.sleep(rnd.uniform(0.2, 1.5))
        cluster.restart(victim)


def _final_state(address: str, recorder: Recorder) -> dict[str, Record]:
    """Every record, with its version, read (and recorded) once the faults have ended."""
    with Client(address, request_timeout_s=REQUEST_TIMEOUT_S) as client:
        done = OurClient(recorder, 0, client).range_scan("", "")
    assert done.status == Status.OK and done.records is not None, f"final scan: {done}"
    return {r.key: r for r in done.records}


def run_campaign(
    cluster: LocalCluster, nemesis: Nemesis, seed: int, seconds: float, history_dir: Path
) -> str:
    """Runs the workload against the started `cluster` for `seconds` under `nemesis`;
    raises AssertionError with the summary if the history is not linearizable and
    complete; returns a one-line summary otherwise."""
    rnd = random.Random(seed)
    recorder = Recorder()
    stop = threading.Event()
    faults: list[str] = []
    ours = Client(",".join(cluster.nodes), request_timeout_s=REQUEST_TIMEOUT_S)
    official = [
        official_oxia_client(cluster.nodes[i % len(cluster.nodes)])
        for i in range(OFFICIAL_REGISTER_WORKERS)
    ]
    keys = sorted(agreed_keys(ours, official[0], cluster.shards, REGISTER_KEYS_PER_SHARD, "/reg/"))
    print(f"register keys: {', '.join(keys)}")
    workers: list[threading.Thread] = []
    process = 1
    for _ in range(OUR_REGISTER_WORKERS):
        client: OurClient | OfficialClient = OurClient(recorder, process, ours)
        args = (client, keys, random.Random(rnd.random()), stop)
        workers.append(threading.Thread(target=_register_worker, args=args, daemon=True))
        process += 1
    for oxia_client in official:
        client = OfficialClient(recorder, process, oxia_client)
        args = (client, keys, random.Random(rnd.random()), stop)
        workers.append(threading.Thread(target=_register_worker, args=args, daemon=True))
        process += 1
    for _ in range(SET_WORKERS):
        set_client = OurClient(recorder, process, ours)
        workers.append(
            threading.Thread(target=_set_worker, args=(set_client, seed, stop), daemon=True)
        )
        process += 1
    nemesis = threading.Thread(target=nemesis, args=(cluster, random.Random(seed), stop, faults))
    started = time.monotonic()
    try:
        for worker in [*workers, nemesis]:
            worker.start()
        time.sleep(seconds)
    finally:
        stop.set()
        nemesis.join()  # ends with everything resumed or restarted
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        ours.close()
        for oxia_client in official:
            close_in_background(oxia_client)
    stuck = sum(worker.is_alive() for worker in workers)  # their last operation stays open
    cluster.wait_online()
    final = _final_state(cluster.nodes[0], recorder)
    events = recorder.events

    checked = time.monotonic()
    linear = linearizability.check(events, MAX_STATES)
    complete = completeness.check(events, final)
    check_s = time.monotonic() - checked
    ops = operations(events)
    statuses = {s: sum(op.status == s for op in ops) for s in Status}
    summary = (
        f"nemesis seed {seed}: {len(faults)} faults in {seconds:g} s "
        f"({'; '.join(faults)}); {len(ops)} operations ({statuses[Status.OK]} ok, "
        f"{statuses[Status.FAIL]} fail, {statuses[Status.INFO]} info, {stuck} still open) "
        f"from {len(workers)} workers; checked in {check_s:.1f} s\n"
        f"linearizability: {linear.report()}\ncompleteness: {complete.report()}"
    )
    print(summary)
    if not (linear.linearizable and complete.ok):
        path = Path(os.environ.get("QS_NEMESIS_HISTORY_DIR") or history_dir)
        path = path / f"nemesis-history-seed{seed}.jsonl"
        recorder.dump(path)
        summary += f"\nhistory saved to {path}"
    assert linear.linearizable, summary
    assert complete.ok, summary
    assert statuses[Status.OK] > 100, summary
    return (
        f"nemesis seed {seed}: {len(faults)} faults in {seconds:g} s, {len(ops)} "
        f"operations linearizable and complete ({time.monotonic() - started:.0f} s in all)"
    )
