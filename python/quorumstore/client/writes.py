"""Write batches: many puts, deletes and range deletes as one replicated write.

One batch is one Oxia `WriteRequest`, which the shard's leader turns into one WAL
entry: its puts are applied first, then its deletes, then its range deletes, and
each gets its own status. Operations of one batch come from concurrent callers, so
that order among them is as good as any other.

Batches travel on a `WriteStream` per shard and lane (`write_streams.py`).

Exactly-once: each batch carries a client id and a serial -- as the `qs-client-id` and
`qs-serial` metadata of Oxia's `WriteStream` (the serial of its first request; each
later one carries the next), as fields of the data service's `WriteArrow`. The shard
remembers, per client id, the latest serial it applied and that write's results; a
retry of the same batch after a failover (same id, same serial) is answered with the
original results instead of being applied again. Because the shard keeps only the
*latest* serial per id, two batches of one id must never be in flight at once (the
later one could land first and turn the earlier one into an ignored "old" serial): the
client id is therefore the client's random id plus the batch's lane (`batcher.py`), and
a lane carries one batch at a time. Each lane of each shard counts its serials up by
one, so that its batches follow each other on one stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NamedTuple

from quorumstore.client.calls import ShardCaller
from quorumstore.client.errors import (
    InvalidRequest,
    KeyNotFound,
    QuorumStoreError,
    SessionDoesNotExist,
    UnexpectedVersionId,
)
from quorumstore.client.types import PutResult, version_from_proto
from quorumstore.client.write_streams import WriteStreams
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import quorumstore_data_pb2 as data_pb

PUT, DELETE, DELETE_RANGE = 0, 1, 2
#: Per-operation framing counted on top of keys and values when sizing a batch.
OP_OVERHEAD_BYTES = 16


class PutOptions(NamedTuple):
    """What a put may carry beyond key, value, condition and partition key."""

    #: The session of an ephemeral put, and the identity it is recorded with.
    session_id: int | None = None
    client_identity: str | None = None
    #: A sequence-key put's deltas; its key is the prefix the server extends.
    sequence_key_deltas: tuple[int, ...] = ()
    #: (index name, secondary key) pairs.
    secondary_indexes: tuple[tuple[str, str], ...] = ()


class WriteOp(NamedTuple):
    """One queued write. PUT: (key, value, expected_version_id, partition_key, options);
    DELETE: (key, None, expected_version_id, None); DELETE_RANGE: (start, end, None, None).

    A put's future gets its Version, or a PutResult when it had sequence-key deltas."""

    kind: int
    key: str
    value: bytes | str | None
    expected_version_id: int | None
    partition_key: str | None
    future: asyncio.Future[object]
    options: PutOptions | None = None


def _add_options(put: pb.PutRequest, options: PutOptions) -> None:
    if options.session_id is not None:
        put.session_id = options.session_id
    if options.client_identity is not None:
        put.client_identity = options.client_identity
    put.sequence_key_delta.extend(options.sequence_key_deltas)
    for name, secondary_key in options.secondary_indexes:
        put.secondary_indexes.add(index_name=name, secondary_key=secondary_key)


def build_request(shard: int, ops: Sequence[WriteOp]) -> pb.WriteRequest:
    request = pb.WriteRequest(shard=shard)
    puts, deletes, ranges = request.puts, request.deletes, request.delete_ranges
    for op in ops:
        if op.kind == PUT:
            put = puts.add(key=op.key, value=op.value)
            if op.expected_version_id is not None:
                put.expected_version_id = op.expected_version_id
            if op.partition_key is not None:
                put.partition_key = op.partition_key
            if op.options is not None:
                _add_options(put, op.options)
        elif op.kind == DELETE:
            delete = deletes.add(key=op.key)
            if op.expected_version_id is not None:
                delete.expected_version_id = op.expected_version_id
        else:
            ranges.add(start_inclusive=op.key, end_exclusive=op.value)
    return request


def _status_error(op: WriteOp, status: int) -> QuorumStoreError:
    if status == pb.UNEXPECTED_VERSION_ID:
        return UnexpectedVersionId(op.key, op.expected_version_id)
    if status == pb.KEY_NOT_FOUND:
        return KeyNotFound(op.key)
    if status == pb.SESSION_DOES_NOT_EXIST:
        return SessionDoesNotExist(op.key)
    return QuorumStoreError(f"write of {op.key!r} returned unknown status {status}")


def resolve(ops: Sequence[WriteOp], response: pb.WriteResponse) -> None:
    """Hands each operation its outcome: a Version, True/False for deletes, None."""
    by_kind: tuple[list[WriteOp], list[WriteOp], list[WriteOp]] = ([], [], [])
    for op in ops:
        by_kind[op.kind].append(op)
    puts, deletes, ranges = by_kind
    if (len(response.puts), len(response.deletes), len(response.delete_ranges)) != (
        len(puts),
        len(deletes),
        len(ranges),
    ):
        fail(
            ops,
            QuorumStoreError(
                "the server answered a write batch with the wrong number of results "
                "(a server bug: the operations' outcome is unknown)"
            ),
        )
        return
    for op, result in zip(puts, response.puts):
        if op.future.done():
            continue
        if result.status == pb.OK:
            version = version_from_proto(result.version)
            if op.options is not None and op.options.sequence_key_deltas:
                op.future.set_result(PutResult(result.key, version))
            else:
                op.future.set_result(version)
        else:
            op.future.set_exception(_status_error(op, result.status))
    for op, result in zip(deletes, response.deletes):
        if op.future.done():
            continue
        if result.status == pb.OK or result.status == pb.KEY_NOT_FOUND:
            op.future.set_result(result.status == pb.OK)
        else:
            op.future.set_exception(_status_error(op, result.status))
    for op, result in zip(ranges, response.delete_ranges):
        if op.future.done():
            continue
        if result.status == pb.OK:
            op.future.set_result(None)
        else:
            op.future.set_exception(_status_error(op, result.status))


def fail(ops: Sequence[WriteOp], error: BaseException) -> None:
    for op in ops:
        if not op.future.done():
            op.future.set_exception(error)


class WriteSender:
    """Sends write batches with retries, under exactly-once serials when enabled."""

    def __init__(
        self, caller: ShardCaller, namespace: str, client_id: str, exactly_once: bool
    ) -> None:
        self._caller = caller
        self._namespace = namespace
        self._client_id = client_id
        self._exactly_once = exactly_once
        #: Per (shard, lane): its next serial. A lane's serials must increase; counting
        #: them up by one lets its batches share one stream (see `write_streams.py`).
        self._serials: dict[tuple[int, int], int] = {}
        self._streams = WriteStreams(caller.channels)

    def _origin(self, shard: int, lane: int) -> tuple[str, int] | None:
        """A fresh (client id, serial) for the next batch of `lane` on `shard`; None
        without exactly-once."""
        if not self._exactly_once:
            return None
        serial = self._serials.get((shard, lane), 0)
        self._serials[shard, lane] = serial + 1
        return f"{self._client_id}/{lane}", serial

    async def write(self, shard: int, request: pb.WriteRequest, lane: int) -> pb.WriteResponse:
        """One Oxia write batch, retried with the same serial until it is applied once."""
        origin = self._origin(shard, lane)
        streams = self._streams

        async def attempt(leader: str, timeout_s: float) -> pb.WriteResponse:
            return await streams.write(shard, lane, leader, request, origin, timeout_s)

        return await self._caller.call(shard, attempt, "write batch")

    async def write_arrow(self, shard: int, rows: bytes, lane: int) -> data_pb.WriteArrowResponse:
        """Arrow IPC rows (key, value) as one entry via the data service, exactly-once."""
        origin = self._origin(shard, lane)
        request = data_pb.WriteArrowRequest(namespace=self._namespace, shard=shard, ipc=rows)
        if origin is not None:
            request.client_id, request.serial = origin
            request.has_serial = True
        stub = self._caller.channels.data_stub

        async def attempt(leader: str, timeout_s: float) -> data_pb.WriteArrowResponse:
            return await stub(leader).WriteArrow(request, timeout=timeout_s)

        return await self._caller.call(shard, attempt, "put_many batch")

    async def send(self, shard: int, ops: list[WriteOp], lane: int) -> None:
        """A batch of queued operations; resolves every operation's future."""
        try:
            response = await self.write(shard, build_request(shard, ops), lane)
        except InvalidRequest as e:
            if len(ops) == 1:
                fail(ops, e)
                return
            # The server checks a whole batch before writing any of it, so one bad
            # operation refused them all: send each alone to fail only the bad one.
            for op in ops:
                await self.send(shard, [op], lane)
            return
        except Exception as e:  # noqa: BLE001 - every failure goes to the waiting callers
            fail(ops, e)
            return
        resolve(ops, response)

    def close(self) -> None:
        """Ends the open write streams (the client is closing)."""
        self._streams.close()
