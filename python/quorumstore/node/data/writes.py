"""`WriteArrow`: a whole Arrow table, inline or staged, as ONE replicated entry.

The entry may delete a key range first (an atomic replace) and is applied exactly once
per (client id, serial). A write too large for one entry (`max_entry_bytes`) is
replicated as pieces that one small entry then publishes (`storage/staging.py`), so it
too appears at once. The replicated pieces of a large write that was never published
(its caller died) are dropped by the leader with a replicated entry.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import pyarrow as pa

from quorumstore.event_loops import abandon
from quorumstore.node.data.errors import Refused, invalid
from quorumstore.node.data.hosts import DataNode, DataShardHost, find_host
from quorumstore.node.data.staging import STAGING_TTL_S, StagedRows
from quorumstore.node.data.validation import check_range, check_rows, read_rows
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.protocol.replica import NotLeaderError
from quorumstore.storage import staging
from quorumstore.storage.kv import KvReader
from quorumstore.storage.reads import byte_bounded_runs
from quorumstore.storage.results import EntryResult
from quorumstore.storage.serials import decode_serial_record, serial_key
from quorumstore.storage.write_batch import (
    InvalidBatchError,
    Staging,
    StagingKind,
    WriteBatchBuilder,
    decode_batch,
    encode_batch,
    puts_batch,
)
from quorumstore.wire.metadata import MAX_CLIENT_ID_BYTES, ClientSerial

#: Largest write batch one WriteArrow may turn into an entry. The entry travels in one
#: gRPC message to each follower (256 MiB limit, see wire/channels.py).
MAX_ENTRY_BYTES = 192 * 1024 * 1024
#: A larger write is replicated in pieces of about this many bytes, then published.
PIECE_BYTES = 32 * 1024 * 1024
_PIECES_IN_FLIGHT = 4
#: Largest part of one write for one shard. Every replica applies it in one KV write,
#: holding it in memory many times over (bench/publish_bench.py measures it).
MAX_WRITE_BYTES = 512 * 1024 * 1024


def write_payload(
    rows: pa.Table,
    timestamp_ms: int,
    origin: ClientSerial | None,
    replace: tuple[str, str] | None,
) -> bytes:
    """ONE write batch: delete `replace` (if given), then put every row."""
    keys = rows.column("key").combine_chunks()
    values = rows.column("value").combine_chunks()
    puts = puts_batch(keys, values, timestamp_ms, origin)
    if replace is None:
        return puts
    builder = WriteBatchBuilder()
    builder.add_delete_range(*replace)
    deletes = decode_batch(builder.build(timestamp_ms, origin))
    return encode_batch(pa.concat_batches([deletes, decode_batch(puts)]))


def _already_applied(kv: KvReader, origin: ClientSerial) -> bool:
    raw = kv.get(serial_key(origin.client_id))
    return raw is not None and origin.serial <= decode_serial_record(raw)[0]


class ArrowWrites:
    """The Arrow writes of one node's shards; file and encoding work runs through `run`
    (the service's threads)."""

    def __init__(
        self,
        node: DataNode,
        staged: StagedRows,
        run: Callable[..., Awaitable[Any]],
        max_entry_bytes: int,
        piece_bytes: int,
    ) -> None:
        self._node = node
        self._staged = staged
        self._run = run
        self._max_entry_bytes = max_entry_bytes
        self._piece_bytes = piece_bytes

    async def write(self, request: pb.WriteArrowRequest) -> pb.WriteArrowResponse:
        ns, shard = request.namespace, request.shard
        origin = None
        if request.has_serial:
            if not request.client_id or request.serial < 0:
                raise invalid("an exactly-once write needs a client_id and a serial >= 0")
            if len(request.client_id.encode()) > MAX_CLIENT_ID_BYTES:
                raise invalid(
                    f"client_id is {len(request.client_id.encode())} bytes; at most "
                    f"{MAX_CLIENT_ID_BYTES} are kept per client"
                )
            origin = ClientSerial(request.client_id, request.serial)
        replace = None
        if request.replace:
            replace = (request.replace_min_inclusive, request.replace_max_exclusive)
            check_range(*replace, "the replaced range")
        which = request.WhichOneof("rows")
        if which is None:
            raise invalid("the request carries no rows (ipc or staged)")
        host = find_host(self._node, ns, shard, leader=True)
        if origin is not None and _already_applied(host.kv, origin):
            # Published before: its staged rows may be gone already, so answer without them.
            if which == "staged" and not request.validate_only:
                await self._run(self._staged.drop, request.staged.write_id, ns, shard)
            return pb.WriteArrowResponse(offset=-1, duplicate=True)
        if which == "ipc":
            rows = read_rows(request.ipc, "the rows")
        else:
            rows = await self._run(
                self._staged.rows, request.staged.write_id, ns, shard, request.staged.parts
            )
        check_rows(rows, request.unique_keys)
        payload = None
        if rows.nbytes <= self._max_entry_bytes:
            try:
                payload = await self._run(write_payload, rows, self._node.now_ms(), origin, replace)
            except InvalidBatchError as e:
                raise invalid(f"shard {ns}/{shard}: {e}") from None
            if len(payload) > self._max_entry_bytes:
                payload = None
        if payload is None and rows.nbytes > MAX_WRITE_BYTES:
            raise invalid(
                f"the write holds {rows.nbytes} bytes for shard {ns}/{shard}, above the limit "
                f"of {MAX_WRITE_BYTES} bytes for one shard's part of one write; split it "
                "into smaller writes, or spread its keys over more shards"
            )
        row_count = rows.num_rows
        if request.validate_only:
            return pb.WriteArrowResponse(offset=-1, rows=row_count)
        try:
            if payload is None:
                write_id = request.staged.write_id if which == "staged" else uuid.uuid4().hex
                payload = await self._replicate_pieces(host, write_id, rows, origin, replace)
            # The payload or the replicated pieces carry the rows now: the apply of a
            # large part must not find them held here as well.
            del rows
            result = await host.write(payload)
        except NotLeaderError as e:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION, f"shard {ns}/{shard}: {e}", e.leader_hint
            ) from None
        if result.invalid is not None:  # proposed despite the checks above: a bug
            raise invalid(f"shard {ns}/{shard}: {result.invalid}")
        if result.refused is not None:  # ABORTED: not retried here, unlike "not leader"
            raise Refused(
                grpc.StatusCode.ABORTED,
                f"shard {ns}/{shard}: {result.refused}; the write must be retried as a whole",
            )
        if which == "staged":
            await self._run(self._staged.drop, request.staged.write_id, ns, shard)
        return pb.WriteArrowResponse(
            offset=result.offset, duplicate=result.duplicate, rows=row_count
        )

    async def _replicate_pieces(
        self,
        host: DataShardHost,
        write_id: str,
        rows: pa.Table,
        origin: ClientSerial | None,
        replace: tuple[str, str] | None,
    ) -> bytes:
        """Replicates `rows` as pieces of about `piece_bytes` and returns the payload of
        the ONE entry that publishes them (storage/staging.py): a reader sees none of the
        rows, then all of them."""
        stage = f"{write_id}/{uuid.uuid4().hex}"
        keys = rows.column("key").combine_chunks()
        values = rows.column("value").combine_chunks()
        bounds = list(byte_bounded_runs(keys, values, self._piece_bytes))
        in_flight: list[asyncio.Future[EntryResult]] = []
        try:
            for number, (start, stop) in enumerate(bounds):
                payload = await self._run(
                    puts_batch,
                    keys[start:stop],
                    values[start:stop],
                    self._node.now_ms(),
                    None,
                    Staging(StagingKind.PIECE, stage, number),
                )
                if len(in_flight) == _PIECES_IN_FLIGHT:
                    await in_flight.pop(0)
                in_flight.append(asyncio.ensure_future(host.write(payload)))
            for piece in in_flight:
                await piece
        finally:
            for piece in in_flight:
                abandon(piece)
        publish = WriteBatchBuilder()
        if replace is not None:
            publish.add_delete_range(*replace)
        return publish.build(
            self._node.now_ms(), origin, Staging(StagingKind.PUBLISH, stage, len(bounds))
        )

    async def discard_replicated(self, write_ids: Sequence[str] | None) -> None:
        """Has every shard led here drop the pieces it keeps of `write_ids` (None: of
        writes whose pieces are older than STAGING_TTL_S). A shard whose leadership
        moves on meanwhile is left to its next leader's sweep."""
        for host in self._node.led_hosts():
            if write_ids is None:
                horizon = self._node.now_ms() - STAGING_TTL_S * 1000
                found = staging.writes_staged_before(host.kv, horizon)
            else:
                found = [w for w in write_ids if staging.has_pieces(host.kv, w)]
            for write_id in found:
                discard = Staging(StagingKind.DISCARD, write_id)
                try:
                    await host.write(WriteBatchBuilder().build(self._node.now_ms(), None, discard))
                except NotLeaderError:
                    break
