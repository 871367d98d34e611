"""Notification and sequence-update streams wake when their shard applies an entry.

A node's streams look at their shard when it signals a change, and otherwise only
every `DEFAULT_STREAM_RECHECK_INTERVAL_S` (1 s). Each change below is seen far sooner
than that: a stream that waited for its recheck would take half of it on average.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from quorumstore.node.oxia.streams import DEFAULT_STREAM_RECHECK_INTERVAL_S
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.testing import standalone_server

ROUNDS = 15
#: A tenth of the recheck interval: a stream that waited for its recheck takes longer.
SEEN_WITHIN_S = DEFAULT_STREAM_RECHECK_INTERVAL_S / 10


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[oxia_client_pb2_grpc.OxiaClientStub]:
    data: Path = tmp_path_factory.mktemp("standalone")
    with standalone_server(data, fsync=False) as address, grpc.insecure_channel(address) as channel:
        yield oxia_client_pb2_grpc.OxiaClientStub(channel)


def _follow(stream: grpc.Future, into: queue.Queue[object]) -> None:
    try:
        for message in stream:
            into.put(message)
    except grpc.RpcError:
        pass  # cancelled at the end of the test


def _median_delay(
    stub: oxia_client_pb2_grpc.OxiaClientStub, stream: grpc.Future, put: pb.PutRequest
) -> float:
    """Median seconds from a put's response to the stream's next message, over ROUNDS."""
    messages: queue.Queue[object] = queue.Queue()
    threading.Thread(target=_follow, args=(stream, messages), daemon=True).start()
    try:
        delays = []
        for _ in range(ROUNDS):
            time.sleep(0.05)  # the stream is idle, waiting
            while not messages.empty():
                messages.get_nowait()
            response = stub.Write(pb.WriteRequest(shard=0, puts=[put]), timeout=10)
            assert response.puts[0].status == pb.OK
            written = time.monotonic()
            messages.get(timeout=10)
            delays.append(time.monotonic() - written)
        return statistics.median(delays)
    finally:
        stream.cancel()


def test_a_notification_stream_wakes_at_each_write(
    stub: oxia_client_pb2_grpc.OxiaClientStub,
) -> None:
    stream = stub.GetNotifications(pb.NotificationsRequest(shard=0))
    next(stream)  # the empty batch that announces where the stream starts
    assert _median_delay(stub, stream, pb.PutRequest(key="/n", value=b"v")) < SEEN_WITHIN_S


def test_a_sequence_update_stream_wakes_at_each_write(
    stub: oxia_client_pb2_grpc.OxiaClientStub,
) -> None:
    first = pb.PutRequest(key="/seq", value=b"v", partition_key="p", sequence_key_delta=[1])
    stub.Write(pb.WriteRequest(shard=0, puts=[first]), timeout=10)
    stream = stub.GetSequenceUpdates(pb.GetSequenceUpdatesRequest(shard=0, key="/seq"))
    next(stream)  # the latest key so far
    assert _median_delay(stub, stream, first) < SEEN_WITHIN_S
