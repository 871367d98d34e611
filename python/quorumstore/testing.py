"""A `quorumstore standalone` server in a child process, for tests, benchmarks and examples.

with standalone_server(tmp_dir, shards=4, fsync=False) as address:
    client = quorumstore.Client(address)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_LISTENING = re.compile(r"quorumstore standalone listening on (\S+:\d+)")
#: Lines of the server's output kept for the error when it does not start.
_KEPT_LINES = 50


@contextlib.contextmanager
def standalone_server(
    data_dir: Path, shards: int = 1, *, fsync: bool = True, startup_timeout_s: float = 90.0
) -> Iterator[str]:
    """Runs `quorumstore standalone` on a free port with its data in `data_dir`; yields its
    client address and stops it (SIGTERM to its process group) on exit."""
    argv = [sys.executable, "-m", "quorumstore.cli", "standalone", "--shards", str(shards),
            "--port", "0", "--data-dir", str(data_dir)]  # fmt: skip
    if not fsync:
        argv.append("--no-fsync")
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    output: deque[str] = deque(maxlen=_KEPT_LINES)
    found: list[str] = []
    listening = threading.Event()

    def drain() -> None:  # reads the output to the end, so the server never blocks on it
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            match = _LISTENING.search(line)
            if match and not found:
                found.append(match.group(1))
                listening.set()
        listening.set()  # the server exited

    threading.Thread(target=drain, name="standalone-output", daemon=True).start()
    try:
        if not listening.wait(startup_timeout_s) or not found:
            raise RuntimeError(
                f"quorumstore standalone in {data_dir} printed no address within "
                f"{startup_timeout_s:g} s; its output:\n{''.join(output)}"
            )
        yield found[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


#: Constructions of the official client tried before giving up (see official_oxia_client).
OFFICIAL_CLIENT_ATTEMPTS = 3


def official_oxia_client(address: str, **options: Any) -> Any:
    """The official `oxia` client (unmodified) for `address`, retried on its start-up race.

    oxia 0.2.1's ServiceDiscovery starts its assignments thread before it creates the
    barrier that thread signals. When the first shard map arrives first (seen under CPU
    load), the thread dies with AttributeError and the constructor gives up after 30 s
    with RuntimeError. No server can prevent it; a new client gets a new chance.
    """
    import oxia  # a test dependency, not one of quorumstore's

    for _ in range(OFFICIAL_CLIENT_ATTEMPTS - 1):
        try:
            return oxia.Client(address, **options)
        except RuntimeError:
            continue
    return oxia.Client(address, **options)
