"""Processes forked while a quorumstore client is in use start their programs.

PySpark launches its JVM by forking with a `preexec_fn`; so do other libraries. With
gRPC's fork handlers on, grpcio 1.81+ aborted such children before they could exec
(grpc/grpc#43055): a SparkSession created after a client failed with
JAVA_GATEWAY_EXITED. Importing quorumstore turns those handlers off unless the user
chose otherwise. Each scenario runs in a fresh interpreter, as a user's program would,
since gRPC reads the setting once, when it is first imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
_FORKS = 300

#: Starts a server, keeps a client writing, and forks `_FORKS` children the way
#: PySpark's JVM launch does; prints how many did not run their program.
_SCENARIO = f"""
import pathlib, signal, subprocess, sys, tempfile, threading
from quorumstore import Client
from quorumstore.testing import standalone_server

with tempfile.TemporaryDirectory() as data, standalone_server(
    pathlib.Path(data), fsync=False
) as address, Client(address) as client:
    stop = threading.Event()

    def writes():
        i = 0
        while not stop.is_set():
            client.put(f"key-{{i % 100}}", b"value")
            i += 1

    writer = threading.Thread(target=writes)
    writer.start()
    failed = 0
    try:
        for _ in range({_FORKS}):
            child = subprocess.run(
                ["true"],
                capture_output=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
            )
            failed += child.returncode != 0
    finally:
        stop.set()
        writer.join()
    print("failed", failed)
"""


def _fresh_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    environ["PYTHONPATH"] = str(_REPO / "python")
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**environ, **env},
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_children_forked_while_a_client_writes_all_run_their_program() -> None:
    run = _fresh_python(_SCENARIO)
    assert run.returncode == 0, run.stderr[-3000:]
    # Before quorumstore set gRPC's fork handling, 88 of 400 such children aborted here.
    assert run.stdout.split() == ["failed", "0"], run.stderr[-3000:]


def test_a_users_own_fork_setting_is_kept() -> None:
    code = "import os, quorumstore; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    assert _fresh_python(code).stdout.strip() == "false"
    assert _fresh_python(code, GRPC_ENABLE_FORK_SUPPORT="true").stdout.strip() == "true"


def test_grpc_imported_before_quorumstore_is_warned_about() -> None:
    """Then the setting comes too late: 95 of 300 such children aborted in a probe."""
    warning = "grpc was imported before quorumstore"
    assert warning in _fresh_python("import grpc, quorumstore").stderr
    assert warning not in _fresh_python("import quorumstore, grpc").stderr
    chosen = _fresh_python("import grpc, quorumstore", GRPC_ENABLE_FORK_SUPPORT="false")
    assert warning not in chosen.stderr
