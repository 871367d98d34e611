"""`Client`: the blocking face of `AsyncClient`, for code without an event loop.

The client runs an `AsyncClient` on a private event loop in a daemon thread; each
call hands its operation to that loop and waits for the outcome. Calls from many
threads at once land in the same per-shard batches, which is what makes a
thread pool of callers fast.

    with Client("127.0.0.1:6648") as client:
        client.put("/users/7", b"ada")
        key, value, version = client.get("/users/7")
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

import pyarrow as pa

from quorumstore.client.arrow import PutManyData
from quorumstore.client.async_client import AsyncClient
from quorumstore.client.errors import ClientClosed
from quorumstore.client.types import ComparisonType, Record, Version

T = TypeVar("T")


class Client:
    """A quorumstore client for blocking code; safe to share between threads.

    Takes the same arguments as `AsyncClient` (see there for the options) and
    connects before returning. Close it (or use `with`) to stop its thread.
    """

    def __init__(self, address: str, **options: Any) -> None:
        self._async = AsyncClient(address, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="quorumstore-client", daemon=True
        )
        self._thread.start()
        self._closed = False
        try:
            self._call(self._async.connect())
        except BaseException:
            self._stop_loop()
            raise

    @property
    def client_id(self) -> str:
        """This instance's identity in exactly-once serials."""
        return self._async.client_id

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Sends what is queued, waits for in-flight batches, stops the client's thread."""
        if self._closed:
            return
        try:
            self._call(self._async.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------ hand-off

    def _check_caller(self) -> None:
        if self._closed:
            raise ClientClosed("this client was closed; open a new one")
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "a blocking Client call from its own event loop would deadlock; "
                "use AsyncClient in async code"
            )

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        self._check_caller()
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _submit(self, submit: Callable[..., asyncio.Future[T]], *args: object) -> T:
        """Runs `submit(*args)` on the loop and waits for the future it returns.

        Cheaper than a coroutine per call (no Task): the hot path of put and get.
        """
        self._check_caller()
        outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

        def copy(future: asyncio.Future[T]) -> None:
            if future.cancelled():
                outcome.cancel()
            elif (error := future.exception()) is not None:
                outcome.set_exception(error)
            else:
                outcome.set_result(future.result())

        def start() -> None:
            try:
                submit(*args).add_done_callback(copy)
            except BaseException as e:  # noqa: BLE001 - reported to the calling thread
                outcome.set_exception(e)

        self._loop.call_soon_threadsafe(start)
        return outcome.result()

    # ------------------------------------------------------------ writes

    def put(
        self,
        key: str,
        value: bytes | str,
        *,
        expected_version_id: int | None = None,
        partition_key: str | None = None,
    ) -> Version:
        """Stores `value` under `key`; returns the new version (see AsyncClient.put)."""
        return self._submit(self._async.submit_put, key, value, expected_version_id, partition_key)

    def delete(
        self,
        key: str,
        *,
        expected_version_id: int | None = None,
        partition_key: str | None = None,
    ) -> bool:
        """Deletes the record; True if it existed (see AsyncClient.delete)."""
        return self._call(
            self._async.delete(
                key, expected_version_id=expected_version_id, partition_key=partition_key
            )
        )

    def delete_range(
        self, min_key_inclusive: str, max_key_exclusive: str, *, partition_key: str | None = None
    ) -> None:
        """Deletes every record in [min, max) (see AsyncClient.delete_range)."""
        self._call(
            self._async.delete_range(
                min_key_inclusive, max_key_exclusive, partition_key=partition_key
            )
        )

    def put_many(self, data: PutManyData) -> int:
        """Stores many records from Arrow columns; returns how many (see AsyncClient.put_many)."""
        return self._call(self._async.put_many(data))

    # ------------------------------------------------------------ reads

    def get(
        self,
        key: str,
        *,
        partition_key: str | None = None,
        comparison: ComparisonType = ComparisonType.EQUAL,
        include_value: bool = True,
    ) -> Record:
        """(key, value, version) of `key`; raises KeyNotFound (see AsyncClient.get)."""
        if comparison == ComparisonType.EQUAL:
            return self._submit(self._async.submit_get, key, partition_key, include_value)
        return self._call(
            self._async.get(
                key,
                partition_key=partition_key,
                comparison=comparison,
                include_value=include_value,
            )
        )

    def list(
        self, min_key_inclusive: str, max_key_exclusive: str, *, partition_key: str | None = None
    ) -> list[str]:
        """The keys in [min, max) in hierarchical order."""
        return self._call(
            self._async.list(min_key_inclusive, max_key_exclusive, partition_key=partition_key)
        )

    def range_scan(
        self, min_key_inclusive: str, max_key_exclusive: str, *, partition_key: str | None = None
    ) -> Iterator[Record]:
        """The records in [min, max) in hierarchical order, fetched chunk by chunk."""
        chunks = self._async.range_scan_chunks(
            min_key_inclusive, max_key_exclusive, partition_key=partition_key
        )
        try:
            while True:
                try:
                    chunk = self._call(_next_chunk(chunks))
                except StopAsyncIteration:
                    return
                yield from chunk
        finally:
            if not self._closed:
                self._call(chunks.aclose())  # type: ignore[attr-defined]

    def scan(
        self, min_key_inclusive: str, max_key_exclusive: str, *, partition_key: str | None = None
    ) -> pa.Table:
        """The records in [min, max) as a pyarrow Table (see AsyncClient.scan)."""
        return self._call(
            self._async.scan(min_key_inclusive, max_key_exclusive, partition_key=partition_key)
        )


async def _next_chunk(chunks: AsyncIterator[list[Record]]) -> list[Record]:
    return await anext(chunks)
