"""The README's first command runs the main job (`quorumstore demo`); this runs that
command as installed and checks what it prints: a hosted cluster, a streaming aggregation
whose state lives in quorumstore, and the committed counts read back as a DataFrame."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

#: The installed entry point, next to the interpreter running the tests.
QUORUMSTORE = Path(sys.executable).with_name("quorumstore")

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_main_job_counts_events_per_user(
    tmp_path: Path, free_port_block: Callable[[int], int]
) -> None:
    run = subprocess.run(
        [
            str(QUORUMSTORE),
            "demo",
            "--base-port",
            str(free_port_block(4)),
            "--work-dir",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "streaming query finished: 3 micro-batches, state kept in quorumstore" in run.stdout
    rows = dict(re.findall(r"^\|(/clicks/\w+)\s*\|(\d+)\s*\|", run.stdout, re.MULTILINE))
    assert rows == {"/clicks/ada": "3", "/clicks/bob": "3", "/clicks/cy": "1", "/clicks/dee": "1"}
