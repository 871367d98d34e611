"""Set completeness and exactly-once, checked against the store's final state.

After the faults heal, one read of every key (a scan, with versions) is compared
with what the clients were told:

- completeness: every key with an acknowledged put is present, holding the value
  of a put that may be the last one (not one that an acknowledged put invoked after
  its acknowledgement superseded);
- no invention: the final value was written by a put that did not definitely fail;
- exactly-once: a record's modifications count says how many puts applied since it
  was created (count + 1). Every put carries a value of its own, which serves as
  its (client, serial) identity, so the puts of a key that may have applied are
  its acknowledged and its indeterminate ones: the count must lie between the
  acknowledged puts and those plus the indeterminate ones. The put whose value is
  final must also still have the version id it returned: a later apply of the
  same put would have given it a new one.

Keys that a delete may have touched are checked for invention only: their puts
before the delete no longer count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quorumstore.verification.history import (
    Event,
    Kind,
    Operation,
    Record,
    Status,
    operations,
)

#: Anomalies listed per category in a report.
_REPORTED = 10


@dataclass(slots=True)
class Result:
    """What the final state contradicts, per category (one readable line each)."""

    keys: int = 0
    lost: list[str] = field(default_factory=list)
    invented: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.invented or self.duplicated)

    def report(self) -> str:
        summary = (
            f"{self.keys} keys: {len(self.lost)} lost writes, {len(self.invented)} invented "
            f"values, {len(self.duplicated)} duplicate applies"
        )
        lines = [summary]
        for name, found in (
            ("lost", self.lost),
            ("invented", self.invented),
            ("duplicated", self.duplicated),
        ):
            lines += [f"  {name}: {line}" for line in found[:_REPORTED]]
        return "\n".join(lines)


def check(events: Iterable[Event], final: Mapping[str, Record]) -> Result:
    """Checks the final state (key -> record, as read after the run) against the
    history's puts and deletes."""
    writes: dict[str, list[Operation]] = defaultdict(list)
    deleted: set[str] = set()
    for op in operations(events):
        kind = op.invocation.kind
        if kind in (Kind.PUT, Kind.CPUT):
            writes[op.invocation.key].append(op)
        elif kind == Kind.DELETE and op.status != Status.FAIL:
            deleted.add(op.invocation.key)
    result = Result(keys=len(writes.keys() | final.keys()))
    for key in sorted(writes.keys() | final.keys()):
        _check_key(key, writes.get(key, []), final.get(key), key in deleted, result)
    return result


def _check_key(
    key: str, puts: list[Operation], record: Record | None, deleted: bool, result: Result
) -> None:
    by_value = {op.invocation.value: op for op in puts}
    writer = by_value.get(record.value) if record is not None else None
    if record is not None and (writer is None or writer.status == Status.FAIL):
        why = "no put wrote it" if writer is None else f"its put failed: {writer.describe()}"
        result.invented.append(f"{key} holds {record.value!r}, but {why}")
        return
    if deleted:
        return
    acked = [op for op in puts if op.status == Status.OK]
    maybe = [op for op in puts if op.status == Status.INFO]
    if record is None:
        if acked:
            result.lost.append(f"{key} is absent after {len(acked)} acknowledged puts")
        return
    assert writer is not None
    superseding = [op for op in acked if op.call_time > writer.return_time]
    if superseding:
        result.lost.append(
            f"{key} holds {record.value!r}, superseded by {superseding[0].describe()}"
        )
    applied = record.version.modifications_count + 1
    if applied < len(acked):
        result.lost.append(
            f"{key} was modified {applied} times, but {len(acked)} puts were acknowledged"
        )
    if applied > len(acked) + len(maybe):
        result.duplicated.append(
            f"{key} was modified {applied} times, but only {len(acked)} acknowledged and "
            f"{len(maybe)} indeterminate puts could have applied"
        )
    done = writer.completion
    if (
        writer.status == Status.OK
        and done is not None
        and done.version is not None
        and done.version.version_id != record.version.version_id
    ):
        result.duplicated.append(
            f"{key} holds {record.value!r} at version {record.version.version_id}, but its put "
            f"returned version {done.version.version_id}: it applied again"
        )
