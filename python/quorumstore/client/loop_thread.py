"""An event loop on a daemon thread, and cheap hand-offs to it from other threads.

The blocking `Client` runs its `AsyncClient` here. Its hot path (put, get) crosses
threads twice per operation, so both crossings are kept light:

- in: callers append to an inbox and wake the loop only when no wake-up is pending,
  so a burst of calls from many threads costs one wake-up, not one each;
- out: each caller waits on a plain lock that the loop releases, rather than on a
  `concurrent.futures.Future` and its condition variable.

    >>> runner = LoopThread("doctest")
    >>> async def double(x: int) -> int:
    ...     return 2 * x
    >>> runner.call(double(21))
    42
    >>> runner.stop()
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

from quorumstore import event_loops
from quorumstore.client.errors import ClientClosed

T = TypeVar("T")


class _Waiter(Generic[T]):
    """One caller blocked until the loop settles its future."""

    __slots__ = ("_error", "_lock", "_result")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._result: T | None = None
        self._error: BaseException | None = None

    def settle(self, future: asyncio.Future[T]) -> None:
        if future.cancelled():
            self._error = ClientClosed("the operation was cancelled: the client is closing")
        else:
            self._error = future.exception()
            if self._error is None:
                self._result = future.result()
        self._lock.release()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._lock.release()

    def wait(self) -> T:
        self._lock.acquire()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class LoopThread:
    """A private event loop running on its own daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = event_loops.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._inbox: deque[
            tuple[Callable[..., asyncio.Future[Any]], tuple[object, ...], _Waiter[Any]]
        ] = deque()
        self._wakeup_pending = False
        self.stopped = False

    def _check_caller(self) -> None:
        if self.stopped:
            raise ClientClosed("this client was closed; open a new one")
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "a blocking Client call from its own event loop would deadlock; "
                "use AsyncClient in async code"
            )

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs `coroutine` on the loop and returns its result (or raises its error)."""
        try:
            self._check_caller()
        except BaseException:
            coroutine.close()  # never run: no "was never awaited" warning
            raise
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def submit(self, start: Callable[..., asyncio.Future[T]], *args: object) -> T:
        """Calls `start(*args)` on the loop and waits for the future it returns."""
        self._check_caller()
        waiter: _Waiter[T] = _Waiter()
        self._inbox.append((start, args, waiter))
        if not self._wakeup_pending:
            self._wakeup_pending = True
            self.loop.call_soon_threadsafe(self._drain_inbox)
        return waiter.wait()

    def _drain_inbox(self) -> None:
        # Cleared before draining: a caller that appends after this point either is
        # drained below or sees the flag down and schedules another drain.
        self._wakeup_pending = False
        inbox = self._inbox
        while inbox:
            start, args, waiter = inbox.popleft()
            try:
                start(*args).add_done_callback(waiter.settle)
            except BaseException as e:  # noqa: BLE001 - raised in the calling thread
                waiter.fail(e)

    def stop(self) -> None:
        """Winds the loop down as `asyncio.run` does, then joins the thread.

        Tasks still pending (gRPC's own, say) are cancelled and allowed to finish,
        so that none is destroyed pending, and gRPC gets to deliver the completions
        of the calls they cancelled (`event_loops.cancel_other_tasks`).
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.stop() must not run on the loop's own thread")
        if not self.stopped:
            asyncio.run_coroutine_threadsafe(event_loops.cancel_other_tasks(), self.loop).result()
        self.stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        while self._inbox:
            self._inbox.popleft()[2].fail(ClientClosed("the client was closed"))
