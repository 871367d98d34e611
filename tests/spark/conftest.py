"""Spark test setup shared by tests/spark.

Spark's Python workers must run this interpreter (the one with quorumstore installed),
not whatever `python3` is first on PATH, so the variables are set before any session.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Callable

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def _free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def free_port_block() -> Callable[[int], int]:
    """`count` consecutive free loopback ports -> the first one.

    Hosted nodes listen on base_port + i, so tests need blocks, not single ports; a
    random start keeps concurrent test runs on one machine apart.
    """

    def block(count: int) -> int:
        for _ in range(200):
            base = random.randrange(20000, 32768 - count)  # below the ephemeral range
            if all(_free(base + i) for i in range(count)):
                return base
        raise RuntimeError(f"no {count} consecutive free ports found on 127.0.0.1")

    return block
