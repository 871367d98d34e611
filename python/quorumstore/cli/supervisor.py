"""The process supervisor of `cluster`: starts each child as `python -m quorumstore.cli
...` with its output in a log file, restarts a child that stops after a wait that grows
while it keeps failing, and stops them all with the supervisor, however it ends. The
child side (`follow_parent`) runs first thing in every `quorumstore` process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from quorumstore.backoff import restart_backoff
from quorumstore.cli.errors import CliError

#: Set in the environment of a `cluster` child: the pid of the `cluster` that owns it.
_CLUSTER_PID_ENV = "QUORUMSTORE_CLUSTER_PID"
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class Stopped(Exception):
    """SIGTERM or SIGHUP reached `cluster` while it was starting its children."""


def follow_parent() -> None:
    """In a `cluster` child, first thing: take the stop signals (a child restarted while
    `cluster` blocks them inherits the block) and get SIGTERM when the `cluster` process
    dies, however it dies (kill -9 included), so no node outlives the command that owns
    it. Done here rather than between fork and exec, which is unsafe once `cluster` runs
    gRPC's threads."""
    owner = os.environ.pop(_CLUSTER_PID_ENV, None)
    if owner is None:
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(owner):  # `cluster` died before the line above took effect
        sys.exit(f"quorumstore: `quorumstore cluster` (pid {owner}) is gone; not starting")


def stop_on_signals() -> None:
    """Closing the terminal (SIGHUP) or SIGTERM must stop the children as Ctrl-C does:
    both raise `Stopped` from here on."""
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)


def _raise_stop(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def _spawn(argv: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    # The child gets its own copy of the descriptor; ours is closed once it is spawned.
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "quorumstore.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, _CLUSTER_PID_ENV: str(os.getpid())},
        )


def _log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a child's log, to say why it stopped."""
    try:
        with open(path, errors="replace") as log_file:  # logs append across runs: stream it
            tail = deque((line for line in log_file if line.strip()), maxlen=lines)
    except OSError:
        return ""
    return "\n".join("    " + line.rstrip() for line in tail)


class Child:
    """One process of a `cluster`: a node or the coordinator, restarted when it stops."""

    def __init__(self, argv: list[str], log_file: Path) -> None:
        self.argv = argv
        self.log_file = log_file
        self.process = _spawn(argv, log_file)
        self.started = time.monotonic()
        self.backoff = restart_backoff()
        #: When the stopped process starts again; None while it runs.
        self.restart_at: float | None = None

    @property
    def name(self) -> str:
        return self.log_file.stem

    def check(self, now: float) -> None:
        """Says why the process stopped and when it restarts, or restarts it when due."""
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.process = _spawn(self.argv, self.log_file)
                self.started, self.restart_at = now, None
                print(f"{self.name} restarted (pid {self.process.pid})", flush=True)
            return
        code = self.process.poll()
        if code is None:
            return
        delay = self.backoff.delay_after(now - self.started)
        self.restart_at = now + delay
        how = f"exit status {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
        print(
            f"{self.name} exited ({how}); the end of {self.log_file}:\n{_log_tail(self.log_file)}\n"
            f"  restarting it in {delay:.1f} s from its data directory; the other processes go on",
            flush=True,
        )


def check_started(children: list[Child]) -> None:
    """While the cluster starts, a child that exits is a mistake to report, not to retry."""
    for child in children:
        if child.process.poll() is not None:
            raise CliError(
                f"a cluster process exited early ({' '.join(child.argv)}); the end of "
                f"{child.log_file}:\n" + _log_tail(child.log_file)
            )


def watch(children: list[Child]) -> None:
    """Until a stop signal: restarts each child that stops, after a wait that grows while
    it keeps failing. Meanwhile the cluster serves without it, as it does with any node
    down. The stop signals wait for this loop, so none lands mid-restart."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    while signal.sigtimedwait(_STOP_SIGNALS, 0.2) is None:
        now = time.monotonic()
        for child in children:
            child.check(now)


def stop(children: list[Child]) -> None:
    """SIGTERM to every child still running; SIGKILL to one that takes over 10 s to exit."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.process.kill()
