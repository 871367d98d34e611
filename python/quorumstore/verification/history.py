"""The event model of a recorded history: invocations, completions, and their JSONL form.

A history is the sequence of events that clients saw: an operation is invoked, and
later completes as ok (it happened, with its result), fail (it definitely did not
happen: the store refused it with a definite answer such as KEY_NOT_FOUND or
UNEXPECTED_VERSION_ID) or info (indeterminate: a timeout or an unavailable
cluster; it may take effect at any time after its invocation, or never). An
invocation without a completion is indeterminate too. Times come from one
monotonic clock, so only their order matters.

A history saved with `dump` and read back with `load` checks the same, which is
how a failing run is kept and re-checked.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: `expected_version_id` of a conditional put that requires the key to be absent.
MUST_NOT_EXIST = -1

#: Errors of a fail completion that still observed the state (see linearizability.py).
KEY_NOT_FOUND = "KEY_NOT_FOUND"
UNEXPECTED_VERSION_ID = "UNEXPECTED_VERSION_ID"


class Kind(enum.StrEnum):
    """What an operation does."""

    GET = "get"
    PUT = "put"
    CPUT = "cput"  #: a put with an expected version id (MUST_NOT_EXIST: key absent)
    DELETE = "delete"
    SCAN = "scan"  #: a range scan of [key, end_key)


class Status(enum.StrEnum):
    """How an operation ended, as the client saw it."""

    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Version:
    """The parts of a record's version that the model checks."""

    version_id: int
    modifications_count: int


@dataclass(frozen=True, slots=True)
class Record:
    """A key with its value and version, as a get or a scan returned it."""

    key: str
    value: str
    version: Version


@dataclass(frozen=True, slots=True)
class Invocation:
    """The start of an operation by one process (a worker thread that does one at a time).

    `value` is what a put writes; `end_key` bounds a scan, which starts at `key`.
    """

    op_id: int
    process: int
    kind: Kind
    key: str
    time: float
    value: str | None = None
    expected_version_id: int | None = None
    end_key: str | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """The end of an operation: what it returned, or the error it raised.

    ok get: `record`; ok put: `version`; ok delete: `existed`; ok scan: `records`.
    """

    op_id: int
    time: float
    status: Status
    record: Record | None = None
    version: Version | None = None
    existed: bool | None = None
    records: tuple[Record, ...] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation paired with its completion (None: it never completed)."""

    invocation: Invocation
    completion: Completion | None

    @property
    def status(self) -> Status:
        return Status.INFO if self.completion is None else self.completion.status

    @property
    def call_time(self) -> float:
        return self.invocation.time

    @property
    def return_time(self) -> float:
        """When the operation ended; infinity if indeterminate (it may still take effect)."""
        if self.completion is None or self.completion.status == Status.INFO:
            return math.inf
        return self.completion.time

    def describe(self, origin: float = 0.0) -> str:
        """One readable line: process, what it did, what it returned, and when."""
        inv, done = self.invocation, self.completion
        args = {
            Kind.GET: f"get {inv.key}",
            Kind.PUT: f"put {inv.key}={inv.value!r}",
            Kind.CPUT: f"put {inv.key}={inv.value!r} if version {inv.expected_version_id}",
            Kind.DELETE: f"delete {inv.key}",
            Kind.SCAN: f"scan [{inv.key}, {inv.end_key})",
        }[inv.kind]
        end = "..." if done is None else f"{done.time - origin:.4f}"
        return f"p{inv.process} [{inv.time - origin:.4f}, {end}] {args} -> {_outcome(done)}"


def _outcome(done: Completion | None) -> str:
    if done is None:
        return "info (never completed)"
    if done.status != Status.OK:
        return f"{done.status} {done.error or ''}".rstrip()
    if done.record is not None:
        return f"ok {_record(done.record)}"
    if done.version is not None:
        return f"ok {_version(done.version)}"
    if done.existed is not None:
        return f"ok existed={done.existed}"
    if done.records is not None:
        return "ok [" + ", ".join(f"{r.key}={_record(r)}" for r in done.records) + "]"
    return "ok"


def _record(record: Record) -> str:
    return f"{record.value!r}@{_version(record.version)}"


def _version(version: Version) -> str:
    return f"v{version.version_id}/m{version.modifications_count}"


Event = Invocation | Completion


def operations(events: Iterable[Event]) -> list[Operation]:
    """The history's operations in invocation order, each with its completion (if any)."""
    invocations: dict[int, Invocation] = {}
    completions: dict[int, Completion] = {}
    for event in events:
        table: dict[int, Any] = invocations if isinstance(event, Invocation) else completions
        if event.op_id in table:
            raise ValueError(f"operation {event.op_id} has two {type(event).__name__}s")
        table[event.op_id] = event
    orphans = completions.keys() - invocations.keys()
    if orphans:
        raise ValueError(f"completions without an invocation: {sorted(orphans)[:10]}")
    ordered = sorted(invocations.values(), key=lambda inv: (inv.time, inv.op_id))
    return [Operation(inv, completions.get(inv.op_id)) for inv in ordered]


# ------------------------------------------------------------------ JSONL


def dump(events: Iterable[Event], path: Path) -> None:
    """Writes the events to `path`, one JSON object per line."""
    with path.open("w", encoding="utf-8") as out:
        for event in events:
            out.write(json.dumps(_to_json(event), separators=(",", ":")) + "\n")


def load(path: Path) -> list[Event]:
    """The events `dump` wrote to `path`."""
    with path.open(encoding="utf-8") as lines:
        return [_from_json(json.loads(line)) for line in lines if line.strip()]


def _to_json(event: Event) -> dict[str, Any]:
    if isinstance(event, Invocation):
        fields: dict[str, Any] = {
            "event": "invoke",
            "id": event.op_id,
            "process": event.process,
            "kind": str(event.kind),
            "key": event.key,
            "time": event.time,
        }
        for name in ("value", "expected_version_id", "end_key"):
            if getattr(event, name) is not None:
                fields[name] = getattr(event, name)
        return fields
    fields = {
        "event": "complete",
        "id": event.op_id,
        "time": event.time,
        "status": str(event.status),
    }
    if event.record is not None:
        fields["record"] = _record_json(event.record)
    if event.version is not None:
        fields["version"] = [event.version.version_id, event.version.modifications_count]
    if event.existed is not None:
        fields["existed"] = event.existed
    if event.records is not None:
        fields["records"] = [_record_json(r) for r in event.records]
    if event.error is not None:
        fields["error"] = event.error
    return fields


def _record_json(record: Record) -> list[Any]:
    return [record.key, record.value, record.version.version_id, record.version.modifications_count]


def _record_from(fields: list[Any]) -> Record:
    key, value, version_id, modifications = fields
    return Record(key, value, Version(version_id, modifications))


def _from_json(fields: dict[str, Any]) -> Event:
    if fields["event"] == "invoke":
        return Invocation(
            fields["id"],
            fields["process"],
            Kind(fields["kind"]),
            fields["key"],
            fields["time"],
            fields.get("value"),
            fields.get("expected_version_id"),
            fields.get("end_key"),
        )
    version = fields.get("version")
    records = fields.get("records")
    return Completion(
        fields["id"],
        fields["time"],
        Status(fields["status"]),
        record=_record_from(fields["record"]) if "record" in fields else None,
        version=Version(*version) if version is not None else None,
        existed=fields.get("existed"),
        records=tuple(_record_from(r) for r in records) if records is not None else None,
        error=fields.get("error"),
    )
