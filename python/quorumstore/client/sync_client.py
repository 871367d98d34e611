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

import builtins
import inspect
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import pyarrow as pa

from quorumstore.client.arguments import SecondaryIndexes
from quorumstore.client.arrow import PutManyData
from quorumstore.client.async_client import AsyncClient
from quorumstore.client.loop_thread import LoopThread
from quorumstore.client.notifications import Notification, Subscription
from quorumstore.client.sequences import SequenceSubscription
from quorumstore.client.types import ComparisonType, PutResult, Record, Version

T = TypeVar("T")
S = TypeVar("S", Subscription, SequenceSubscription)

#: AsyncClient's keyword options, which Client passes on.
_OPTIONS = frozenset(inspect.signature(AsyncClient).parameters) - {"address"}


class Client:
    """A quorumstore client for blocking code; safe to share between threads.

    Takes the same arguments as `AsyncClient` (see there for the options) and
    connects before returning. Close it (or use `with`) to stop its thread.
    """

    def __init__(self, address: str | Sequence[str], **options: Any) -> None:
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise TypeError(
                f"Client() got unknown option(s) {', '.join(unknown)}; "
                f"the options are {', '.join(sorted(_OPTIONS))}"
            )
        self._async = AsyncClient(address, **options)
        self._runner = LoopThread("quorumstore-client")
        try:
            self._runner.call(self._async.connect())
        except BaseException:
            self._runner.stop()
            raise

    @property
    def client_id(self) -> str:
        """This instance's identity in exactly-once serials."""
        return self._async.client_id

    @property
    def client_identifier(self) -> str:
        """Recorded with this client's ephemeral records."""
        return self._async.client_identifier

    @property
    def closed(self) -> bool:
        return self._runner.stopped

    def shard_for(self, key: str) -> int:
        """The shard a key (or partition key) routes to under the current map."""
        return self._runner.call(_shard_for(self._async, key))

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Sends what is queued, waits for in-flight batches, stops the client's thread."""
        if self._runner.stopped:
            return
        try:
            self._runner.call(self._async.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._runner.call(coroutine)

    # ------------------------------------------------------------ writes

    def put(
        self,
        key: str,
        value: bytes | str,
        *,
        expected_version_id: int | None = None,
        partition_key: str | None = None,
        ephemeral: bool = False,
        secondary_indexes: SecondaryIndexes | None = None,
    ) -> Version:
        """Stores `value` under `key`; returns the new version (see AsyncClient.put)."""
        if not ephemeral and not secondary_indexes:
            return self._runner.submit(
                self._async.submit_put, key, value, expected_version_id, partition_key
            )
        return self._call(
            self._async.put(
                key,
                value,
                expected_version_id=expected_version_id,
                partition_key=partition_key,
                ephemeral=ephemeral,
                secondary_indexes=secondary_indexes,
            )
        )

    def put_sequence(
        self,
        prefix_key: str,
        value: bytes | str,
        *,
        partition_key: str,
        sequence_keys_deltas: Sequence[int] = (1,),
        ephemeral: bool = False,
        secondary_indexes: SecondaryIndexes | None = None,
    ) -> PutResult:
        """Stores `value` under the next key of a sequence; returns (key, version)
        (see AsyncClient.put_sequence)."""
        return self._call(
            self._async.put_sequence(
                prefix_key,
                value,
                partition_key=partition_key,
                sequence_keys_deltas=sequence_keys_deltas,
                ephemeral=ephemeral,
                secondary_indexes=secondary_indexes,
            )
        )

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
        use_index: str | None = None,
    ) -> Record:
        """(key, value, version) of `key`; raises KeyNotFound (see AsyncClient.get)."""
        if comparison == ComparisonType.EQUAL and use_index is None:
            return self._runner.submit(self._async.submit_get, key, partition_key, include_value)
        return self._call(
            self._async.get(
                key,
                partition_key=partition_key,
                comparison=comparison,
                include_value=include_value,
                use_index=use_index,
            )
        )

    def list(
        self,
        min_key_inclusive: str,
        max_key_exclusive: str,
        *,
        partition_key: str | None = None,
        use_index: str | None = None,
    ) -> builtins.list[str]:
        """The keys in [min, max) in hierarchical order (see AsyncClient.list)."""
        return self._call(
            self._async.list(
                min_key_inclusive,
                max_key_exclusive,
                partition_key=partition_key,
                use_index=use_index,
            )
        )

    def range_scan(
        self,
        min_key_inclusive: str,
        max_key_exclusive: str,
        *,
        partition_key: str | None = None,
        use_index: str | None = None,
    ) -> Iterator[Record]:
        """The records in [min, max), fetched chunk by chunk (see AsyncClient.range_scan)."""
        chunks = self._async.range_scan_chunks(
            min_key_inclusive, max_key_exclusive, partition_key=partition_key, use_index=use_index
        )
        try:
            while True:
                try:
                    chunk = self._call(_next_chunk(chunks))
                except StopAsyncIteration:
                    return
                yield from chunk
        finally:
            if not self.closed:
                self._call(chunks.aclose())  # type: ignore[attr-defined]

    def notifications(
        self,
        shard: int | None = None,
        *,
        start_offset_exclusive: int | Mapping[int, int] | None = None,
    ) -> Notifications:
        """Follows the changes of one shard or all shards (see AsyncClient.notifications).

        Returns once every shard's stream has started: every change committed after
        that is delivered. `with client.notifications() as changes: for n in changes:`.
        """

        async def subscribe() -> Subscription:
            subscription = self._async.notifications(
                shard, start_offset_exclusive=start_offset_exclusive
            )
            try:
                return await subscription.wait_ready()
            except BaseException:
                await subscription.aclose()
                raise

        return Notifications(self, self._call(subscribe()))

    def sequence_updates(self, prefix_key: str, *, partition_key: str) -> SequenceUpdates:
        """Follows a sequence's highest key (see AsyncClient.sequence_updates).

        `with client.sequence_updates("/q", partition_key="q") as keys: for key in keys:`.
        """

        async def subscribe() -> SequenceSubscription:
            return self._async.sequence_updates(prefix_key, partition_key=partition_key)

        return SequenceUpdates(self, self._call(subscribe()))

    def scan(
        self,
        min_key_inclusive: str,
        max_key_exclusive: str,
        *,
        partition_key: str | None = None,
        use_index: str | None = None,
    ) -> pa.Table:
        """The records in [min, max) as a pyarrow Table (see AsyncClient.scan)."""
        return self._call(
            self._async.scan(
                min_key_inclusive,
                max_key_exclusive,
                partition_key=partition_key,
                use_index=use_index,
            )
        )


class _BlockingSubscription(Generic[S]):
    """A subscription of the client's loop, iterated from blocking code; close it."""

    def __init__(self, client: Client, subscription: S) -> None:
        self._client = client
        self._subscription: S = subscription

    def __iter__(self) -> Self:
        return self

    def close(self) -> None:
        if not self._client.closed:
            self._client._call(self._subscription.aclose())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Notifications(_BlockingSubscription[Subscription]):
    """A blocking iterator of `Notification`s (see AsyncClient.notifications); close it."""

    def __init__(self, client: Client, subscription: Subscription) -> None:
        super().__init__(client, subscription)
        self._pending: deque[Notification] = deque()

    @property
    def offsets(self) -> dict[int, int | None]:
        """Per shard, the last offset delivered: resume with `start_offset_exclusive=`."""
        return dict(self._subscription.offsets)

    def __next__(self) -> Notification:
        if not self._pending:
            try:
                self._pending.extend(self._client._call(self._subscription.next_chunk()))
            except StopAsyncIteration:
                raise StopIteration from None
        return self._pending.popleft()


class SequenceUpdates(_BlockingSubscription[SequenceSubscription]):
    """A blocking iterator of a sequence's highest key (see AsyncClient.sequence_updates);
    close it."""

    def __next__(self) -> str:
        try:
            return self._client._call(_next_key(self._subscription))
        except StopAsyncIteration:
            raise StopIteration from None


async def _next_key(subscription: SequenceSubscription) -> str:
    return await anext(subscription)


async def _shard_for(client: AsyncClient, key: str) -> int:
    return client.shard_for(key)


async def _next_chunk(chunks: AsyncIterator[list[Record]]) -> list[Record]:
    return await anext(chunks)
