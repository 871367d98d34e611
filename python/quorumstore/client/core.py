"""What every operation of `AsyncClient` builds on: its options, connecting and
closing, and finding the shards an operation goes to.

`connect` fetches the shard map (`discovery.py`) and sets up the senders of write
and read batches (`writes.py`, `reads.py`), the retrying shard caller (`calls.py`)
and the sessions of ephemeral records (`sessions.py`); `close` drains and ends them.
The operations themselves are `write_api.py`'s and `read_api.py`'s.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from quorumstore.client.arguments import check_key, check_str
from quorumstore.client.batcher import Batcher, BatchLimits
from quorumstore.client.calls import ShardCaller
from quorumstore.client.discovery import Channels, Directory
from quorumstore.client.errors import ClientClosed
from quorumstore.client.notifications import Subscription
from quorumstore.client.reads import GetOp, ReadSender
from quorumstore.client.sequences import SequenceSubscription
from quorumstore.client.sessions import ShardSessions, check_session_timeout
from quorumstore.client.writes import WriteOp, WriteSender
from quorumstore.wire.metadata import DEFAULT_NAMESPACE
from quorumstore.wire.tls import TlsConfig, TokenSource

_Op = TypeVar("_Op")

#: Oxia clients' default session timeout.
DEFAULT_SESSION_TIMEOUT_MS = 30_000


class ClientCore:
    """An `AsyncClient`'s connection to the cluster (its options are documented there)."""

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        namespace: str = DEFAULT_NAMESPACE,
        linger_ms: float = 0.0,
        max_batch_ops: int = 1000,
        max_batch_bytes: int = 1 << 20,
        max_inflight_batches: int = 4,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 30.0,
        exactly_once: bool = True,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        client_identifier: str | None = None,
        tls: TlsConfig | None = None,
        token: TokenSource | None = None,
    ) -> None:
        numbers = {
            "max_batch_ops": max_batch_ops,
            "max_batch_bytes": max_batch_bytes,
            "max_inflight_batches": max_inflight_batches,
            "request_timeout_s": request_timeout_s,
            "connect_timeout_s": connect_timeout_s,
        }
        for name, number in numbers.items():
            if number <= 0:
                raise ValueError(f"{name} must be positive, got {number}")
        if linger_ms < 0:
            raise ValueError(f"linger_ms must be >= 0, got {linger_ms}")
        check_session_timeout(session_timeout_ms)
        if client_identifier is not None:
            check_key(client_identifier, "client_identifier")
        addresses = address.split(",") if isinstance(address, str) else list(address)
        if not addresses:
            raise ValueError("give at least one node address (host:port) to find the cluster by")
        for one in addresses:
            host, _, port = one.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"an address must be host:port, got {one!r}")
        #: The nodes the client was given to find the cluster through.
        self.addresses = [a.strip() for a in addresses]
        self.namespace = namespace
        #: This instance's identity in exactly-once serials (a random UUID).
        self.client_id = uuid.uuid4().hex
        #: Recorded with this client's ephemeral records.
        self.client_identifier = client_identifier or self.client_id
        self._session_timeout_ms = session_timeout_ms
        self._limits = BatchLimits(
            linger_ms / 1000, max_batch_ops, max_batch_bytes, max_inflight_batches
        )
        self._connect_timeout_s = connect_timeout_s
        self._request_timeout_s = request_timeout_s
        self._exactly_once = exactly_once
        self._tls = tls
        self._token = token
        self._channels: Channels | None = None
        self._directory: Directory | None = None
        self._writer: WriteSender | None = None
        self._reader: ReadSender | None = None
        self._caller: ShardCaller | None = None
        self._sessions: ShardSessions | None = None
        self._write_batchers: dict[int, Batcher[WriteOp]] = {}
        self._read_batchers: dict[int, Batcher[GetOp]] = {}
        self._subscriptions: weakref.WeakSet[Subscription | SequenceSubscription] = (
            weakref.WeakSet()
        )
        self._closed = False

    # ------------------------------------------------------------ lifecycle

    async def connect(self) -> Self:
        """Fetches the shard map; returns once the client can serve operations."""
        if self._closed:
            raise ClientClosed("this client was closed; open a new one")
        if self._directory is not None:
            return self
        channels = Channels(self._tls, self._token)
        directory = Directory(channels, self.addresses, self.namespace)
        try:
            await directory.start(self._connect_timeout_s)
        except BaseException:
            await channels.close()
            raise
        self._channels, self._directory = channels, directory
        self._caller = ShardCaller(directory, channels, self._request_timeout_s)
        self._writer = WriteSender(self._caller, self.namespace, self.client_id, self._exactly_once)
        self._reader = ReadSender(self._caller)
        self._sessions = ShardSessions(
            self._caller, self._session_timeout_ms, self.client_identifier
        )
        return self

    def _shard_batcher(
        self,
        batchers: dict[int, Batcher[_Op]],
        send: Callable[[int, list[_Op], int], Coroutine[Any, Any, None]],
        shard: int,
    ) -> Batcher[_Op]:
        """The shard's batcher of one kind, made on its first operation."""
        batcher = batchers.get(shard)
        if batcher is None:
            batcher = batchers[shard] = Batcher(
                lambda ops, lane: send(shard, ops, lane), self._limits
            )
        return batcher

    async def close(self) -> None:
        """Sends what is queued, waits for in-flight batches, closes the sessions
        (deleting this client's ephemeral records), ends notification and sequence
        subscriptions, and closes the connections."""
        if self._closed:
            return
        self._closed = True
        batchers: list[Batcher[WriteOp] | Batcher[GetOp]] = [
            *self._write_batchers.values(),
            *self._read_batchers.values(),
        ]
        await asyncio.gather(*(b.drain() for b in batchers))
        if self._sessions is not None:
            await self._sessions.close()
        await asyncio.gather(*(s.aclose() for s in list(self._subscriptions)))
        if self._writer is not None:
            self._writer.close()
        if self._directory is not None:
            await self._directory.close()
        if self._channels is not None:
            await self._channels.close()

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _ready(self) -> Directory:
        if self._closed:
            raise ClientClosed("this client was closed; open a new one")
        if self._directory is None:
            raise ClientClosed("this client is not connected: use `async with` or await connect()")
        return self._directory

    def shard_for(self, key: str) -> int:
        """The shard a key (or partition key) routes to under the current map."""
        return self._ready().map.shard_for(key)

    @staticmethod
    def _route(directory: Directory, key: str, partition_key: str | None) -> int:
        """The shard of one key's operation."""
        if partition_key is not None:
            check_str(partition_key, "partition_key")
        return directory.map.shard_for(partition_key or key)

    @staticmethod
    def _shards(directory: Directory, partition_key: str | None) -> list[int]:
        shards = directory.map
        if partition_key is None:
            return shards.shards
        check_str(partition_key, "partition_key")
        return [shards.shard_for(partition_key)]
