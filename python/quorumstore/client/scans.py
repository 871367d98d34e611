"""Range scans and key listings: one stream per shard, merged in hierarchical order.

Each shard streams its part of [start, end) in Oxia's hierarchical key order; the
client merges the shards' streams on `encode_key`, whose byte order is that order.
A shard stream broken by a leader change is re-opened on the new leader from the
last key already delivered, which is skipped, so nothing is repeated or lost.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from quorumstore.client.calls import ShardCaller
from quorumstore.client.discovery import ROUTING_METADATA
from quorumstore.client.types import Record, version_from_proto
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto.oxia_client_pb2_grpc import OxiaClientStub
from quorumstore.storage.keys import encode_key

T = TypeVar("T")

#: Items per chunk handed out by a merged scan.
MERGE_CHUNK = 1024


async def shard_records(
    caller: ShardCaller, shard: int, start: str, end: str
) -> AsyncIterator[list[pb.GetResponse]]:
    """The shard's records in [start, end) as the server's chunks of GetResponses."""
    last: str | None = None

    def open_stream(stub: OxiaClientStub) -> AsyncIterator[pb.RangeScanResponse]:
        begin = start if last is None else last
        return stub.RangeScan(
            pb.RangeScanRequest(shard=shard, start_inclusive=begin, end_exclusive=end),
            metadata=ROUTING_METADATA,
        )

    async for message in caller.stream(shard, open_stream, "range scan"):
        records = list(message.records)
        if records and records[0].key == last:  # re-opened at the last key delivered
            del records[0]
        if records:
            last = records[-1].key
            yield records


async def shard_keys(caller: ShardCaller, shard: int, start: str, end: str) -> list[str]:
    """Every key of the shard in [start, end), in hierarchical order."""
    keys: list[str] = []

    def open_stream(stub: OxiaClientStub) -> AsyncIterator[pb.ListResponse]:
        begin = start if not keys else keys[-1]
        return stub.List(
            pb.ListRequest(shard=shard, start_inclusive=begin, end_exclusive=end),
            metadata=ROUTING_METADATA,
        )

    async for message in caller.stream(shard, open_stream, "list"):
        chunk = list(message.keys)
        if chunk and keys and chunk[0] == keys[-1]:
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
