"""Set completeness and exactly-once against a final state, and the recorder's mapping of
client exceptions to fail (did not happen) or info (may have happened), no servers."""

from __future__ import annotations

import random
from typing import Any

import grpc
import oxia.ex
import pytest

from quorumstore import client as qs
from quorumstore.verification import completeness
from quorumstore.verification.history import (
    KEY_NOT_FOUND,
    UNEXPECTED_VERSION_ID,
    Completion,
    Event,
    Invocation,
    Kind,
    Record,
    Status,
    Version,
    operations,
)
from quorumstore.verification.recorder import NOT_SENT, OfficialClient, OurClient, Recorder


def set_workload(seed: int, keys: int = 300) -> tuple[list[Event], dict[str, Record]]:
    """Unique keys put once each, some indeterminate (applied or not); the final state
    of a store that applied each put exactly once."""
    rnd = random.Random(seed)
    events: list[Event] = []
    final: dict[str, Record] = {}
    for i in range(keys):
        key, value, t = f"/set/{i:05d}", f"value-{i}", float(i)
        events.append(Invocation(i, i % 8, Kind.PUT, key, t, value))
        version = Version(1000 + i, 0)
        roll = rnd.random()
        if roll < 0.05:
            events.append(Completion(i, t + 0.5, Status.INFO, error="timeout"))
            applied = rnd.random() < 0.5
        elif roll < 0.08:
            events.append(Completion(i, t + 0.5, Status.FAIL, error="INVALID_REQUEST"))
            applied = False
        else:
            events.append(Completion(i, t + 0.5, Status.OK, version=version))
            applied = True
        if applied:
            final[key] = Record(key, value, version)
    return events, final


def acked_keys(events: list[Event]) -> list[str]:
    return [op.invocation.key for op in operations(events) if op.status == Status.OK]


@pytest.mark.parametrize("seed", range(5))
def test_a_complete_exactly_once_state_passes(seed: int) -> None:
    events, final = set_workload(seed)
    result = completeness.check(events, final)
    assert result.ok, result.report()
    assert result.keys == 300


@pytest.mark.parametrize("seed", range(5))
def test_a_lost_write_is_caught(seed: int) -> None:
    events, final = set_workload(seed)
    del final[random.Random(seed).choice(acked_keys(events))]
    result = completeness.check(events, final)
    assert len(result.lost) == 1 and not result.invented and not result.duplicated
    assert "absent after 1 acknowledged puts" in result.report()


@pytest.mark.parametrize("seed", range(5))
def test_a_duplicate_apply_is_caught(seed: int) -> None:
    events, final = set_workload(seed)
    key = random.Random(seed).choice(acked_keys(events))
    record = final[key]
    # Applied again (a retry without exactly-once): one more modification, a new version.
    final[key] = Record(key, record.value, Version(record.version.version_id + 7, 1))
    result = completeness.check(events, final)
    assert len(result.duplicated) == 2 and not result.lost, result.report()
    print(result.report())


def test_an_indeterminate_put_may_apply_once_but_not_twice() -> None:
    events = [Invocation(0, 1, Kind.PUT, "/a", 0.0, "x")]  # never completed
    once = Record("/a", "x", Version(5, 0))
    assert completeness.check(events, {"/a": once}).ok
    assert completeness.check(events, {}).ok
    twice = Record("/a", "x", Version(6, 1))
    assert completeness.check(events, {"/a": twice}).duplicated


def test_invented_and_failed_values_are_caught() -> None:
    events: list[Event] = [
        Invocation(0, 1, Kind.CPUT, "/a", 0.0, "x", expected_version_id=3),
        Completion(0, 1.0, Status.FAIL, error=UNEXPECTED_VERSION_ID),
    ]
    result = completeness.check(
        events, {"/a": Record("/a", "x", Version(5, 0)), "/b": Record("/b", "y", Version(6, 0))}
    )
    assert len(result.invented) == 2, result.report()
    assert "its put failed" in result.invented[0] and "no put wrote it" in result.invented[1]


def test_a_superseded_value_left_final_is_a_lost_write() -> None:
    events: list[Event] = [
        Invocation(0, 1, Kind.PUT, "/a", 0.0, "x"),
        Completion(0, 1.0, Status.OK, version=Version(5, 0)),
        Invocation(1, 1, Kind.PUT, "/a", 2.0, "y"),
        Completion(1, 3.0, Status.OK, version=Version(6, 1)),
    ]
    assert completeness.check(events, {"/a": Record("/a", "y", Version(6, 1))}).ok
    stale = completeness.check(events, {"/a": Record("/a", "x", Version(5, 0))})
    assert len(stale.lost) == 2, stale.report()  # superseded, and one modification short


def test_deleted_keys_are_checked_for_invention_only() -> None:
    events: list[Event] = [
        Invocation(0, 1, Kind.PUT, "/a", 0.0, "x"),
        Completion(0, 1.0, Status.OK, version=Version(5, 0)),
        Invocation(1, 2, Kind.DELETE, "/a", 2.0),  # indeterminate
    ]
    assert completeness.check(events, {}).ok
    assert not completeness.check(events, {"/a": Record("/a", "q", Version(5, 0))}).ok


# ------------------------------------------------------------------ the recorder


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class Raising:
    """A client whose every call raises the given exception."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def call(*args: object, **kwargs: object) -> Any:
            raise self.error

        return call


@pytest.mark.parametrize(
    ("error", "status", "name"),
    [
        (qs.KeyNotFound("/a"), Status.FAIL, KEY_NOT_FOUND),
        (qs.UnexpectedVersionId("/a", 3), Status.FAIL, UNEXPECTED_VERSION_ID),
        (qs.InvalidRequest("bad"), Status.FAIL, "INVALID_REQUEST"),
        (qs.ServiceUnavailable("gave up"), Status.INFO, None),
        (qs.QuorumStoreError("request failed with INTERNAL"), Status.INFO, None),
        (TimeoutError(), Status.INFO, None),
    ],
)
def test_our_client_errors_map_to_fail_or_info(
    error: Exception, status: Status, name: str | None
) -> None:
    recorder = Recorder()
    done = OurClient(recorder, 3, Raising(error)).put("/a", "x", 3)  # type: ignore[arg-type]
    assert done.status == status
    if name is not None:
        assert done.error == name
    (invocation, completion) = recorder.events
    assert invocation == Invocation(0, 3, Kind.CPUT, "/a", invocation.time, "x", 3)
    assert completion is done and completion.time >= invocation.time


@pytest.mark.parametrize(
    ("error", "status", "name"),
    [
        (oxia.ex.KeyNotFound(), Status.FAIL, KEY_NOT_FOUND),
        (oxia.ex.UnexpectedVersionId(), Status.FAIL, UNEXPECTED_VERSION_ID),
        (
            FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; x"),
            Status.FAIL,
            NOT_SENT,
        ),
        (FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed"), Status.INFO, None),
        (FakeRpcError(grpc.StatusCode.UNKNOWN, "node is not leader"), Status.INFO, None),
        (oxia.ex.OxiaException("unknown status"), Status.INFO, None),
    ],
)
def test_official_client_errors_map_to_fail_or_info(
    error: Exception, status: Status, name: str | None
) -> None:
    recorder = Recorder()
    done = OfficialClient(recorder, 4, Raising(error)).get("/a")
    assert done.status == status
    if name is not None:
        assert done.error == name


class FakeOfficial:
    """The official client's return shapes: tuples, and versions with accessor methods."""

    class V:
        def __init__(self, version_id: int, modifications: int) -> None:
            self._v, self._m = version_id, modifications

        def version_id(self) -> int:
            return self._v

        def modifications_count(self) -> int:
            return self._m

    def put(self, key: str, value: str, expected_version_id: int | None = None) -> Any:
        return key, self.V(7, 2)

    def get(self, key: str) -> Any:
        return key, b"\xff\xfe", self.V(7, 2)

    def delete(self, key: str) -> bool:
        return False

    def range_scan(self, start: str, end: str) -> Any:
        return iter([("/a", b"x", self.V(7, 2)), ("/b", b"y", self.V(8, 0))])


def test_official_client_results_are_recorded() -> None:
    recorder = Recorder()
    client = OfficialClient(recorder, 4, FakeOfficial())
    assert client.put("/a", "x").version == Version(7, 2)
    record = client.get("/a").record
    assert record is not None and record.value.encode("utf-8", "surrogateescape") == b"\xff\xfe"
    assert client.delete("/a").existed is False
    scanned = client.range_scan("/", "")
    assert scanned.records == (Record("/a", "x", Version(7, 2)), Record("/b", "y", Version(8, 0)))
    assert [op.status for op in operations(recorder.events)] == [Status.OK] * 4
