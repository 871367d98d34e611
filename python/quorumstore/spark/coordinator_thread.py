"""The coordinator inside the Spark driver: its own asyncio loop in a daemon thread.

The PySpark driver is synchronous (a shell, a script, spark-submit's main), while the
coordinator is an asyncio server. Giving it a loop of its own keeps it serving while
the driver blocks in Spark calls, and confines its engine to one thread: every read of
its state (`call`) runs on that loop, never on the caller's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

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

    @property
    def running(self) -> bool:
        """Whether the loop runs (started, not stopped): `call` answers only then."""
        return self._thread.is_alive()

    def open_registry(self) -> str | None:
        """Starts the loop and serves the node registry; returns its address."""
        if not self._thread.is_alive():
            self._thread.start()
        return self._run(self.server.open_registry())

    def start(self) -> concurrent.futures.Future[None]:
        """Loads or creates the metadata and starts serving, which can wait for the nodes'
        first reports; the future completes then, or with what the server raised."""
        if not self._thread.is_alive():
            self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.server.start(), self._loop)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()
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
