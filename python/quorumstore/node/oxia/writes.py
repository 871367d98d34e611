"""The write path of the Oxia service: one `WriteRequest` becomes one write batch (one
WAL entry) for the shard's leader, and the batch's per-op results become Oxia's answer.

Concurrent plain writes of a shard share entries (`write_coalescer.py`). Beyond Oxia,
a unary `Write` may be exactly-once (docs/protocol.md, "Exactly-once serials"): its
invocation metadata `qs-client-id` and `qs-serial` put that `ClientSerial` on the
batch, and a retry of the same serial (after a leader failover, say) is not applied
again but answered with the original results. Such a write goes alone.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence

import grpc
import pyarrow as pa

from quorumstore.node.limits import RequestLimits
from quorumstore.node.oxia.errors import RequestError, invalid, not_leader
from quorumstore.node.oxia.plain_puts import PlainPuts
from quorumstore.node.oxia.reads import fill_version
from quorumstore.node.oxia.relay import Relays
from quorumstore.node.oxia.routing import Router, ShardHostApi
from quorumstore.node.oxia.validation import Validator
from quorumstore.node.oxia.write_coalescer import WriteCoalescer
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.protocol.replica import NotLeaderError
from quorumstore.storage.results import EntryResult, Status
from quorumstore.storage.write_batch import WriteBatchBuilder, puts_batch
from quorumstore.wire.metadata import ClientSerial

_STATUS = {
    Status.OK: pb.OK,
    Status.KEY_NOT_FOUND: pb.KEY_NOT_FOUND,
    Status.UNEXPECTED_VERSION_ID: pb.UNEXPECTED_VERSION_ID,
    Status.SESSION_DOES_NOT_EXIST: pb.SESSION_DOES_NOT_EXIST,
}


def write_response(request: pb.WriteRequest, result: EntryResult) -> pb.WriteResponse:
    """Per-op results, which come in batch order (puts, deletes, delete ranges)."""
    results = result.results
    n_puts, n_deletes = len(request.puts), len(request.deletes)
    expected = n_puts + n_deletes + len(request.delete_ranges)
    if len(results) != expected:
        if result.duplicate:
            raise RequestError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this exactly-once serial was already used by an earlier write of the client"
                + (
                    f" with {len(results)} operations, not {expected}"
                    if results
                    else ", and a later serial has completed since: its result is no longer kept"
                ),
            )
        if result.invalid is not None:  # no write batch: proposed below the checks, a bug
            raise invalid(f"the write could not be applied: {result.invalid}")
        raise RuntimeError(
            f"entry {result.offset} returned {len(results)} results for {expected} operations"
        )
    if any(r.status is Status.INVALID_OP for r in results):
        at = next(i for i, r in enumerate(results) if r.status is Status.INVALID_OP)
        field = (
            f"puts[{at}]"
            if at < n_puts
            else f"deletes[{at - n_puts}]"
            if at < n_puts + n_deletes
            else f"delete_ranges[{at - n_puts - n_deletes}]"
        )
        raise invalid(
            f"{field} could not be applied (entry {result.offset} holds an op no replica can "
            "apply); the write's other operations were applied as usual"
        )
    response = pb.WriteResponse(
        deletes=[
            pb.DeleteResponse(status=_STATUS[r.status])
            for r in results[n_puts : n_puts + n_deletes]
        ],
        delete_ranges=[
            pb.DeleteRangeResponse(status=_STATUS[r.status]) for r in results[n_puts + n_deletes :]
        ],
    )
    add_put = response.puts.add
    for r in results[:n_puts]:
        put = add_put(status=_STATUS[r.status])
        if r.version is not None:
            fill_version(put.version, r.version)
        if r.key is not None:
            put.key = r.key
    return response


def _add_request(batch: WriteBatchBuilder, request: pb.WriteRequest) -> None:
    for put in request.puts:
        batch.add_put(
            put.key,
            put.value,
            expected_version_id=put.expected_version_id
            if put.HasField("expected_version_id")
            else None,
            session_id=put.session_id if put.HasField("session_id") else None,
            client_identity=put.client_identity if put.HasField("client_identity") else None,
            partition_key=put.partition_key if put.HasField("partition_key") else None,
            sequence_key_delta=list(put.sequence_key_delta),
            secondary_indexes=[(i.index_name, i.secondary_key) for i in put.secondary_indexes],
        )
    for delete in request.deletes:
        batch.add_delete(
            delete.key,
            delete.expected_version_id if delete.HasField("expected_version_id") else None,
        )
    for delete_range in request.delete_ranges:
        batch.add_delete_range(delete_range.start_inclusive, delete_range.end_exclusive)


async def replicate(host: ShardHostApi, shard: int, payload: bytes) -> EntryResult:
    """Replicates one write batch on the shard's leader here; not-leader as Oxia says it."""
    try:
        return await host.write(payload)
    except NotLeaderError as e:
        raise not_leader(shard, e.leader_hint) from e


class Writes:
    """Checks, routes and replicates the Oxia writes of one node's shards."""

    def __init__(
        self, router: Router, relays: Relays, validator: Validator, limits: RequestLimits
    ) -> None:
        self._router = router
        self._relays = relays
        self._validator = validator
        self._limits = limits
        self._coalescers: weakref.WeakKeyDictionary[
            ShardHostApi, WriteCoalescer[PlainPuts | None]
        ] = weakref.WeakKeyDictionary()

    async def write(
        self,
        request: pb.WriteRequest,
        context: grpc.aio.ServicerContext,
        origin: ClientSerial | None = None,
        previous: asyncio.Future[pb.WriteResponse] | None = None,
    ) -> pb.WriteResponse:
        """One write; a relayed one first waits for `previous` (the stream's write before
        it), so that a stream's writes reach their leaders in request order."""
        self._limits.check_ops(
            len(request.puts) + len(request.deletes) + len(request.delete_ranges)
        )
        shard = request.shard if request.HasField("shard") else None
        target = self._router.route(shard, context)
        plain = self._validator.check_write(request)
        if isinstance(target, str):
            if previous is not None:
                await asyncio.wait([previous])
            return await self._relays.unary(
                target, "Write", request, request.shard, context, origin
            )
        if not (request.puts or request.deletes or request.delete_ranges):
            return pb.WriteResponse()
        if plain is None:
            self._validator.check_sequence_state(target.reader(), request)
        if origin is None:  # merged with the shard's other concurrent writes
            result = await self._coalescer(target, request.shard).write(request, plain)
        else:
            result = await replicate(
                target, request.shard, self._build_batch([request], [plain], origin)
            )
        return write_response(request, result)

    def _build_batch(
        self,
        requests: Sequence[pb.WriteRequest],
        plains: Sequence[PlainPuts | None],
        origin: ClientSerial | None,
    ) -> bytes:
        """One write batch of `requests` in order, each as its puts, then its deletes,
        then its delete ranges; `plains` are their `plain_puts`."""
        now_ms = self._router.directory.now_ms()
        columns = [plain for plain in plains if plain is not None]
        if len(columns) == len(requests):
            return puts_batch(
                pa.concat_arrays([plain.keys for plain in columns]),
                pa.concat_arrays([plain.values for plain in columns]),
                now_ms,
                origin,
            )
        batch = WriteBatchBuilder()
        for request in requests:
            _add_request(batch, request)
        return batch.build(now_ms, origin)

    def _coalescer(self, host: ShardHostApi, shard: int) -> WriteCoalescer[PlainPuts | None]:
        coalescer = self._coalescers.get(host)
        if coalescer is None:

            async def replicate_merged(
                requests: Sequence[pb.WriteRequest], plains: Sequence[PlainPuts | None]
            ) -> EntryResult:
                return await replicate(host, shard, self._build_batch(requests, plains, None))

            coalescer = self._coalescers[host] = WriteCoalescer(replicate_merged)
        return coalescer
