"""A leader runs one snapshot stream per follower, however often the engine asks, and gives
up a stream its follower stopped taking chunks from.

The leader is a real ShardHost whose KV holds about 48 MiB (a dozen 4 MiB chunks); the
follower is a gRPC server whose SendSnapshot takes chunks at the pace a test sets, or
stops taking them: the pace is what these tests are about, and a real follower's pace
cannot be set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

import grpc
import pytest

from quorumstore.node import snapshot_streams
from quorumstore.node.data_format import (
    DATA_FORMAT,
    METADATA_KEY,
    REPLICATION_METADATA,
    RefusalLog,
)
from quorumstore.node.shard_host import ShardHost
from quorumstore.node.snapshot_streams import SnapshotStreams
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import Ack, Message, Outbound, SendSnapshot, ShardKey
from quorumstore.protocol.types import EMPTY_POSITION
from quorumstore.wire import replication as wire
from quorumstore.wire.channels import PEER_CHANNEL_OPTIONS, listen
from quorumstore.wire.keys import encode_key

pytestmark = pytest.mark.integration

SHARD = ("default", 0)
KEYS = 400_000


class _NoTransport:
    def send(self, sender: ShardHost, out: Outbound) -> None:
        pass

    def send_snapshot(self, sender: ShardHost, request: SendSnapshot) -> None:
        raise AssertionError("the test sends snapshots itself")

    def acks_in_transit(self, shard: ShardKey) -> bool:
        return False  # written as they are sent

    def client_address(self, peer: str | None) -> str | None:
        return peer


class PacedFollower(pb_grpc.ReplicationServicer):
    """Takes one chunk per `pause_s`, or none after the first with `stall`."""

    def __init__(self, pause_s: float = 0.0, stall: bool = False) -> None:
        self.pause_s = pause_s
        self.stall = stall
        self.calls: list[list[int]] = []  # per call: the term of each chunk taken
        self.formats: list[str | None] = []  # per call: the data format header it carried
        self.cancelled = asyncio.Event()

    async def SendSnapshot(
        self, request_iterator: AsyncIterator[pb.SnapshotChunk], context: grpc.aio.ServicerContext
    ) -> pb.SnapshotResponse:
        terms: list[int] = []
        self.calls.append(terms)
        self.formats.append(dict(context.invocation_metadata() or ()).get(METADATA_KEY))
        try:
            async for chunk in request_iterator:
                terms.append(chunk.term)
                if self.stall:
                    await asyncio.Event().wait()
                await asyncio.sleep(self.pause_s)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        if not terms:  # the leader went away before its first chunk
            return pb.SnapshotResponse()
        return pb.SnapshotResponse(
            namespace=SHARD[0],
            shard=SHARD[1],
            term=terms[0],
            head=wire.position_to_pb(EMPTY_POSITION),
        )


class Leader:
    """A real shard host with a filled KV, its SnapshotStreams and a follower server."""

    def __init__(self, directory: Path, follower: PacedFollower) -> None:
        self._io = ThreadPoolExecutor(2)
        self.host = ShardHost(
            "leader", SHARD, directory, _NoTransport(), self._io, on_failure=print, wal_sync=False
        )
        value = b"v" * 100
        for start in range(0, KEYS, 50_000):
            self.host.kv.write(
                ((encode_key(f"/k/{i:09d}"), value) for i in range(start, start + 50_000)), [], []
            )
        self.follower = follower
        self.delivered: list[Message] = []
        self.server = grpc.aio.server(options=PEER_CHANNEL_OPTIONS)
        pb_grpc.add_ReplicationServicer_to_server(follower, self.server)
        self.address = f"127.0.0.1:{listen(self.server, '127.0.0.1', 0)}"
        self.channel = grpc.aio.insecure_channel(self.address, options=PEER_CHANNEL_OPTIONS)
        self.streams = SnapshotStreams(
            lambda _: self.channel, self._deliver, RefusalLog(), REPLICATION_METADATA
        )

    def _deliver(self, shard: ShardKey, message: Message) -> None:
        self.delivered.append(message)

    def request(self, term: int) -> None:
        self.streams.request(self.host, SendSnapshot(SHARD, term, self.address))

    async def __aenter__(self) -> Self:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.streams.close()
        await self.channel.close()
        await self.server.stop(None)
        self.host.close()
        self._io.shutdown()


async def _until(condition: object, timeout_s: float = 20.0) -> None:
    async def poll() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout_s)


def test_requests_while_a_stream_moves_start_no_other_and_it_has_no_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chunk every 0.2 s, and at least 10 of them: a stream of 2 s or more. A chunk may
    # take a while longer on a loaded machine: 1 s of stall allowed was too little there.
    monkeypatch.setattr(snapshot_streams, "STALL_S", 1.5)

    async def main() -> float:
        async with Leader(tmp_path, PacedFollower(pause_s=0.2)) as leader:
            started = asyncio.get_running_loop().time()
            for _ in range(600):  # the engine asks again and again meanwhile
                if leader.delivered:
                    break
                leader.request(term=3)
                await asyncio.sleep(0.05)
            elapsed = asyncio.get_running_loop().time() - started
            assert len(leader.follower.calls) == 1
            assert leader.follower.formats == [str(DATA_FORMAT)]
            assert len(leader.follower.calls[0]) >= 10  # every chunk of ~48 MiB
            (ack,) = leader.delivered
            assert isinstance(ack, Ack) and ack.follower == leader.address and ack.term == 3
            return elapsed

    # Longer than STALL_S in all: only a stream that stops moving is given up.
    assert asyncio.run(main()) > snapshot_streams.STALL_S


def test_a_stalled_stream_is_given_up_and_the_next_request_starts_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(snapshot_streams, "STALL_S", 0.5)
    monkeypatch.setattr(snapshot_streams, "_CHECK_S", 0.1)

    async def main() -> None:
        async with Leader(tmp_path, PacedFollower(stall=True)) as leader:
            leader.request(term=3)
            await asyncio.wait_for(leader.follower.cancelled.wait(), 20)
            leader.request(term=3)
            await _until(lambda: len(leader.follower.calls) == 2)
            assert not leader.delivered

    with caplog.at_level(logging.WARNING, logger=snapshot_streams.__name__):
        asyncio.run(main())
    (stalled,) = [r.getMessage() for r in caplog.records if r.name == snapshot_streams.__name__]
    assert "stalled: the follower took no chunk for" in stalled


def test_a_request_of_a_newer_term_replaces_the_stream_under_way(tmp_path: Path) -> None:
    async def main() -> None:
        async with Leader(tmp_path, PacedFollower(stall=True)) as leader:
            leader.request(term=3)
            await _until(lambda: leader.follower.calls and leader.follower.calls[0])
            leader.request(term=3)
            leader.request(term=4)
            await asyncio.wait_for(leader.follower.cancelled.wait(), 20)
            await _until(lambda: len(leader.follower.calls) == 2 and leader.follower.calls[1])
            assert [call[0] for call in leader.follower.calls] == [3, 4]

    asyncio.run(main())
