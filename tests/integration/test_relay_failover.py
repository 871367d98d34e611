"""A gateway's relayed calls follow the shard's leader instead of waiting on one that
stopped answering (node/oxia/relay.py).

The gateway is the `Cluster` of test_client_api in gateway mode; shard 2 is followed
there and led by a "stuck" server that accepts every call and never answers (a paused
or cut-off leader), until the gateway's view names another leader.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_client_api import TIMEOUT, Cluster, kv_factory, routing_table, wait_until

from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.wire.channels import SERVER_OPTIONS
from quorumstore.wire.metadata import CLIENT_ID_METADATA_KEY, SERIAL_METADATA_KEY

pytestmark = pytest.mark.integration

#: Long enough that an answer well within it proves the leader change, not the
#: timeout, ended the wait.
LONG_RELAY_TIMEOUT_S = 5.0
#: How soon after the gateway learns the new leader a relayed call must complete.
FOLLOW_BOUND_S = 1.5
FAST = {"session_check_interval_s": 0.005, "stream_recheck_interval_s": 0.005}


class StuckLeader(oxia_client_pb2_grpc.OxiaClientServicer):
    """Accepts writes and reads and never answers them; counts the calls it got."""

    def __init__(self) -> None:
        self.calls = 0

    async def _hang(self) -> None:
        self.calls += 1
        await asyncio.Event().wait()

    async def Write(self, request: Any, context: Any) -> Any:
        await self._hang()

    async def Read(self, request: Any, context: Any) -> Any:
        await self._hang()
        yield pb.ReadResponse()


class StuckServer:
    """A `StuckLeader` served on an event loop of its own thread."""

    def __init__(self) -> None:
        self.leader = StuckLeader()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.address = f"127.0.0.1:{self._run(self._start())}"

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    async def _start(self) -> int:
        self._server = grpc.aio.server(options=SERVER_OPTIONS)
        oxia_client_pb2_grpc.add_OxiaClientServicer_to_server(self.leader, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    def stop(self) -> None:
        self._run(self._server.stop(None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(TIMEOUT)
        self.loop.close()


@pytest.fixture
def stuck() -> Iterator[StuckServer]:
    server = StuckServer()
    yield server
    server.stop()


@pytest.fixture
def new_leader(tmp_path: Path) -> Iterator[Cluster]:
    """A server that leads shard 2 and answers."""
    c = Cluster(kv_factory("memory", tmp_path / "new"), **FAST)
    c.hosts[2].leader = True
    yield c
    c.close()


def gateway_to(stuck: StuckServer, tmp_path: Path, relay_timeout_s: float) -> Cluster:
    """A gateway whose view of shard 2's leader is the stuck server."""
    gateway = Cluster(
        kv_factory("memory", tmp_path / "gateway"),
        routing="gateway",
        relay_timeout_s=relay_timeout_s,
        **FAST,
    )
    gateway.hosts[2].hint = stuck.address
    return gateway


def move_leader(gateway: Cluster, address: str | None, here: bool = False) -> float:
    """Gives the gateway's replica of shard 2 a new leader and pushes a new routing
    table, as a node learns a new term; returns the monotonic time it happened."""
    host = gateway.hosts[2]

    async def move() -> None:
        host.hint, host.leader = address, here
        table = routing_table(gateway.directory.table.version + 1, gateway.server.address)
        await gateway.directory.push(table)

    gateway.server.run(move())
    return time.monotonic()


def in_background(call: Any) -> concurrent.futures.Future[Any]:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def put(gateway: Cluster, key: str, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    request = pb.WriteRequest(shard=2, puts=[pb.PutRequest(key=key, value=b"v")])
    # No deadline, as the official client sets none: only the relay may end the wait.
    return gateway.stub.Write(request, metadata=metadata)


def get(gateway: Cluster, key: str) -> pb.GetResponse:
    request = pb.ReadRequest(shard=2, gets=[pb.GetRequest(key=key, include_value=True)])
    [response] = gateway.stub.Read(request)
    return response.gets[0]


def test_an_exactly_once_write_follows_the_new_leader_once(
    stuck: StuckServer, new_leader: Cluster, tmp_path: Path
) -> None:
    gateway = gateway_to(stuck, tmp_path, LONG_RELAY_TIMEOUT_S)
    try:
        metadata = ((CLIENT_ID_METADATA_KEY, "writer"), (SERIAL_METADATA_KEY, "7"))
        answer = in_background(lambda: put(gateway, "/eo", metadata))
        wait_until(lambda: stuck.leader.calls == 1)
        moved_at = move_leader(gateway, new_leader.server.address)
        response = answer.result(TIMEOUT)
        took = time.monotonic() - moved_at
        print(f"relayed write answered {took:.3f} s after the leader changed")
        assert took < FOLLOW_BOUND_S
        assert response.puts[0].status == pb.OK
        assert new_leader.get("/eo", shard=2).version.modifications_count == 0
        # The same serial again: answered from the leader's serials, not applied twice.
        assert put(gateway, "/eo", metadata) == response
        assert new_leader.get("/eo", shard=2).version.modifications_count == 0
    finally:
        gateway.close()


def test_a_read_follows_the_new_leader_and_to_this_node(
    stuck: StuckServer, new_leader: Cluster, tmp_path: Path
) -> None:
    gateway = gateway_to(stuck, tmp_path, LONG_RELAY_TIMEOUT_S)
    try:
        new_leader.put("/r", b"there", shard=2)
        answer = in_background(lambda: get(gateway, "/r"))
        wait_until(lambda: stuck.leader.calls == 1)
        moved_at = move_leader(gateway, new_leader.server.address)
        assert answer.result(TIMEOUT).value == b"there"
        assert time.monotonic() - moved_at < FOLLOW_BOUND_S
        # Leadership moving to the gateway itself: the read is answered there.
        move_leader(gateway, stuck.address)
        answer = in_background(lambda: get(gateway, "/r"))
        wait_until(lambda: stuck.leader.calls == 2)
        moved_at = move_leader(gateway, None, here=True)
        assert answer.result(TIMEOUT).status == pb.KEY_NOT_FOUND  # the gateway's own shard
        assert time.monotonic() - moved_at < FOLLOW_BOUND_S
    finally:
        gateway.close()


def test_a_plain_write_whose_leader_changed_has_an_unknown_outcome(
    stuck: StuckServer, new_leader: Cluster, tmp_path: Path
) -> None:
    gateway = gateway_to(stuck, tmp_path, LONG_RELAY_TIMEOUT_S)
    try:
        answer = in_background(lambda: put(gateway, "/plain"))
        wait_until(lambda: stuck.leader.calls == 1)
        moved_at = move_leader(gateway, new_leader.server.address)
        with pytest.raises(grpc.RpcError) as failure:
            answer.result(TIMEOUT)
        assert time.monotonic() - moved_at < FOLLOW_BOUND_S
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "outcome unknown" in failure.value.details()
        # Not sent again: the old leader may have applied it.
        assert new_leader.get("/plain", shard=2).status == pb.KEY_NOT_FOUND
    finally:
        gateway.close()


def test_a_leader_that_does_not_answer_fails_the_call_after_the_relay_timeout(
    stuck: StuckServer, tmp_path: Path
) -> None:
    relay_timeout_s = 0.5
    gateway = gateway_to(stuck, tmp_path, relay_timeout_s)
    try:
        for call in (lambda: put(gateway, "/t"), lambda: get(gateway, "/t")):
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as failure:
                in_background(call).result(TIMEOUT)
            took = time.monotonic() - started
            print(f"relayed call failed after {took:.3f} s")
            assert relay_timeout_s <= took < relay_timeout_s + FOLLOW_BOUND_S
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "did not answer within 500 ms" in failure.value.details()
    finally:
        gateway.close()
