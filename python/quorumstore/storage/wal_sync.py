"""The WAL's group commit off its owning thread: a `SyncTicket` carries duplicates of the
descriptors to fdatasync, so the owner keeps appending (and may roll or close segments)
while a worker thread syncs what was appended before the ticket."""

from __future__ import annotations

import os
import time

from quorumstore.protocol.types import LogPosition


class SyncTicket:
    """One group commit in flight: `run` does the fdatasyncs (on any thread)."""

    def __init__(self, head: LogPosition, fds: list[int], path: str) -> None:
        self.head = head
        self.path = path
        self.error: OSError | None = None
        #: How long `run`'s fdatasyncs took (0 until it ran).
        self.seconds = 0.0
        self._fds = fds

    def run(self) -> None:
        started = time.perf_counter()
        try:
            for fd in self._fds:
                os.fdatasync(fd)
        except OSError as exc:
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - started
            for fd in self._fds:
                os.close(fd)
            self._fds = []
