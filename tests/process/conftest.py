"""Fixtures of the process tier: clusters, loads and standalone servers of real processes.

The processes themselves are started and driven by tests/cluster_harness.py; the fixtures
here hand them to tests and kill them at teardown, printing the tail of each process's log
when the test failed.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster_harness import (
    STANDALONE_SHARDS,
    WRITERS,
    WRITES_PER_SECOND,
    LocalCluster,
    WriteLoad,
    azurite_blob,
    free_ports,
    moto_s3,
)
from quorumstore.testing import standalone_server

# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """An S3-compatible server on loopback; see `cluster_harness.moto_s3`."""
    with moto_s3() as server:
        yield server


@pytest.fixture(scope="session")
def azurite_connection(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azure Blob Storage's emulator on loopback, one per session (adlfs keeps a
    filesystem per connection settings); see `cluster_harness.azurite_blob`. Skipped
    where `azurite-blob` is not installed (scripts/test.sh installs it), except in CI."""
    if shutil.which("azurite-blob") is None and not os.environ.get("CI"):
        pytest.skip("azurite-blob is not installed (npm install -g azurite@3.35.0)")
    with azurite_blob(tmp_path_factory.mktemp("azurite")) as connection:
        yield connection


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remembers each phase's report on the item, so fixtures can tell whether the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `quorumstore standalone` with STANDALONE_SHARDS shards for the test module;
    yields its client address."""
    data_dir = tmp_path_factory.mktemp("standalone")
    with standalone_server(data_dir / "data", STANDALONE_SHARDS) as address:
        yield address


@pytest.fixture
def prefix() -> str:
    """A top-level key prefix of this test's own."""
    return f"/t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., LocalCluster]]:
    """A factory of `LocalCluster`s, started unless `start=False` (the test prepares its
    data directories first, then starts it); every process is killed at teardown.

    If the test failed, the tail of each process's log is printed (shown by pytest
    with the failure).
    """
    clusters: list[LocalCluster] = []

    def make(start: bool = True, **kwargs: object) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster{len(clusters)}", **kwargs)  # type: ignore[arg-type]
        clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    try:
        yield make
    finally:
        failed = getattr(request.node, "report_call", None)
        for cluster in clusters:
            if failed is None or failed.failed:
                print(f"\n===== process logs of {cluster.root} =====\n{cluster.log_tails()}")
            cluster.close()


@pytest.fixture
def write_load() -> Iterator[Callable[..., WriteLoad]]:
    """A factory of started `WriteLoad`s on a cluster; any still running are stopped at teardown."""
    loads: list[WriteLoad] = []

    def start(
        cluster: LocalCluster, clients: int = WRITERS, rate: float = WRITES_PER_SECOND
    ) -> WriteLoad:
        load = WriteLoad(cluster, clients, rate)
        loads.append(load)
        load.start()
        return load

    yield start
    for load in loads:
        load.stop_nowait()


@pytest.fixture
def port_block() -> Callable[[int], int]:
    """`port_block(n)`: the first of n consecutive free loopback ports (see `free_ports`)."""
    return free_ports


# ------------------------------------------------------------------ measurements

_MEASUREMENTS: list[str] = []


@pytest.fixture
def measure() -> Callable[[str], None]:
    """`measure(line)`: prints a measurement now (seen with -s) and in the terminal summary."""

    def record(line: str) -> None:
        print(line, flush=True)
        _MEASUREMENTS.append(line)

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _MEASUREMENTS:
        terminalreporter.write_sep("-", "quorumstore process-fault measurements")
        for line in _MEASUREMENTS:
            terminalreporter.write_line(line)
