"""Recording clients: each call is logged as an invocation and a completion.

A `Recorder` collects the events of many worker threads under one lock, with times
from one monotonic clock. Each worker wraps the client it uses in a recording
client with a process id of its own (`OurClient` for `quorumstore.Client`,
`OfficialClient` for the official `oxia` client; `OurAsyncClient` records an
asyncio task's calls of a `quorumstore.AsyncClient`), so that a process does one
operation at a time, as the checker assumes.

An exception is mapped to fail only when it says that the operation definitely did
not take effect (key not found, unexpected version id, a request the server
refused as invalid or unsupported); everything else (timeouts, an unavailable
cluster, a connection that broke, an unknown status) is info: the operation may
have taken effect, or may still.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from quorumstore.client import (
    AsyncClient,
    InvalidRequest,
    KeyNotFound,
    NamespaceNotFound,
    NotSupported,
    SessionDoesNotExist,
    UnexpectedVersionId,
)
from quorumstore.client import Client as QuorumStoreClient
from quorumstore.verification.history import (
    KEY_NOT_FOUND,
    UNEXPECTED_VERSION_ID,
    Completion,
    Event,
    Invocation,
    Kind,
    Record,
    Status,
    Version,
    dump,
)


class Recorder:
    """The events of a run, appended by any number of threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._next_id = 0

    def invoke(
        self,
        process: int,
        kind: Kind,
        key: str,
        *,
        value: str | None = None,
        expected_version_id: int | None = None,
        end_key: str | None = None,
    ) -> int:
        """Logs the start of an operation; returns its id for `complete`."""
        with self._lock:
            op_id = self._next_id
            self._next_id += 1
            self._events.append(
                Invocation(
                    op_id, process, kind, key, self._clock(), value, expected_version_id, end_key
                )
            )
        return op_id

    def complete(self, op_id: int, status: Status, **result: Any) -> Completion:
        """Logs the end of an operation (see `Completion` for the result fields)."""
        with self._lock:
            completion = Completion(op_id, self._clock(), status, **result)
            self._events.append(completion)
        return completion

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def dump(self, path: Path) -> None:
        dump(self.events, path)


def text(value: bytes | str | None) -> str:
    """A value as the history keeps it (bytes that are not UTF-8 survive the round trip)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else value.decode("utf-8", "surrogateescape")


def _raised(recorder: Recorder, op_id: int, error: Exception, definite: str | None) -> Completion:
    """Records an operation that raised: fail under `definite` (the error's name when it
    means the operation did not take effect), else info."""
    if definite is not None:
        return recorder.complete(op_id, Status.FAIL, error=definite)
    return recorder.complete(op_id, Status.INFO, error=f"{type(error).__name__}: {error}")


class _RecordingClient(abc.ABC):
    """Logs each call of one worker; subclasses say how their client is called and what
    its exceptions mean."""

    def __init__(self, recorder: Recorder, process: int) -> None:
        self.recorder = recorder
        self.process = process

    @abc.abstractmethod
    def _definite_error(self, error: Exception) -> str | None:
        """The error's name if it means the operation did not take effect, else None."""
        ...

    def _record(
        self, call: Callable[[], dict[str, Any]], kind: Kind, key: str, **args: Any
    ) -> Completion:
        op_id = self.recorder.invoke(self.process, kind, key, **args)
        try:
            result = call()
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to record
            return _raised(self.recorder, op_id, e, self._definite_error(e))
        return self.recorder.complete(op_id, Status.OK, **result)

    def put(self, key: str, value: str, expected_version_id: int | None = None) -> Completion:
        kind = Kind.PUT if expected_version_id is None else Kind.CPUT
        return self._record(
            lambda: {"version": self._put(key, value, expected_version_id)},
            kind,
            key,
            value=value,
            expected_version_id=expected_version_id,
        )

    def get(self, key: str) -> Completion:
        return self._record(lambda: {"record": self._get(key)}, Kind.GET, key)

    def delete(self, key: str) -> Completion:
        return self._record(lambda: {"existed": self._delete(key)}, Kind.DELETE, key)

    def range_scan(self, start: str, end: str) -> Completion:
        return self._record(
            lambda: {"records": tuple(self._scan(start, end))}, Kind.SCAN, start, end_key=end
        )

    @abc.abstractmethod
    def _put(self, key: str, value: str, expected_version_id: int | None) -> Version: ...

    @abc.abstractmethod
    def _get(self, key: str) -> Record: ...

    @abc.abstractmethod
    def _delete(self, key: str) -> bool: ...

    @abc.abstractmethod
    def _scan(self, start: str, end: str) -> Iterable[Record]: ...


_OUR_DEFINITE: dict[type[Exception], str] = {
    KeyNotFound: KEY_NOT_FOUND,
    UnexpectedVersionId: UNEXPECTED_VERSION_ID,
    InvalidRequest: "INVALID_REQUEST",
    NotSupported: "NOT_SUPPORTED",
    NamespaceNotFound: "NAMESPACE_NOT_FOUND",
    SessionDoesNotExist: "SESSION_NOT_FOUND",
}


def _our_definite(error: Exception) -> str | None:
    """The history's name for a quorumstore client error that means "not done"."""
    return next((n for t, n in _OUR_DEFINITE.items() if isinstance(error, t)), None)


class OurClient(_RecordingClient):
    """Records the calls of a `quorumstore.Client` (shareable between workers).

    ServiceUnavailable (the retries ran out), ClientClosed and other errors are info.
    """

    def __init__(self, recorder: Recorder, process: int, client: QuorumStoreClient) -> None:
        super().__init__(recorder, process)
        self.client = client

    def _definite_error(self, error: Exception) -> str | None:
        return _our_definite(error)

    def _put(self, key: str, value: str, expected_version_id: int | None) -> Version:
        v = self.client.put(key, value, expected_version_id=expected_version_id)
        return Version(v.version_id, v.modifications_count)

    def _get(self, key: str) -> Record:
        found = self.client.get(key)
        v = found.version
        return Record(found.key, text(found.value), Version(v.version_id, v.modifications_count))

    def _delete(self, key: str) -> bool:
        return self.client.delete(key)

    def _scan(self, start: str, end: str) -> Iterable[Record]:
        for key, value, v in self.client.range_scan(start, end):
            yield Record(key, text(value), Version(v.version_id, v.modifications_count))


#: An official client's request failed before it was sent (its error name in the history).
NOT_SENT = "NOT_SENT"
#: What gRPC says when no connection to the target could be made, so nothing was sent.
_NOT_CONNECTED = "failed to connect to all addresses"


class OfficialClient(_RecordingClient):
    """Records the calls of the official `oxia` client (`oxia.Client`, 0.2.1).

    That client does not retry: a gRPC error (a node down, not leader, a broken
    connection) reaches the caller and is info, as is an unknown status, except when
    gRPC could not connect at all: then the request was never sent.
    """

    def __init__(self, recorder: Recorder, process: int, client: Any) -> None:
        import oxia.ex  # a test dependency, not one of quorumstore's

        super().__init__(recorder, process)
        self.client = client
        self._definite: dict[type[Exception], str] = {
            oxia.ex.KeyNotFound: KEY_NOT_FOUND,
            oxia.ex.UnexpectedVersionId: UNEXPECTED_VERSION_ID,
            oxia.ex.InvalidOptions: "INVALID_OPTIONS",
            oxia.ex.SessionNotFound: "SESSION_NOT_FOUND",
        }

    def _definite_error(self, error: Exception) -> str | None:
        if (
            isinstance(error, grpc.RpcError)
            and error.code() == grpc.StatusCode.UNAVAILABLE
            and _NOT_CONNECTED in (error.details() or "")
        ):
            return NOT_SENT
        return next((n for t, n in self._definite.items() if isinstance(error, t)), None)

    def _put(self, key: str, value: str, expected_version_id: int | None) -> Version:
        _, v = self.client.put(key, value, expected_version_id=expected_version_id)
        return Version(v.version_id(), v.modifications_count())

    def _get(self, key: str) -> Record:
        found, value, v = self.client.get(key)
        return Record(found, text(value), Version(v.version_id(), v.modifications_count()))

    def _delete(self, key: str) -> bool:
        return bool(self.client.delete(key))

    def _scan(self, start: str, end: str) -> Iterable[Record]:
        for key, value, v in self.client.range_scan(start, end):
            yield Record(key, text(value), Version(v.version_id(), v.modifications_count()))


class OurAsyncClient:
    """Records the calls of a `quorumstore.AsyncClient` made by one asyncio task (a
    process of the history); the client may be shared by many such tasks."""

    def __init__(self, recorder: Recorder, process: int, client: AsyncClient) -> None:
        self.recorder = recorder
        self.process = process
        self.client = client

    async def _record(
        self, call: Callable[[], Awaitable[dict[str, Any]]], kind: Kind, key: str, **args: Any
    ) -> Completion:
        op_id = self.recorder.invoke(self.process, kind, key, **args)
        try:
            result = await call()
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to record
            return _raised(self.recorder, op_id, e, _our_definite(e))
        return self.recorder.complete(op_id, Status.OK, **result)

    async def put(self, key: str, value: str, expected_version_id: int | None = None) -> Completion:
        async def call() -> dict[str, Any]:
            v = await self.client.put(key, value, expected_version_id=expected_version_id)
            return {"version": Version(v.version_id, v.modifications_count)}

        kind = Kind.PUT if expected_version_id is None else Kind.CPUT
        return await self._record(
            call, kind, key, value=value, expected_version_id=expected_version_id
        )

    async def get(self, key: str) -> Completion:
        async def call() -> dict[str, Any]:
            found = await self.client.get(key)
            v = found.version
            version = Version(v.version_id, v.modifications_count)
            return {"record": Record(found.key, text(found.value), version)}

        return await self._record(call, Kind.GET, key)
