"""The leader's snapshot streams: at most one per (shard, follower), given up when it stalls.

While a follower has not acknowledged its snapshot, the engine asks for one again every
`retransmit_ticks * snapshot_patience` ticks (about a second), since it cannot tell a
stream still under way from a lost one. Starting a stream on every such request made a
large shard's catch-up ever slower: each new stream read and sent the whole KV again,
and the follower staged each in a directory of its own (six overlapping streams for a
124 MB shard on this machine). So a request is answered by the stream already under way
for that follower, unless that stream is of an older term; a stream whose follower takes
no chunk for `STALL_S` is cancelled, and the next request starts afresh. Nothing bounds a
moving stream's total time, so a shard of any size can be sent.

A stream logs its progress every `PROGRESS_S` and its end (at INFO from a MiB up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from quorumstore.node.data_format import RefusalLog
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import Ack, AckStatus, Message, SendSnapshot, ShardKey
from quorumstore.storage.kv import KvStore
from quorumstore.storage.reads import ShardReader
from quorumstore.storage.snapshot import iter_snapshot_chunks
from quorumstore.wire import replication as wire

log = logging.getLogger(__name__)

#: A stream whose follower took no chunk for this long is given up.
STALL_S = 30.0
#: How often a stream under way logs how far it got.
PROGRESS_S = 10.0
#: How often a stream under way is checked for a stall.
_CHECK_S = 1.0
_MIB = 1 << 20


class SnapshotSource(Protocol):
    """The leader's replica a snapshot is read from (a `ShardHost`)."""

    @property
    def shard(self) -> ShardKey: ...

    @property
    def node(self) -> str:
        """The leader's address, which the follower checks the snapshot against."""
        ...

    @property
    def kv(self) -> KvStore: ...


def finished_snapshot_level(size: int) -> int:
    """The log level of a finished snapshot: every new replica gets an all but empty one,
    which is not worth a line at INFO."""
    return logging.INFO if size >= _MIB else logging.DEBUG


@dataclass
class _Progress:
    started: float
    chunks: int = 0
    bytes: int = 0
    #: Loop time the follower last took a chunk (or the stream started).
    moved: float = field(init=False)
    #: Loop time of the last progress line (or the stream's start).
    logged: float = field(init=False)

    def __post_init__(self) -> None:
        self.moved = self.logged = self.started

    def summary(self, now: float) -> str:
        seconds = now - self.started
        rate = self.bytes / _MIB / seconds if seconds > 0 else 0.0
        return (
            f"{self.bytes / _MIB:.1f} MiB in {self.chunks} chunks, {seconds:.1f} s "
            f"({rate:.1f} MiB/s)"
        )


@dataclass
class _Stream:
    term: int
    task: asyncio.Task[None]


class SnapshotStreams:
    """Sends snapshots for the shards this node leads; one stream per follower at a time."""

    def __init__(
        self,
        channel: Callable[[str], grpc.aio.Channel],
        deliver: Callable[[ShardKey, Message], None],
        refusals: RefusalLog,
        metadata: tuple[tuple[str, str], ...],
    ) -> None:
        """`channel` gives a follower's internal channel (LookupError: not known yet);
        `metadata` goes with every stream (the data format and the cluster secret)."""
        self._channel = channel
        self._deliver = deliver
        self._refusals = refusals
        self._metadata = metadata
        self._streams: dict[tuple[ShardKey, str], _Stream] = {}

    def request(self, host: SnapshotSource, request: SendSnapshot) -> None:
        """Starts a stream for `request` unless one of its term or newer is under way."""
        key = (host.shard, request.follower)
        current = self._streams.get(key)
        if current is not None and not current.task.done():
            if current.term >= request.term:
                return
            current.task.cancel()  # of an older term: the follower would refuse it
        task = asyncio.get_running_loop().create_task(self._send(host, request))
        stream = _Stream(request.term, task)
        self._streams[key] = stream
        task.add_done_callback(lambda _: self._forget(key, stream))

    def _forget(self, key: tuple[ShardKey, str], stream: _Stream) -> None:
        if self._streams.get(key) is stream:
            del self._streams[key]

    async def close(self) -> None:
        tasks = [stream.task for stream in self._streams.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _send(self, host: SnapshotSource, request: SendSnapshot) -> None:
        loop = asyncio.get_running_loop()
        shard, follower = host.shard, request.follower
        name = f"snapshot of shard {shard[0]}/{shard[1]} to {follower}"
        try:
            stub = pb_grpc.ReplicationStub(self._channel(follower))
        except LookupError as e:
            log.debug("%s: %s", name, e)
            return
        view = host.kv.snapshot()
        # The view's own position: an apply on a worker thread may be writing meanwhile.
        position = ShardReader(view).applied_position
        progress = _Progress(loop.time())
        #: The chunk being read on a worker thread: the view must outlive it.
        reading: asyncio.Future[bytes | None] | None = None

        async def chunks() -> AsyncIterator[pb.SnapshotChunk]:
            nonlocal reading
            iterator = iter_snapshot_chunks(view, position)
            first = True
            while True:
                progress.moved = loop.time()
                reading = loop.run_in_executor(None, next, iterator, None)
                data = await reading
                if data is None:
                    return
                progress.chunks += 1
                progress.bytes += len(data)
                yield pb.SnapshotChunk(
                    namespace=shard[0],
                    shard=shard[1],
                    term=request.term,
                    position=wire.position_to_pb(position) if first else None,
                    data=data,
                    leader_name=host.node,
                )
                first = False

        log.debug("%s: sending the KV at offset %d", name, position.offset)
        call = stub.SendSnapshot(chunks(), metadata=self._metadata)
        try:
            response = await self._watch(call, progress, name)
        except grpc.aio.AioRpcError as e:
            log.info("%s failed after %s: %s", name, progress.summary(loop.time()), e.code())
            self._refusals.note(follower, e)
            return
        finally:
            call.cancel()  # a no-op once the call ended
            if reading is not None:
                await asyncio.wait([reading])
            view.close()
        if response is None:
            return
        log.log(
            finished_snapshot_level(progress.bytes),
            "%s at offset %d: sent, %s",
            name,
            position.offset,
            progress.summary(loop.time()),
        )
        head = wire.position_from_pb(response.head)
        self._deliver(shard, Ack(shard, response.term, follower, AckStatus.OK, head.offset, head))

    async def _watch(
        self, call: grpc.aio.StreamUnaryCall, progress: _Progress, name: str
    ) -> pb.SnapshotResponse | None:
        """The call's response, or None once it stalled; logs progress meanwhile."""
        loop = asyncio.get_running_loop()
        response = asyncio.ensure_future(call)
        while True:
            done, _ = await asyncio.wait([response], timeout=_CHECK_S)
            if done:
                return response.result()
            now = loop.time()
            if now - progress.moved > STALL_S:
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await response
                log.warning(
                    "%s stalled: the follower took no chunk for %.0f s, after %s; given up, "
                    "the next request starts it again",
                    name,
                    now - progress.moved,
                    progress.summary(now),
                )
                return None
            if now - progress.logged >= PROGRESS_S:
                progress.logged = now
                log.info("%s: %s so far", name, progress.summary(now))
