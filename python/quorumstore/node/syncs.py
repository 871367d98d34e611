"""Where a node's WAL group commits (fsyncs) run: on its io threads, or on the event loop.

A follower's fsync is on the path of every write: the leader waits for the follower's
Ack, which goes out once the fsync has ended. Handing the fsync to a thread and its end
back to the loop takes two thread hand-offs, and on a busy machine each may wait for a
core, adding more than the fsync itself (docs/performance.md). So a follower's
fsync runs on the loop itself, which it blocks meanwhile, while that is cheap and
harms nobody:

- the node's last fsync took under `INLINE_SYNC_MAX_S`: a slow disk must not stall the
  loop, which serves every shard of the node and its clients;
- no other fsync of the node is running on a thread: those would wait for the loop to
  see them end.

A leader's fsync always goes to a thread. It runs while the followers do theirs, and the
leader's loop has work meanwhile (it prepares the entry's apply), which an fsync on the
loop would hold up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor

from quorumstore.storage.wal_sync import SyncTicket

#: A node runs a follower's fsync on its loop only while its last fsync took less.
INLINE_SYNC_MAX_S = 0.005


class SyncRunner:
    """Runs the group commits of every shard of one node (see the module doc)."""

    def __init__(self, executor: Executor, inline_max_s: float = INLINE_SYNC_MAX_S) -> None:
        self._executor = executor
        self._inline_max_s = inline_max_s
        self._on_threads = 0
        self._last_seconds = 0.0

    def run(self, ticket: SyncTicket, follower: bool, done: Callable[[], None]) -> None:
        """Runs `ticket`, then calls `done` on the loop: before returning when the fsync ran
        on the loop, on a later turn when it ran on a thread."""
        if follower and not self._on_threads and self._last_seconds < self._inline_max_s:
            ticket.run()
            self._last_seconds = ticket.seconds
            done()
            return
        self._on_threads += 1

        def ended(_: object) -> None:
            self._on_threads -= 1
            self._last_seconds = ticket.seconds
            done()

        asyncio.get_running_loop().run_in_executor(self._executor, ticket.run).add_done_callback(
            ended
        )
