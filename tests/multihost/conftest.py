"""Fixtures of the multi-host tier: hosts as network namespaces on one bridge, and a Spark
standalone cluster across them (tests/multihost/netns.py, spark_cluster.py).

The tier skips only where hosts cannot be made at all (not root, no `ip netns`), and
fails instead under CI, which runs as root.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from netns import Hosts, unavailable_reason

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

HOSTS = 3


@pytest.fixture(scope="module", autouse=True)
def _needs_namespaces() -> None:
    """Skips where hosts cannot be made; under CI (root) that is a failure, not a skip."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the multi-host tier cannot run under CI: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """Three hosts shared by a module; each test leaves them healed (see `healed`)."""
    with Hosts(HOSTS) as made:
        yield made


@pytest.fixture(scope="module")
def four_hosts() -> Iterator[Hosts]:
    """Four hosts for a module: three for nodes and a fourth for their coordinator."""
    with Hosts(4) as made:
        yield made


@pytest.fixture
def healed(hosts: Hosts, request: pytest.FixtureRequest) -> Iterator[Hosts]:
    """The module's hosts, with every fault a test injected undone after it."""
    yield hosts
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(hosts.describe())
    hosts.heal_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Keeps each phase's report on the item, so fixtures can tell a failed test."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
