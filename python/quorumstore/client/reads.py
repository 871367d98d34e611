"""Read batches: many gets of one shard in one `Read` call.

Oxia's `Read` takes a list of gets and streams their results back in order, in as
many messages as the server likes; reads are idempotent, so a failed batch is
simply sent again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NamedTuple

from quorumstore.client.calls import ShardCaller
from quorumstore.client.errors import InvalidRequest, KeyNotFound, QuorumStoreError
from quorumstore.client.types import Record, version_from_proto
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.wire.metadata import LEADER_ROUTING_METADATA


class IndexMatch(NamedTuple):
    """A get through a secondary index: the secondary key matched, and the record."""

    secondary_key: str
    record: Record


class GetOp(NamedTuple):
    """One queued get; through `index_name`, its future gets an IndexMatch."""

    key: str
    comparison: int
    include_value: bool
    future: asyncio.Future[Record] | asyncio.Future[IndexMatch]
    index_name: str | None = None


def _outcome(op: GetOp, result: pb.GetResponse) -> Record | IndexMatch | QuorumStoreError:
    if result.status == pb.KEY_NOT_FOUND:
        return KeyNotFound(op.key)
    if result.status != pb.OK:
        return QuorumStoreError(f"get of {op.key!r} returned unknown status {result.status}")
    key = result.key if result.HasField("key") else op.key
    value = result.value if op.include_value else None
    record = Record(key, value, version_from_proto(result.version))
    if op.index_name is not None:
        return IndexMatch(result.secondary_index_key, record)
    return record


class ReadSender:
    def __init__(self, caller: ShardCaller) -> None:
        self._caller = caller

    async def read(
        self, shard: int, ops: Sequence[GetOp]
    ) -> list[Record | IndexMatch | QuorumStoreError]:
        """The outcome of each get, in order (a Record or IndexMatch, or the error to raise)."""
        request = pb.ReadRequest(shard=shard)
        add = request.gets.add
        for op in ops:
            get = add(key=op.key, include_value=op.include_value, comparison_type=op.comparison)
            if op.index_name is not None:
                get.secondary_index_name = op.index_name

        stub = self._caller.channels.stub

        async def attempt(leader: str, timeout_s: float) -> list[pb.GetResponse]:
            results: list[pb.GetResponse] = []
            call = stub(leader).Read(request, timeout=timeout_s, metadata=LEADER_ROUTING_METADATA)
            async for message in call:
                results.extend(message.gets)
            return results

        results = await self._caller.call(shard, attempt, "read batch")
        if len(results) != len(ops):
            raise QuorumStoreError(
                f"the server answered {len(ops)} gets on shard {shard} with {len(results)} results"
            )
        return [_outcome(op, result) for op, result in zip(ops, results)]

    async def send(self, shard: int, ops: list[GetOp], lane: int) -> None:
        """A batch of queued gets; resolves every get's future."""
        try:
            outcomes = await self.read(shard, ops)
        except InvalidRequest as e:
            if len(ops) == 1:
                _set(ops[0], e)
                return
            # One bad get refuses the whole request: retry each alone.
            for op in ops:
                await self.send(shard, [op], lane)
            return
        except Exception as e:  # noqa: BLE001 - every failure goes to the waiting callers
            for op in ops:
                _set(op, e)
            return
        for op, outcome in zip(ops, outcomes):
            _set(op, outcome)


def _set(op: GetOp, outcome: Record | IndexMatch | BaseException) -> None:
    if op.future.done():
        return
    if isinstance(outcome, BaseException):
        op.future.set_exception(outcome)
    else:
        op.future.set_result(outcome)  # type: ignore[arg-type]
