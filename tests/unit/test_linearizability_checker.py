"""The linearizability checker on hand-written and generated histories, no servers.

Generated histories come from a simulated linearizable store: processes invoke
operations with random overlapping intervals, each takes effect at a random point
inside its interval, and some end indeterminate (applied or not). The checker must
accept every one of them, and reject each after one completion is changed to show
an anomaly (a stale read, a lost write, a duplicate apply, a conditional put that
succeeded against a stale version, a read of a value no one wrote).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import random
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumstore.verification import linearizability
from quorumstore.verification.history import (
    KEY_NOT_FOUND,
    MUST_NOT_EXIST,
    UNEXPECTED_VERSION_ID,
    Completion,
    Event,
    Invocation,
    Kind,
    Record,
    Status,
    Version,
    dump,
    load,
    operations,
)


class Builder:
    """Hand-written histories: one call per operation, with its interval and outcome."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def op(
        self,
        process: int,
        kind: Kind,
        key: str,
        start: float,
        end: float | None,
        status: Status = Status.OK,
        *,
        value: str | None = None,
        expected: int | None = None,
        end_key: str | None = None,
        **result: object,
    ) -> Builder:
        op_id = len(self.events)
        self.events.append(Invocation(op_id, process, kind, key, start, value, expected, end_key))
        if end is not None:
            self.events.append(Completion(op_id, end, status, **result))  # type: ignore[arg-type]
        return self

    def put(
        self,
        p: int,
        key: str,
        value: str,
        start: float,
        end: float | None,
        version: tuple[int, int] | None = None,
        *,
        status: Status = Status.OK,
        expected: int | None = None,
        error: str | None = None,
    ) -> Builder:
        kind = Kind.PUT if expected is None else Kind.CPUT
        v = Version(*version) if version is not None else None
        return self.op(
            p, kind, key, start, end, status, value=value, expected=expected, version=v, error=error
        )

    def get(
        self, p: int, key: str, start: float, end: float, found: tuple[str, int, int] | None
    ) -> Builder:
        if found is None:
            return self.op(p, Kind.GET, key, start, end, Status.FAIL, error=KEY_NOT_FOUND)
        value, version_id, modifications = found
        record = Record(key, value, Version(version_id, modifications))
        return self.op(p, Kind.GET, key, start, end, record=record)

    def delete(
        self,
        p: int,
        key: str,
        start: float,
        end: float | None,
        existed: bool | None,
        status: Status = Status.OK,
    ) -> Builder:
        return self.op(p, Kind.DELETE, key, start, end, status, existed=existed)

    def scan(
        self,
        p: int,
        start_key: str,
        end_key: str,
        start: float,
        end: float,
        found: dict[str, tuple[str, int, int]],
    ) -> Builder:
        records = tuple(Record(k, v, Version(i, m)) for k, (v, i, m) in sorted(found.items()))
        return self.op(p, Kind.SCAN, start_key, start, end, end_key=end_key, records=records)

    def check(self) -> linearizability.Result:
        return linearizability.check(self.events)


# ------------------------------------------------------------------ hand-written


def test_sequential_history_is_linearizable() -> None:
    h = Builder().get(1, "/a", 0, 1, None).put(1, "/a", "x", 2, 3, (10, 0))
    h.get(2, "/a", 4, 5, ("x", 10, 0)).put(2, "/a", "y", 6, 7, (12, 1))
    h.delete(1, "/a", 8, 9, True).get(1, "/a", 10, 11, None).delete(2, "/a", 12, 13, False)
    result = h.check()
    assert result.linearizable, result.report()


@pytest.mark.parametrize("seen", [None, ("x", 10, 0)])
def test_a_read_overlapping_a_put_may_see_either_state(seen: tuple[str, int, int] | None) -> None:
    h = Builder().put(1, "/a", "x", 0, 10, (10, 0)).get(2, "/a", 1, 2, seen)
    assert h.check().linearizable


def test_concurrent_puts_take_effect_in_either_order() -> None:
    # p2's put returned first but took effect second: its count says it came after.
    h = Builder().put(1, "/a", "x", 0, 10, (11, 1)).put(2, "/a", "y", 1, 5, (10, 0))
    h.get(3, "/a", 11, 12, ("x", 11, 1))
    assert h.check().linearizable
    h = Builder().put(1, "/a", "x", 0, 10, (11, 0)).put(2, "/a", "y", 1, 5, (10, 0))
    h.get(3, "/a", 11, 12, ("x", 11, 0))  # both created the record: one count is wrong
    assert not h.check().linearizable


def test_an_indeterminate_put_may_apply_late_or_never() -> None:
    h = Builder().put(1, "/a", "x", 0, 1, (10, 0)).put(2, "/a", "y", 2, None)
    h.get(1, "/a", 3, 4, ("x", 10, 0)).get(1, "/a", 50, 51, ("y", 30, 1))
    h.get(3, "/a", 52, 53, ("y", 30, 1))
    assert h.check().linearizable
    h = Builder().put(1, "/a", "x", 0, 1, (10, 0)).put(2, "/a", "y", 2, 3, status=Status.INFO)
    h.get(1, "/a", 4, 5, ("x", 10, 0))
    assert h.check().linearizable
    h = Builder().put(2, "/a", "y", 2, 3, status=Status.INFO).get(1, "/a", 0, 1, ("y", 30, 0))
    assert not h.check().linearizable, "read before the put was invoked"


def test_stale_read_is_caught_with_a_readable_counterexample() -> None:
    h = Builder().put(1, "/a", "x", 0, 1, (10, 0)).put(1, "/a", "y", 2, 3, (11, 1))
    h.get(2, "/a", 4, 5, ("x", 10, 0)).get(3, "/b", 0, 1, None)
    result = h.check()
    assert not result.linearizable
    assert [r.key for r in result.failures] == ["/a"]
    text = result.report()
    print(text)
    assert "key /a is not linearizable" in text
    assert "get /a -> ok 'x'@v10/m0" in text
    assert "leaving the key 'y'@v11/m1" in text


def test_conditional_puts() -> None:
    h = Builder().put(1, "/a", "x", 0, 1, (10, 0), expected=MUST_NOT_EXIST)
    h.put(
        2, "/a", "z", 2, 3, status=Status.FAIL, expected=MUST_NOT_EXIST, error=UNEXPECTED_VERSION_ID
    )
    h.put(1, "/a", "y", 4, 5, (11, 1), expected=10)
    h.put(2, "/a", "w", 6, 7, status=Status.FAIL, expected=10, error=UNEXPECTED_VERSION_ID)
    assert h.check().linearizable
    stale = Builder().put(1, "/a", "x", 0, 1, (10, 0)).put(1, "/a", "y", 2, 3, (11, 1))
    stale.put(2, "/a", "z", 4, 5, (12, 2), expected=10)
    assert not stale.check().linearizable
    refused = Builder().put(1, "/a", "x", 0, 1, (10, 0))
    refused.put(2, "/a", "z", 4, 5, status=Status.FAIL, expected=10, error=UNEXPECTED_VERSION_ID)
    assert not refused.check().linearizable


def test_deletes_say_whether_the_key_existed() -> None:
    assert not Builder().delete(1, "/a", 0, 1, True).check().linearizable
    h = Builder().put(1, "/a", "x", 0, 1, (10, 0)).delete(2, "/a", 2, None, None)
    h.get(1, "/a", 3, 4, ("x", 10, 0)).get(1, "/a", 5, 6, None)
    h.put(1, "/a", "y", 7, 8, (12, 0))  # a new record: the count starts again
    assert h.check().linearizable


def test_read_of_a_value_never_written_is_caught() -> None:
    h = Builder().put(1, "/a", "x", 0, 1, (10, 0)).get(2, "/a", 0.5, 3, ("q", 10, 0))
    assert not h.check().linearizable


def test_scans_are_reads_of_every_key_in_range() -> None:
    h = Builder().put(1, "/k/1", "x", 0, 1, (10, 0)).put(1, "/k/2", "y", 2, 3, (11, 0))
    h.put(1, "/l/1", "z", 2, 3, (12, 0))
    h.scan(2, "/k/", "/k/~", 0.5, 2.5, {"/k/1": ("x", 10, 0)})  # /k/2 may not exist yet
    assert h.check().linearizable
    h.scan(2, "/k/", "/k/~", 4, 5, {"/k/1": ("x", 10, 0)})  # /k/2 is missing
    result = h.check()
    assert [r.key for r in result.failures] == ["/k/2"]
    assert "scan [/k/, /k/~) saw /k/2 absent" in result.report()
    phantom = Builder().scan(2, "/k/", "/k/~", 4, 5, {"/k/9": ("q", 1, 0)})
    assert not phantom.check().linearizable


def test_jsonl_round_trip_checks_the_same(tmp_path: Path) -> None:
    h = Builder().put(1, "/a", "x\u00e9", 0, 1, (10, 0)).put(1, "/a", "y", 2, None)
    h.get(2, "/a", 4, 5, ("x\u00e9", 10, 0)).scan(3, "/", "", 6, 7, {"/a": ("x\u00e9", 10, 0)})
    h.delete(2, "/a", 8, 9, None, Status.INFO)
    path = tmp_path / "history.jsonl"
    dump(h.events, path)
    assert load(path) == h.events
    assert linearizability.check(load(path)).linearizable is h.check().linearizable is True


# ------------------------------------------------------------------ generated


@dataclasses.dataclass
class Simulated:
    """A history of a linearizable store, and what the store really did."""

    events: list[Event]
    #: Per key, the writes that took effect: (linearization time, op id, state after).
    timeline: dict[str, list[tuple[float, int, linearizability.State]]]


def simulate(seed: int, ops: int, keys: int, processes: int, info_rate: float = 0.02) -> Simulated:
    """Processes doing one operation at a time on a correct register per key."""
    rnd = random.Random(seed)
    names = [f"/k/{i:03d}" for i in range(keys)]
    store: dict[str, tuple[str, int, int]] = {}
    next_version = 1
    seen: dict[tuple[int, str], int] = {}  # (process, key) -> last version id it saw
    timeline: dict[str, list[tuple[float, int, linearizability.State]]] = defaultdict(list)
    events: list[Event] = []
    at: dict[int, float] = {}  # each operation's linearization time (applied or not)
    # time, order, op id, what, (process, flag)
    queue: list[tuple[float, int, int, str, tuple[int, bool]]] = []
    order = 0

    def schedule(t: float, op_id: int, what: str, payload: tuple[int, bool]) -> None:
        nonlocal order
        order += 1
        heapq.heappush(queue, (t, order, op_id, what, payload))

    def invoke(process: int, t: float) -> None:
        op_id = len(at)
        kind = rnd.choices(list(Kind), weights=[35, 25, 15, 10, 15])[0]
        key = rnd.choice(names)
        value = expected = end_key = None
        if kind in (Kind.PUT, Kind.CPUT):
            value = f"v{op_id}"
        if kind == Kind.CPUT:
            expected = seen.get((process, key), MUST_NOT_EXIST)
        if kind == Kind.SCAN:
            a, b = sorted(rnd.sample(range(keys + 1), 2))
            key, end_key = names[a], names[b] if b < keys else "/k/~"
        events.append(Invocation(op_id, process, kind, key, t, value, expected, end_key))
        end = t + rnd.expovariate(1.0)
        at[op_id] = rnd.uniform(t, end)
        info = rnd.random() < info_rate
        applied = not info or rnd.random() < 0.5
        schedule(at[op_id], op_id, "apply", (process, applied))
        schedule(end, op_id, "complete", (process, info))

    results: dict[int, dict[str, object]] = {}

    def apply(op_id: int, process: int, applied: bool) -> None:
        nonlocal next_version
        inv = events_by_id[op_id]
        key, current = inv.key, store.get(inv.key)
        if inv.kind == Kind.GET:
            results[op_id] = (
                {"status": Status.FAIL, "error": KEY_NOT_FOUND}
                if current is None
                else {"record": Record(key, current[0], Version(*current[1:]))}
            )
        elif inv.kind == Kind.SCAN:
            inside = [k for k in names if inv.key <= k < (inv.end_key or "~") and k in store]
            results[op_id] = {
                "records": tuple(Record(k, store[k][0], Version(*store[k][1:])) for k in inside)
            }
        elif inv.kind == Kind.CPUT and inv.expected_version_id != (
            MUST_NOT_EXIST if current is None else current[1]
        ):
            results[op_id] = {"status": Status.FAIL, "error": UNEXPECTED_VERSION_ID}
        elif not applied:
            pass
        elif inv.kind == Kind.DELETE:
            store.pop(key, None)
            results[op_id] = {"existed": current is not None}
            timeline[key].append((at[op_id], op_id, None))
        else:
            assert inv.value is not None
            record = (inv.value, next_version, 0 if current is None else current[2] + 1)
            next_version += 1
            store[key] = record
            results[op_id] = {"version": Version(*record[1:])}
            timeline[key].append((at[op_id], op_id, record))

    events_by_id: dict[int, Invocation] = {}
    for p in range(processes):
        schedule(rnd.uniform(0, 1), -1, "start", (p, False))
    while queue:
        t, _, op_id, what, payload = heapq.heappop(queue)
        process, flag = payload
        if what == "start":
            if len(at) < ops:
                invoke(process, t)
                events_by_id[len(at) - 1] = events[-1]  # type: ignore[assignment]
            continue
        if what == "apply":
            apply(op_id, process, flag)
            continue
        outcome = results.get(op_id, {})
        if flag:  # indeterminate: an info completion, or none at all
            if rnd.random() < 0.5:
                events.append(Completion(op_id, t, Status.INFO, error="timeout"))
        else:
            fields = dict(outcome)
            status = fields.pop("status", Status.OK)
            events.append(Completion(op_id, t, status, **fields))  # type: ignore[arg-type]
            inv = events_by_id[op_id]
            found = fields.get("record") or fields.get("version")
            if isinstance(found, Record):
                seen[(process, inv.key)] = found.version.version_id
            elif isinstance(found, Version):
                seen[(process, inv.key)] = found.version_id
        schedule(t + rnd.uniform(0, 0.2), -1, "start", (process, False))
    return Simulated(events, dict(timeline))


# Each injector changes one completion of a simulated history so that no
# linearization exists, or returns None when the history offers no place for it.
Injector = Callable[[Simulated, random.Random], list[Event] | None]


def _ops(sim: Simulated) -> dict[int, linearizability.Operation]:
    return {op.invocation.op_id: op for op in operations(sim.events)}


def _replace(sim: Simulated, op_id: int, **changes: object) -> list[Event]:
    return [
        dataclasses.replace(e, **changes)  # type: ignore[arg-type]
        if isinstance(e, Completion) and e.op_id == op_id
        else e
        for e in sim.events
    ]


def _reads(sim: Simulated) -> list[linearizability.Operation]:
    return [
        op for op in _ops(sim).values() if op.invocation.kind == Kind.GET and op.status == Status.OK
    ]


def _acked_writes_before(sim: Simulated, key: str, t: float) -> list[tuple[int, object]]:
    """The writes of `key` that took effect and were acknowledged before `t`, with the
    state each left, in effect order."""
    ops = _ops(sim)
    return [
        (op_id, state)
        for _, op_id, state in sim.timeline.get(key, [])
        if ops[op_id].status == Status.OK and ops[op_id].return_time < t
    ]


def _with_record(sim: Simulated, op_id: int, key: str, state: object) -> list[Event]:
    assert isinstance(state, tuple)
    value, version_id, modifications = state
    return _replace(sim, op_id, record=Record(key, value, Version(version_id, modifications)))


def stale_read(sim: Simulated, rnd: random.Random) -> list[Event] | None:
    for read in rnd.sample(_reads(sim), len(_reads(sim))):
        key = read.invocation.key
        before = _acked_writes_before(sim, key, read.call_time)
        if len(before) >= 2 and None not in (before[-2][1], before[-1][1]):
            return _with_record(sim, read.invocation.op_id, key, before[-2][1])
    return None


def lost_write(sim: Simulated, rnd: random.Random) -> list[Event] | None:
    """A read that misses an acknowledged put no delete can have undone."""
    ops = _ops(sim)
    for read in rnd.sample(_reads(sim), len(_reads(sim))):
        key = read.invocation.key
        before = _acked_writes_before(sim, key, read.call_time)
        if not before or before[-1][1] is None:
            continue
        put = ops[before[-1][0]]
        deletes = [
            op
            for op in ops.values()
            if op.invocation.key == key
            and op.invocation.kind == Kind.DELETE
            and op.status != Status.FAIL
            and op.return_time > put.call_time
            and op.call_time < read.return_time
        ]
        if not deletes:
            return _replace(
                sim, read.invocation.op_id, status=Status.FAIL, record=None, error=KEY_NOT_FOUND
            )
    return None


def duplicate_apply(sim: Simulated, rnd: random.Random) -> list[Event] | None:
    """A read of an acknowledged put's record whose count says the put applied twice."""
    ops = _ops(sim)
    acked = {op.invocation.value for op in ops.values() if op.status == Status.OK}
    for read in rnd.sample(_reads(sim), len(_reads(sim))):
        record = read.completion.record  # type: ignore[union-attr]
        assert record is not None
        if record.value not in acked:
            continue
        version = Version(record.version.version_id, record.version.modifications_count + 1)
        return _replace(
            sim, read.invocation.op_id, record=dataclasses.replace(record, version=version)
        )
    return None


def stale_conditional_put(sim: Simulated, rnd: random.Random) -> list[Event] | None:
    ops = _ops(sim)
    cputs = [
        op for op in ops.values() if op.invocation.kind == Kind.CPUT and op.status == Status.OK
    ]
    for cput in rnd.sample(cputs, len(cputs)):
        key = cput.invocation.key
        unknown = [
            op
            for op in ops.values()
            if op.invocation.key == key
            and op.invocation.kind not in (Kind.GET, Kind.SCAN)
            and op.status == Status.INFO
            and op.call_time < cput.return_time
        ]
        before = _acked_writes_before(sim, key, cput.call_time)
        if unknown or len(before) < 2 or None in (before[-2][1], before[-1][1]):
            continue
        stale = before[-2][1][1]  # type: ignore[index]
        return [
            dataclasses.replace(e, expected_version_id=stale)
            if isinstance(e, Invocation) and e.op_id == cput.invocation.op_id
            else e
            for e in sim.events
        ]
    return None


def never_written(sim: Simulated, rnd: random.Random) -> list[Event] | None:
    read = rnd.choice(_reads(sim))
    record = read.completion.record  # type: ignore[union-attr]
    assert record is not None
    return _replace(sim, read.invocation.op_id, record=dataclasses.replace(record, value="?"))


INJECTORS: dict[str, Injector] = {
    "stale read": stale_read,
    "lost write": lost_write,
    "duplicate apply": duplicate_apply,
    "conditional put against a stale version": stale_conditional_put,
    "read of a never-written value": never_written,
}


SEEDS = range(12)


@functools.cache
def simulated(seed: int) -> Simulated:
    return simulate(seed, ops=400, keys=4, processes=6, info_rate=0.05)


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_histories_are_linearizable(seed: int) -> None:
    result = linearizability.check(simulated(seed).events)
    assert result.linearizable, result.report()


@pytest.mark.parametrize("name", INJECTORS)
def test_injected_anomalies_are_caught(name: str) -> None:
    caught = []
    for seed in SEEDS:
        mutated = INJECTORS[name](simulated(seed), random.Random(seed))
        if mutated is None:
            continue
        verdict = linearizability.check(mutated)
        assert not verdict.linearizable and not verdict.unknown, f"missed (seed {seed})"
        assert len(verdict.failures) == 1, verdict.report()
        caught.append(seed)
    print(f"{name}: injected and caught in seeds {caught}")
    assert len(caught) >= 3, "the histories offered too few places to inject it"


def test_ci_sized_history_checks_with_bounded_search() -> None:
    sim = simulate(99, ops=10_000, keys=50, processes=8, info_rate=0.02)
    started = time.perf_counter()
    result = linearizability.check(sim.events)
    elapsed = time.perf_counter() - started
    ops = sum(r.operations for r in result.keys.values())
    print(
        f"10,000 operations ({ops} per key) over 50 keys, 8 processes: "
        f"{result.states} states visited in {elapsed:.2f} s"
    )
    assert result.linearizable, result.report()
    assert result.states <= 5 * ops
    mutated = stale_read(sim, random.Random(1))
    assert mutated is not None
    assert not linearizability.check(mutated).linearizable
