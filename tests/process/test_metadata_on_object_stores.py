"""Coordinator metadata on an object store, each test on an S3-compatible one (a moto
server on loopback) and on Azure Blob Storage's emulator (Azurite): one coordinator per
location, held with a renewed lease and fenced by conditional writes.

A second coordinator is refused while the first renews its lease, takes the location
at once when the first released it, and after a lease period when the first stopped
renewing (killed, paused); a coordinator whose location was taken saves nothing more
and its process exits saying why.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster_harness import (
    AZURE_CONTAINER,
    S3_BUCKET,
    azure_environment,
    free_ports,
    s3_environment,
    start_cli,
)
from quorumstore.coordinator.metadata_store import MetadataError, MetadataStore, MetadataTaken
from quorumstore.coordinator.object_lease import ConditionFailed, conditional_object
from quorumstore.protocol.coordinator import initial_metadata

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

LEASE_S = 1.0
NODES = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


@pytest.fixture(params=["s3", "abfs"])
def url(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A new metadata location on each store, in this process's and its children's
    environment."""
    name = f"{request.node.originalname}-{time.time_ns()}/metadata.pb"
    if request.param == "s3":
        s3_environment(monkeypatch, request.getfixturevalue("moto_endpoint")[0])
        return f"s3://{S3_BUCKET}/{name}"
    azure_environment(monkeypatch, request.getfixturevalue("azurite_connection"))
    return f"abfs://{AZURE_CONTAINER}/{name}"


@pytest.fixture
def stores(url: str) -> Iterator[Callable[[], MetadataStore]]:
    """Makes stores on `url` with a short lease, releasing each at the end."""
    made: list[MetadataStore] = []

    def make() -> MetadataStore:
        made.append(MetadataStore(url, lease_s=LEASE_S))
        return made[-1]

    yield make
    for store in made:
        store.release()


def _renewing(store: MetadataStore) -> Callable[[], None]:
    """Renews `store`'s lease in a thread, as a running coordinator does; returns a stop."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(LEASE_S / 4):
            store.renew()

    thread = threading.Thread(target=renew, daemon=True)
    thread.start()

    def stopped() -> None:
        stop.set()
        thread.join()

    return stopped


def test_a_second_coordinator_is_refused_while_the_first_renews(
    stores: Callable[[], MetadataStore],
) -> None:
    first, second = stores(), stores()
    first.hold()
    stop = _renewing(first)
    try:
        started = time.monotonic()
        with pytest.raises(MetadataError, match=r"in use by another coordinator \(pid \d+ on "):
            second.hold()
        assert time.monotonic() - started < LEASE_S + 1
        second.release()  # as a coordinator's stop after a refused start does
        with pytest.raises(MetadataError, match="in use by another coordinator"):
            stores().hold()  # the first's lease was not released by the refused one
    finally:
        stop()


def test_a_released_location_is_taken_at_once(stores: Callable[[], MetadataStore]) -> None:
    first, second = stores(), stores()
    first.hold()
    first.release()
    started = time.monotonic()
    second.hold()
    assert time.monotonic() - started < LEASE_S / 2


def test_a_location_not_renewed_for_a_lease_is_taken_and_its_old_holder_fenced(
    stores: Callable[[], MetadataStore],
) -> None:
    """The first holder stops renewing (a pause, or kill -9): after a lease period the
    second takes over; the first, back, can neither renew nor save over the second's
    record, which stays as the second saved it."""
    first, second = stores(), stores()
    first.hold()
    assert first.load() is None
    first.save(initial_metadata(NODES, {"default": 1}, 3))

    started = time.monotonic()
    second.hold()
    assert LEASE_S <= time.monotonic() - started < LEASE_S + 2
    theirs = second.load()
    assert theirs is not None and theirs.version == 0
    newer = initial_metadata(NODES, {"default": 2}, 3)
    second.save(newer)

    with pytest.raises(MetadataTaken, match="another coordinator took"):
        first.renew()
    with pytest.raises(MetadataTaken, match="another coordinator took"):
        first.save(initial_metadata(NODES, {"default": 3}, 3))
    kept = stores().load()
    assert kept is not None and len(kept.shards) == 2


def test_a_store_that_read_nothing_never_overwrites_a_saved_record(
    stores: Callable[[], MetadataStore],
) -> None:
    first, blind = stores(), stores()
    first.save(initial_metadata(NODES, {"default": 1}, 3))
    with pytest.raises(MetadataTaken):
        blind.save(initial_metadata(NODES, {"default": 2}, 3))
    kept = stores().load()
    assert kept is not None and len(kept.shards) == 1


def test_a_put_sent_again_after_its_answer_was_lost_is_its_own_version(url: str) -> None:
    """The retry of a put that landed fails its own condition; the object holding the
    same data is taken as this writer's version, other data as a conflict."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    record = conditional_object(fs, path + ".probe")
    assert record is not None
    record.write(b"first")
    seen = record.etag
    record.write(b"second")
    record.etag = seen  # as if the answer to the second put had been lost
    record.write(b"second")
    assert record.read() == b"second"
    record.etag = seen
    with pytest.raises(ConditionFailed):
        record.write(b"third")


def test_a_paused_coordinator_process_is_deposed_and_exits_saying_so(
    url: str, tmp_path: Path
) -> None:
    """Two `quorumstore coordinator` processes on one S3 metadata URL: the second is
    refused while the first runs; with the first paused (SIGSTOP) past its lease, a
    third takes the location, and the first, resumed, exits naming what happened."""
    ports = free_ports(3)
    args = (
        "coordinator",
        "--nodes",
        ",".join(NODES),
        "--internal-addresses",
        ",".join(f"127.0.0.1:{p}" for p in range(ports, ports + 3)),
        "--metadata",
        url,
        "--replication-factor",
        "3",
    )
    first = start_cli(*args)
    processes = [first]
    try:
        _wait_for_line(first, "coordinator admin on")
        second = start_cli(*args)
        processes.append(second)
        out, _ = second.communicate(timeout=60)
        assert second.returncode != 0
        assert "in use by another coordinator" in out, out

        first.send_signal(signal.SIGSTOP)
        third = start_cli(*args)
        processes.append(third)
        _wait_for_line(third, "coordinator admin on", timeout_s=60)
        first.send_signal(signal.SIGCONT)
        out, _ = first.communicate(timeout=60)
        assert first.returncode != 0
        assert "another coordinator took the coordinator metadata" in out, out
        assert third.poll() is None
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()


def _wait_for_line(process: subprocess.Popen[str], text: str, timeout_s: float = 30) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"no {text!r} within {timeout_s} s:\n{''.join(seen)}")
