"""Per-key linearizability of a history against a register with Oxia's versions.

The model of one key is absent, or a record (value, version id, modifications
count): a put writes a value and returns the new version (its id larger than the
one it replaces; modifications 0 on a new record, one more on an existing one); a
conditional put applies only if the current version id is the expected one (-1:
only if absent), and otherwise fails with UNEXPECTED_VERSION_ID; a delete makes
the key absent and says whether it existed; a get returns the record or
KEY_NOT_FOUND. Because version ids and modification counts are part of the state,
a write applied twice shows up as a modifications count one too high.

Keys are independent registers, so the history is split per key and each part is
checked alone (P-compositionality). Each part is checked with the Wing-Gong/Lowe
search: operations sit in a list of call and return entries in time order; the
search walks the list, linearizes any call whose model step fits (lifting its call
and return out of the list), and backtracks when it reaches the return of an
operation it has not linearized. A set of (linearized operations as a bitset,
model state) pairs already explored prunes the search, as in Knossos and
Porcupine.

Indeterminate operations (info, or never completed) return at infinity: they may be
linearized anywhere after their invocation, or never. An indeterminate put's
version is unknown; the first read that sees its value binds it. A failed read or
a write that definitely failed without observing anything is left out.

A range scan is approximated as one read per key of the history in its range, each
at its own point within the scan's interval: returned keys are reads of their
records, the others reads of "absent". This checks every key the scan saw, or did
not see, against that key's register, but not that the scan was one snapshot
across keys (nor that keys no one wrote are absent, beyond those it returned).
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from quorumstore.verification.history import (
    KEY_NOT_FOUND,
    MUST_NOT_EXIST,
    UNEXPECTED_VERSION_ID,
    Event,
    Kind,
    Operation,
    Record,
    Status,
    operations,
)
from quorumstore.wire.keys import encode_key

#: A key's model state: None when absent, else (value, version id, modifications
#: count); the version parts are None while unknown (after an indeterminate put).
State = tuple[str, int | None, int | None] | None

#: Model states the search of one key may visit before it gives up (inconclusive).
DEFAULT_MAX_STATES = 2_000_000
#: Operations listed on each side of the point where a check fails.
_REPORTED_OPS = 8

# What a per-key operation does to the model.
_READ, _PUT, _CPUT, _DELETE = range(4)
# How a write ended: applied with a known result, definitely refused, or unknown.
_APPLIED, _REFUSED, _UNKNOWN = range(3)


@dataclass(slots=True)
class KeyOp:
    """One operation on one key, as the search sees it (a scan gives one per key)."""

    source: Operation
    key: str
    call: float
    ret: float
    action: int
    outcome: int = _APPLIED
    value: str | None = None  #: a put's value
    expected: int | None = None  #: a conditional write's expected version id
    observed: State = None  #: a read's record (None: absent); an applied put's new record
    existed: bool | None = None  #: an applied delete's answer

    @property
    def required(self) -> bool:
        """False for an indeterminate operation, which may be left out."""
        return self.outcome != _UNKNOWN

    def describe(self, origin: float) -> str:
        if self.source.invocation.kind != Kind.SCAN:
            return self.source.describe(origin)
        inv = self.source.invocation
        done = self.source.completion
        assert done is not None
        seen = "absent" if self.observed is None else _state(self.observed)
        return (
            f"p{inv.process} [{inv.time - origin:.4f}, {done.time - origin:.4f}] "
            f"scan [{inv.key}, {inv.end_key}) saw {self.key} {seen}"
        )


def _state(state: State) -> str:
    if state is None:
        return "absent"
    value, version_id, modifications = state
    return f"{value!r}@v{_known(version_id)}/m{_known(modifications)}"


def _known(number: int | None) -> str:
    return "?" if number is None else str(number)


# ------------------------------------------------------------------ the model


def _matches(state: State, expected: int | None) -> tuple[bool, bool]:
    """Whether a conditional write on `state` may apply, and whether it may be refused
    (both when the state's version id is unknown)."""
    if expected is None:
        return True, False
    if expected == MUST_NOT_EXIST:
        return state is None, state is not None
    if state is None:
        return False, True
    version_id = state[1]
    if version_id is None:
        return True, True
    return version_id == expected, version_id != expected


def _step(state: State, op: KeyOp) -> tuple[bool, State]:
    """Whether `op` can take effect on `state`, and the state after it."""
    action, outcome = op.action, op.outcome
    if action == _READ:
        seen = op.observed
        if seen is None or state is None:
            return seen is state, state
        if seen[0] != state[0]:
            return False, state
        if (state[1] is not None and state[1] != seen[1]) or (
            state[2] is not None and state[2] != seen[2]
        ):
            return False, state
        return True, seen  # binds a version an indeterminate put left unknown
    may_apply, may_refuse = _matches(state, op.expected)
    if outcome == _REFUSED:
        return may_refuse, state
    if not may_apply:
        return False, state
    if action == _DELETE:
        if outcome == _APPLIED and op.existed != (state is not None):
            return False, state
        return True, None
    modifications = 0 if state is None else (None if state[2] is None else state[2] + 1)
    assert op.value is not None
    if outcome == _UNKNOWN:
        return True, (op.value, None, modifications)
    new = op.observed
    assert new is not None
    if modifications is not None and new[2] != modifications:
        return False, state
    if state is not None and state[1] is not None and new[1] is not None and new[1] <= state[1]:
        return False, state
    return True, new


# ------------------------------------------------------------------ the history, per key


def _record_state(record: Record) -> State:
    return (record.value, record.version.version_id, record.version.modifications_count)


def split_by_key(ops: Iterable[Operation]) -> dict[str, list[KeyOp]]:
    """Each key's operations for the search; scans become reads of every key in range."""
    per_key: dict[str, list[KeyOp]] = defaultdict(list)
    scans: list[Operation] = []
    for op in ops:
        key = op.invocation.key
        if op.invocation.kind == Kind.SCAN:
            if op.status == Status.OK:
                scans.append(op)
            continue
        key_op = _key_op(op)
        if key_op is not None:
            per_key[key].append(key_op)
        else:
            per_key.setdefault(key, [])
    scanned = [(scan, scan.completion.records) for scan in scans if scan.completion is not None]
    universe = set(per_key).union(r.key for _, records in scanned for r in records or ())
    ordered = sorted((encode_key(k), k) for k in universe)
    encoded = [e for e, _ in ordered]
    for scan, records in scanned:
        assert records is not None and scan.invocation.end_key is not None
        for r in records:  # each record is a read; a key returned twice is read twice
            per_key[r.key].append(_scan_read(scan, r.key, _record_state(r)))
        returned = {r.key for r in records}
        start, end = scan.invocation.key, scan.invocation.end_key
        first = bisect.bisect_left(encoded, encode_key(start))
        last = bisect.bisect_left(encoded, encode_key(end)) if end else len(encoded)
        for _, key in ordered[first:last]:
            if key not in returned:
                per_key[key].append(_scan_read(scan, key, None))
    return dict(per_key)


def _scan_read(scan: Operation, key: str, observed: State) -> KeyOp:
    return KeyOp(scan, key, scan.call_time, scan.return_time, _READ, observed=observed)


def _key_op(op: Operation) -> KeyOp | None:
    """The operation as the search sees it, or None if it cannot matter."""
    inv, done, status = op.invocation, op.completion, op.status
    make = functools.partial(KeyOp, op, inv.key, op.call_time, op.return_time)
    error = done.error if done is not None else None
    if inv.kind == Kind.GET:
        if status == Status.OK:
            assert done is not None and done.record is not None
            return make(_READ, observed=_record_state(done.record))
        if status == Status.FAIL and error == KEY_NOT_FOUND:
            return make(_READ, observed=None)
        return None  # a read that returned nothing has no effect
    action = {Kind.PUT: _PUT, Kind.CPUT: _CPUT, Kind.DELETE: _DELETE}[inv.kind]
    expected = inv.expected_version_id
    if status == Status.INFO:
        return make(action, _UNKNOWN, value=inv.value, expected=expected)
    if status == Status.FAIL:
        if expected is not None and error in (UNEXPECTED_VERSION_ID, KEY_NOT_FOUND):
            return make(action, _REFUSED, expected=expected)
        return None  # definitely did not happen, and observed nothing
    assert done is not None
    if action == _DELETE:
        return make(action, expected=expected, existed=done.existed)
    assert done.version is not None and inv.value is not None
    v = done.version
    observed = (inv.value, v.version_id, v.modifications_count)
    return make(action, value=inv.value, expected=expected, observed=observed)


# ------------------------------------------------------------------ the search


@dataclass(slots=True)
class KeyResult:
    """The verdict on one key: linearizable (True), not (False) or unknown (None:
    the search ran out of its state budget)."""

    key: str
    linearizable: bool | None
    operations: int
    states: int
    counterexample: str = ""


@dataclass(slots=True)
class Result:
    """The verdict on a whole history, key by key."""

    keys: dict[str, KeyResult] = field(default_factory=dict)

    @property
    def linearizable(self) -> bool:
        return all(r.linearizable for r in self.keys.values())

    @property
    def states(self) -> int:
        return sum(r.states for r in self.keys.values())

    @property
    def failures(self) -> list[KeyResult]:
        return [r for r in self.keys.values() if r.linearizable is False]

    @property
    def unknown(self) -> list[KeyResult]:
        return [r for r in self.keys.values() if r.linearizable is None]

    def report(self) -> str:
        """A readable summary, with the counterexample of every failed key."""
        ops = sum(r.operations for r in self.keys.values())
        summary = (
            f"{len(self.keys)} keys, {ops} per-key operations, {self.states} states visited: "
            f"{len(self.failures)} not linearizable, {len(self.unknown)} inconclusive"
        )
        lines = [summary]
        lines += [r.counterexample for r in self.failures]
        lines += [f"key {r.key}: gave up after {r.states} states" for r in self.unknown]
        return "\n".join(lines)


def check(events: Iterable[Event], max_states: int = DEFAULT_MAX_STATES) -> Result:
    """Checks every key of the history (events as recorded or loaded)."""
    ops = operations(events)
    origin = ops[0].call_time if ops else 0.0
    result = Result()
    for key, key_ops in sorted(split_by_key(ops).items()):
        result.keys[key] = check_key(key, key_ops, max_states, origin)
    return result


def check_key(
    key: str, ops: list[KeyOp], max_states: int = DEFAULT_MAX_STATES, origin: float = 0.0
) -> KeyResult:
    """The Wing-Gong/Lowe search with memoisation over one key's operations."""
    n = len(ops)
    # Entries 1..2n in time order (calls before returns at equal times, so that
    # touching intervals count as concurrent); 0 is the head of the list.
    order = sorted(
        [(op.call, 0, i) for i, op in enumerate(ops)] + [(op.ret, 1, i) for i, op in enumerate(ops)]
    )
    nxt = [0] * (2 * n + 2)
    prv = [0] * (2 * n + 2)
    entry_op = [0] * (2 * n + 1)
    is_call = [False] * (2 * n + 1)
    call_entry = [0] * n
    ret_entry = [0] * n
    for position, (_, is_return, i) in enumerate(order, start=1):
        entry_op[position] = i
        is_call[position] = not is_return
        (ret_entry if is_return else call_entry)[i] = position
        prv[position] = position - 1
        nxt[position - 1] = position
    nxt[2 * n] = 0  # 0 ends the list as well as heading it

    def lift(i: int) -> None:
        for e in (call_entry[i], ret_entry[i]):
            nxt[prv[e]] = nxt[e]
            prv[nxt[e]] = prv[e]

    def unlift(i: int) -> None:
        for e in (ret_entry[i], call_entry[i]):
            nxt[prv[e]] = e
            prv[nxt[e]] = e

    remaining = sum(op.required for op in ops)
    state: State = None
    linearized = 0
    seen: set[tuple[int, State]] = set()
    stack: list[tuple[int, State]] = []
    deepest: tuple[list[tuple[int, State]], State] = ([], None)
    entry = nxt[0]
    while remaining:
        if is_call[entry]:
            i = entry_op[entry]
            fits, after = _step(state, ops[i])
            if fits:
                bits = linearized | (1 << i)
                if (bits, after) not in seen:
                    if len(seen) >= max_states:
                        return KeyResult(key, None, n, len(seen))
                    seen.add((bits, after))
                    stack.append((i, state))
                    state, linearized = after, bits
                    remaining -= ops[i].required
                    lift(i)
                    if len(stack) > len(deepest[0]):
                        deepest = (stack.copy(), state)
                    entry = nxt[0]
                    continue
            entry = nxt[entry]
        else:  # the return of an operation not linearized yet: undo the last choice
            if not stack:
                text = _counterexample(key, ops, deepest[0], deepest[1], len(seen), origin)
                return KeyResult(key, False, n, len(seen), text)
            i, state = stack.pop()
            linearized &= ~(1 << i)
            remaining += ops[i].required
            unlift(i)
            entry = nxt[call_entry[i]]
    return KeyResult(key, True, n, len(seen))


def _counterexample(
    key: str,
    ops: list[KeyOp],
    prefix: list[tuple[int, State]],
    state: State,
    states: int,
    origin: float,
) -> str:
    """The longest linearizable prefix the search found, and the operations of which
    none could come after it."""
    done = {i for i, _ in prefix}
    left = [op for i, op in enumerate(ops) if i not in done]
    deadline = min(op.ret for op in left if op.required)
    stuck = sorted((op for op in left if op.call <= deadline), key=lambda op: op.call)
    lines = [
        f"key {key} is not linearizable ({len(ops)} operations, {states} states visited).",
        f"The longest linearizable prefix has {len(prefix)} operations; its last ones:",
    ]
    lines += ["  " + ops[i].describe(origin) for i, _ in prefix[-_REPORTED_OPS:]]
    lines.append(f"leaving the key {_state(state)}. None of these can come next:")
    lines += ["  " + op.describe(origin) for op in stuck[: 2 * _REPORTED_OPS]]
    if len(stuck) > 2 * _REPORTED_OPS:
        lines.append(f"  ... and {len(stuck) - 2 * _REPORTED_OPS} more")
    return "\n".join(lines)
