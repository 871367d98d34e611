"""The `Replication` service: what a shard's leader sends this node's followers.

It is served on the node's internal port, behind the cluster secret (`wire/auth.py`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Protocol

import grpc

from quorumstore.node import data_format
from quorumstore.node.aborts import abort
from quorumstore.node.control import await_reply
from quorumstore.node.outbox import Outbox
from quorumstore.node.shard_host import ShardHost
from quorumstore.node.snapshot_streams import finished_snapshot_level
from quorumstore.node.transport import NodeTransport
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import Message, ShardKey, TruncateResponse
from quorumstore.protocol.types import LogPosition
from quorumstore.storage.rocks_kv import KvMemory, RocksKv
from quorumstore.storage.snapshot import install_snapshot
from quorumstore.wire import replication as wire

log = logging.getLogger(__name__)

#: Snapshot chunks received but not yet written to the staging KV (backpressure bound).
_SNAPSHOT_CHUNKS_BUFFERED = 4


class ReplicaNode(Protocol):
    """What the service needs of its node (a `Node`)."""

    @property
    def name(self) -> str: ...

    @property
    def hosts(self) -> Mapping[ShardKey, ShardHost]: ...

    @property
    def transport(self) -> NodeTransport: ...

    @property
    def kv_memory(self) -> KvMemory: ...

    def deliver(self, shard: ShardKey, msg: Message) -> None: ...


class SnapshotStager:
    """Writes one snapshot stream's chunks into a fresh KV on a worker thread as they
    arrive, holding at most `_SNAPSHOT_CHUNKS_BUFFERED` of them in memory."""

    def __init__(self, directory: Path, memory: KvMemory) -> None:
        self.directory = directory
        self._memory = memory
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=_SNAPSHOT_CHUNKS_BUFFERED)
        self._staged = asyncio.get_running_loop().run_in_executor(None, self._stage)

    def _stage(self) -> LogPosition:
        kv = RocksKv(self.directory, self._memory)
        try:
            return install_snapshot(kv, iter(self._chunks.get, None))
        finally:
            kv.close()

    @property
    def stopped(self) -> bool:
        """The stager ended before being told the stream ended: it failed."""
        return self._staged.done()

    async def feed(self, data: bytes | None) -> None:
        """Hands one chunk (None: the end) over, waiting while the stager is behind; drops
        it if the stager already stopped (it failed, and `finish` says why)."""
        while not self._staged.done():
            try:
                self._chunks.put_nowait(data)
                return
            except queue.Full:
                await asyncio.sleep(0.005)

    async def finish(self) -> LogPosition:
        """Ends the stream; returns the position the staged chunks name, or raises what
        made staging fail (chunks that are no well-formed snapshot among them)."""
        await self.feed(None)
        return await self._staged

    async def abandon(self) -> None:
        """The stream broke: stops the stager and deletes what it staged once it stopped."""
        await self.feed(None)
        self._staged.add_done_callback(self._discard)

    def _discard(self, staged: asyncio.Future[LogPosition]) -> None:
        if not staged.cancelled() and staged.exception() is not None:
            log.info("staging of a broken snapshot stream stopped: %s", staged.exception())
        shutil.rmtree(self.directory, ignore_errors=True)


class Replication(pb_grpc.ReplicationServicer):
    """Serves a follower's side of replication: Appends in and Acks out, truncations,
    and snapshots streamed in."""

    def __init__(self, node: ReplicaNode):
        self.node = node

    async def _refuse_another_format(self, context: grpc.aio.ServicerContext) -> None:
        """Ends a call whose data is in another format than this node's (see data_format)."""
        theirs = data_format.peer_format(context.invocation_metadata())
        if theirs != data_format.DATA_FORMAT:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                data_format.refusal_message(self.node.name, theirs),
                data_format.REPLICATION_METADATA,
            )

    async def Replicate(
        self, request_iterator: AsyncIterator[pb.Append], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Ack]:
        await self._refuse_another_format(context)
        transport = self.node.transport
        acks: Outbox[pb.Ack] = Outbox(transport.acks_written)
        keys: set[tuple[ShardKey, str]] = set()

        async def read() -> None:
            try:
                async for append in request_iterator:
                    shard = (append.namespace, append.shard)
                    key = (shard, append.leader_name)
                    if transport.inbound.get(key) is not acks:
                        transport.inbound[key] = acks
                        keys.add(key)
                    self.node.deliver(shard, wire.append_from_pb(append))
            finally:
                acks.close()

        reader = asyncio.get_running_loop().create_task(read())
        try:
            async for ack in acks.messages():
                yield ack
        finally:
            reader.cancel()
            for key in keys:
                if transport.inbound.get(key) is acks:
                    del transport.inbound[key]
            acks.drop()

    async def Truncate(
        self, request: pb.TruncateRequest, context: grpc.aio.ServicerContext
    ) -> pb.TruncateResponse:
        await self._refuse_another_format(context)
        shard = (request.namespace, request.shard)
        host = self.node.hosts.get(shard)
        if host is None:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"shard {shard} is not hosted on {self.node.name}",
            )
        reply = self.node.transport.expect(TruncateResponse, shard, request.leader_name)
        host.step(wire.truncate_from_pb(request))
        response = await await_reply(reply, context, f"Truncate for {shard}")
        return wire.truncate_response_to_pb(response)

    async def SendSnapshot(
        self, request_iterator: AsyncIterator[pb.SnapshotChunk], context: grpc.aio.ServicerContext
    ) -> pb.SnapshotResponse:
        """Stages the streamed snapshot into a fresh KV as it arrives, then installs it."""
        await self._refuse_another_format(context)
        first: pb.SnapshotChunk | None = None
        host: ShardHost | None = None
        stager: SnapshotStager | None = None
        started = time.monotonic()
        received = 0
        try:
            async for chunk in request_iterator:
                received += len(chunk.data)
                if first is None:
                    first = chunk
                    shard = (chunk.namespace, chunk.shard)
                    host = self.node.hosts.get(shard)
                    if not chunk.HasField("position"):
                        await abort(
                            context,
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"the first chunk of a snapshot for {shard} names no log position",
                        )
                    if host is None or not host.can_install_snapshot(chunk.term, chunk.leader_name):
                        await abort(
                            context,
                            grpc.StatusCode.FAILED_PRECONDITION,
                            f"not accepting a snapshot for {shard} in term {chunk.term}",
                        )
                    stager = SnapshotStager(host.staging_directory(), self.node.kv_memory)
                else:
                    assert host is not None
                    if not host.can_install_snapshot(first.term, first.leader_name):
                        # A newer term began meanwhile and the install would be refused:
                        # stop staging a snapshot nobody can use, rather than write the rest.
                        await abort(
                            context,
                            grpc.StatusCode.FAILED_PRECONDITION,
                            f"snapshot for {shard} from {first.leader_name} in term "
                            f"{first.term} superseded: the replica is now in term "
                            f"{host.replica.term}",
                        )
                assert stager is not None
                await stager.feed(chunk.data)
                if stager.stopped:
                    break  # staging failed: no use reading the rest
        except BaseException:
            if stager is not None:
                await stager.abandon()
            raise
        if first is None or host is None or stager is None:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "empty snapshot stream")
        position = wire.position_from_pb(first.position)
        try:
            staged = await stager.finish()
        except Exception as e:  # noqa: BLE001 - any staging failure is the sender's DATA_LOSS
            shutil.rmtree(stager.directory, ignore_errors=True)
            await abort(context, grpc.StatusCode.DATA_LOSS, f"snapshot could not be staged: {e}")
        if staged != position:
            shutil.rmtree(stager.directory, ignore_errors=True)
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"refused: the snapshot's chunks hold the KV at {staged}, but the stream "
                f"names {position}; the replica is unchanged",
            )
        staging = stager.directory
        head = host.install_staged_snapshot(first.term, first.leader_name, position, staging)
        log.log(
            finished_snapshot_level(received),
            "shard %s/%s: received a snapshot at offset %d from %s (%.1f MiB, %.1f s); "
            "the replica's log now ends at offset %d",
            first.namespace,
            first.shard,
            position.offset,
            first.leader_name,
            received / (1 << 20),
            time.monotonic() - started,
            head.offset,
        )
        return pb.SnapshotResponse(
            namespace=first.namespace,
            shard=first.shard,
            term=host.replica.term,
            head=wire.position_to_pb(head),
        )
