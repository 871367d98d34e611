"""A RocksDB-backed state machine whose process is killed mid-log recovers on restart.

The writer is a child process that applies part of a log and exits without flushing or
closing; the test then reopens its store and applies the whole log again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.state_machine import ShardStateMachine
from state_machine_logs import position_of, random_log, replay

pytestmark = pytest.mark.integration

_KILLED_CHILD = """
import os, sys
sys.path[:0] = sys.argv[4:]
from state_machine_logs import random_log
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.state_machine import ShardStateMachine
log = random_log(int(sys.argv[2]), 30)
ShardStateMachine(RocksKv(sys.argv[1])).apply(log[: int(sys.argv[3])])
os._exit(0)  # no flush, no close: the process just dies
"""


def test_rocks_recovers_from_a_killed_process(tmp_path: Path) -> None:
    seed, applied = 21, 17
    log = random_log(seed, 30)
    digest, clean_results = replay(log)
    paths = [str(Path(__file__).parents[1]), *sys.path]
    subprocess.run(
        [
            sys.executable,
            "-c",
            _KILLED_CHILD,
            str(tmp_path / "db"),
            str(seed),
            str(applied),
            *paths,
        ],
        check=True,
        timeout=120,
    )
    kv = RocksKv(tmp_path / "db")
    sm = ShardStateMachine(kv)
    # Unsynced writes survive a process kill (they are in the OS page cache).
    assert sm.applied_position == position_of(log[applied - 1])
    assert sm.apply(log)[applied:] == clean_results[applied:]
    assert sm.state_digest() == digest
    kv.close()
