"""Range scans and key listings: one stream per shard, merged in hierarchical order.

Each shard streams its part of [start, end) in Oxia's hierarchical key order; the
client merges the shards' streams on `encode_key`, whose byte order is that order.
A shard stream broken by a leader change is re-opened on the new leader from the
last key already delivered, which is skipped, so nothing is repeated or lost.

Through a secondary index, [start, end) is a range of secondary keys. A shard's
range scan then comes in index order (secondary key, then primary key), and each
record names its secondary key, so the merge and the re-opening work as above on
that order. A listing names primary keys only, so a broken one starts over, and the
merged keys are sorted in hierarchical order, as Oxia's clients return them.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from quorumstore.client.calls import ShardCaller
from quorumstore.client.types import Record, version_from_proto
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto.oxia_client_pb2_grpc import OxiaClientStub
from quorumstore.wire.keys import encode_key, index_order
from quorumstore.wire.metadata import LEADER_ROUTING_METADATA

T = TypeVar("T")

#: Items per chunk handed out by a merged scan.
MERGE_CHUNK = 1024


async def shard_records(
    caller: ShardCaller, shard: int, start: str, end: str, index_name: str | None = None
) -> AsyncIterator[list[pb.GetResponse]]:
    """The shard's records in [start, end) as the server's chunks of GetResponses."""
    sort_key = record_sort_key if index_name is None else index_sort_key
    last: pb.GetResponse | None = None
    #: After a re-opening: the sort key of the last record delivered, to skip through.
    delivered: bytes | None = None

    def open_stream(stub: OxiaClientStub) -> AsyncIterator[pb.RangeScanResponse]:
        nonlocal delivered
        request = pb.RangeScanRequest(shard=shard, start_inclusive=start, end_exclusive=end)
        if index_name is not None:
            request.secondary_index_name = index_name
        if last is not None:
            request.start_inclusive = last.key if index_name is None else last.secondary_index_key
            delivered = sort_key(last)
        return stub.RangeScan(request, metadata=LEADER_ROUTING_METADATA)

    async for message in caller.stream(shard, open_stream, "range scan"):
        records = list(message.records)
        if delivered is not None:
            new = next((i for i, r in enumerate(records) if sort_key(r) > delivered), len(records))
            del records[:new]
            if records:
                delivered = None
        if records:
            last = records[-1]
            yield records


async def shard_keys(
    caller: ShardCaller, shard: int, start: str, end: str, index_name: str | None = None
) -> list[str]:
    """Every key of the shard in [start, end), in hierarchical order (through an index:
    the primary keys of the entries in range, in index order)."""
    keys: list[str] = []

    def open_stream(stub: OxiaClientStub) -> AsyncIterator[pb.ListResponse]:
        request = pb.ListRequest(shard=shard, start_inclusive=start, end_exclusive=end)
        if index_name is not None:
            request.secondary_index_name = index_name
            keys.clear()  # a re-opened index listing starts over
        elif keys:
            request.start_inclusive = keys[-1]
        return stub.List(request, metadata=LEADER_ROUTING_METADATA)

    async for message in caller.stream(shard, open_stream, "list"):
        chunk = list(message.keys)
        if chunk and keys and chunk[0] == keys[-1] and index_name is None:
            del chunk[0]
        keys.extend(chunk)
    return keys


def to_records(chunk: Sequence[pb.GetResponse]) -> list[Record]:
    return [Record(r.key, r.value, version_from_proto(r.version)) for r in chunk]


async def merge_sorted(
    streams: Sequence[AsyncIterator[list[T]]], sort_key: Callable[[T], bytes]
) -> AsyncIterator[list[T]]:
    """Chunks of every stream's items in one order; each stream must already be in it."""
    buffers: list[list[T]] = [[] for _ in streams]
    positions = [0] * len(streams)

    async def refill(i: int) -> bool:
        async for chunk in streams[i]:
            if chunk:
                buffers[i], positions[i] = chunk, 0
                return True
        return False

    try:
        heap = []
        for i in range(len(streams)):
            if await refill(i):
                heap.append((sort_key(buffers[i][0]), i))
        heapq.heapify(heap)
        out: list[T] = []
        while heap:
            _, i = heap[0]
            out.append(buffers[i][positions[i]])
            positions[i] += 1
            if positions[i] < len(buffers[i]) or await refill(i):
                heapq.heapreplace(heap, (sort_key(buffers[i][positions[i]]), i))
            else:
                heapq.heappop(heap)
            if len(out) >= MERGE_CHUNK:
                yield out
                out = []
        if out:
            yield out
    finally:
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]


def record_sort_key(record: pb.GetResponse | Record) -> bytes:
    return encode_key(record.key)


def index_sort_key(record: pb.GetResponse) -> bytes:
    return index_order(record.secondary_index_key, record.key)
