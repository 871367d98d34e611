"""Spark test setup shared by tests/spark.

Spark's Python workers must run this interpreter (the one with quorumstore installed),
not whatever `python3` is first on PATH, so the variables are set before any session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from cluster_harness import free_ports

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture
def free_port_block() -> Callable[[int], int]:
    """`free_port_block(n)`: the first of n consecutive free loopback ports; hosted nodes
    listen on base_port + i, so tests need blocks, not single ports (see `free_ports`)."""
    return free_ports
