"""Answers to Read, List and RangeScan from a shard's committed state.

Reads are linearizable: the leader reads its KV only after a read barrier (see
`ShardHost.read_barrier`) proved that it still led after the read arrived.
A streamed answer is cut into responses of at most `max_response_items` items or about
`max_response_bytes` bytes of keys and values, whichever comes first.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from quorumstore.node.oxia.errors import not_leader
from quorumstore.node.oxia.routing import ShardHostApi
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.protocol.replica import NotLeaderError
from quorumstore.storage.reads import KeyComparison, ShardReader
from quorumstore.storage.records import Record

#: A streamed response (Read, List, RangeScan) is cut after this many items ...
DEFAULT_MAX_RESPONSE_ITEMS = 1000
#: ... or once its keys and values add up to this many bytes, whichever comes first.
DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024

_T = TypeVar("_T")


def _chunks(
    items: Iterable[_T], size_of: Callable[[_T], int], max_items: int, max_bytes: int
) -> Iterator[list[_T]]:
    """`items` cut into lists of at most `max_items` and about `max_bytes` each."""
    chunk: list[_T] = []
    size = 0
    for item in items:
        chunk.append(item)
        size += size_of(item)
        if len(chunk) >= max_items or size >= max_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def fill_version(version: pb.Version, record: Record) -> None:
    """Sets `version` (a field of the response, filled in place: no copy) from `record`."""
    version.version_id = record.version_id
    version.modifications_count = record.modifications_count
    version.created_timestamp = record.created_ms
    version.modified_timestamp = record.modified_ms
    if record.session_id is not None:
        version.session_id = record.session_id
    if record.client_identity is not None:
        version.client_identity = record.client_identity


def _record_response(
    key: str, record: Record, include_value: bool, with_key: bool
) -> pb.GetResponse:
    response = pb.GetResponse(status=pb.OK)
    fill_version(response.version, record)
    if include_value:
        response.value = record.value
    if with_key:
        response.key = key
    return response


def _get_response(reader: ShardReader, get: pb.GetRequest) -> pb.GetResponse:
    """One get; like Oxia, a non-EQUAL match names the key it found.

    Through a secondary index, `key` is a secondary key and the answer names both the
    primary key and the secondary key matched.
    """
    comparison = KeyComparison(get.comparison_type)
    if get.HasField("secondary_index_name"):
        by_index = reader.get_by_index(get.secondary_index_name, get.key, comparison)
        if by_index is None:
            return pb.GetResponse(status=pb.KEY_NOT_FOUND)
        primary, secondary, record = by_index
        response = _record_response(primary, record, get.include_value, with_key=True)
        response.secondary_index_key = secondary
        return response
    found = reader.get_with_comparison(get.key, comparison)
    if found is None:
        return pb.GetResponse(status=pb.KEY_NOT_FOUND)
    key, record = found
    return _record_response(key, record, get.include_value, get.comparison_type != pb.EQUAL)


async def _linearizable_reader(host: ShardHostApi, shard: int) -> ShardReader:
    """The leader's committed state once its read barrier has passed; not-leader as Oxia
    says it when the replica was deposed (the client retries at the new leader)."""
    try:
        await host.read_barrier()
    except NotLeaderError as e:
        raise not_leader(shard, e.leader_hint) from e
    return host.reader()


class Reads:
    """The answers of a shard's leader to checked reads, cut into responses."""

    def __init__(self, max_response_items: int, max_response_bytes: int) -> None:
        self._max_items = max_response_items
        self._max_bytes = max_response_bytes

    async def read(
        self, host: ShardHostApi, shard: int, gets: Sequence[pb.GetRequest]
    ) -> AsyncGenerator[pb.ReadResponse, None]:
        reader = await _linearizable_reader(host, shard)
        responses = (_get_response(reader, get) for get in gets)
        for chunk in _chunks(responses, lambda r: len(r.value), self._max_items, self._max_bytes):
            yield pb.ReadResponse(gets=chunk)

    async def list(
        self, host: ShardHostApi, request: pb.ListRequest
    ) -> AsyncGenerator[pb.ListResponse, None]:
        """Keys in [start, end) in hierarchical order; an empty end means unbounded.

        Through a secondary index, the range is over secondary keys and the answer is
        the primary keys, by secondary key.
        """
        reader = await _linearizable_reader(host, request.shard)
        if request.HasField("secondary_index_name"):
            keys = reader.list_by_index(
                request.secondary_index_name, request.start_inclusive, request.end_exclusive
            )
        else:
            keys = reader.list_keys(request.start_inclusive, request.end_exclusive)
        for chunk in _chunks(keys, len, self._max_items, self._max_bytes):
            yield pb.ListResponse(keys=chunk)

    async def range_scan(
        self, host: ShardHostApi, request: pb.RangeScanRequest
    ) -> AsyncGenerator[pb.RangeScanResponse, None]:
        """Records in [start, end) in hierarchical order; an empty end means unbounded.

        Through a secondary index, as for List, and each record also names the
        secondary key it was found by (`secondary_index_key`, which Oxia sets on
        index gets), so that a client can merge the shards' streams in index order.
        """
        reader = await _linearizable_reader(host, request.shard)
        records: Iterator[pb.GetResponse]
        if request.HasField("secondary_index_name"):
            records = self._by_index(reader, request)
        else:
            records = (
                _record_response(k, r, include_value=True, with_key=True)
                for k, r in reader.range_scan(request.start_inclusive, request.end_exclusive)
            )
        for chunk in _chunks(
            records, lambda r: len(r.key) + len(r.value), self._max_items, self._max_bytes
        ):
            yield pb.RangeScanResponse(records=chunk)

    @staticmethod
    def _by_index(reader: ShardReader, request: pb.RangeScanRequest) -> Iterator[pb.GetResponse]:
        found = reader.range_scan_by_index(
            request.secondary_index_name, request.start_inclusive, request.end_exclusive
        )
        for primary, secondary, record in found:
            response = _record_response(primary, record, include_value=True, with_key=True)
            response.secondary_index_key = secondary
            yield response
