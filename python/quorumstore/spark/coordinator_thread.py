"""The coordinator inside the Spark driver: its own asyncio loop in a daemon thread.

The PySpark driver is synchronous (a shell, a script, spark-submit's main), while the
coordinator is an asyncio server. Giving it a loop of its own keeps it serving while
the driver blocks in Spark calls, and confines its engine to one thread: every read of
its state (`call`) runs on that loop, never on the caller's thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

from quorumstore import event_loops
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig

T = TypeVar("T")

_STOP_TIMEOUT_S = 10.0


class CoordinatorThread:
    """Runs a `CoordinatorServer` on a private event loop until `stop()`."""

    def __init__(self, config: CoordinatorServerConfig):
        self.server = CoordinatorServer(config)
        self._loop = event_loops.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="quorumstore-coordinator", daemon=True
        )

    def start(self) -> None:
        """Loads or creates the metadata and starts serving; raises what the server raised."""
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result()
        except BaseException:
            self.stop()
            raise

    def call(self, fn: Callable[[CoordinatorServer], T], timeout_s: float = 10.0) -> T:
        """`fn(server)` evaluated on the coordinator's loop (its state is not thread-safe)."""

        async def run() -> T:
            return fn(self.server)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s)

    def stop(self) -> None:
        """Stops the server, settles its remaining tasks and ends the loop; idempotent."""
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(_STOP_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_STOP_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()

    async def _shutdown(self) -> None:
        await self.server.stop()
        await event_loops.cancel_other_tasks()
