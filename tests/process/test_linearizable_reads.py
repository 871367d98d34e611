"""A leader paused (SIGSTOP) and replaced never serves its stale value once resumed.

Three node processes, one shard. The leader is paused until another node leads, a new
value is written through the new leader, and a get sent straight to the old leader
(Oxia's leader routing: no relay) is in its socket when it resumes. The pause outlasts
the coordinator's NewTerm call to it, which gives up, so the resumed node still takes
itself for the leader of its old term; its read barrier cannot commit in that term, so
it answers "not leader" (or, had it already learned of the new term, the new value),
never the old value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import pytest

from cluster_harness import LocalCluster, poll_until
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.wire.metadata import LEADER_ROUTING_METADATA

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

KEY = "/linearizable"
ROUNDS = 3
#: Longer than the coordinator's deadline of its NewTerm calls (10 s).
PAUSED_AFTER_ELECTION_S = 11.0


def _put(channel: grpc.Channel, value: bytes) -> None:
    stub = oxia_client_pb2_grpc.OxiaClientStub(channel)
    response = stub.Write(
        pb.WriteRequest(shard=0, puts=[pb.PutRequest(key=KEY, value=value)]),
        metadata=LEADER_ROUTING_METADATA,
        timeout=5,
    )
    assert response.puts[0].status == pb.OK, response


def _put_until_acknowledged(channel: grpc.Channel, value: bytes) -> None:
    """The new leader may still be taking over: retried until it acknowledges."""

    def acknowledged() -> bool:
        try:
            _put(channel, value)
        except grpc.RpcError:
            return False
        return True

    poll_until(acknowledged, 30, f"the new leader to acknowledge {value!r}")


def _get(channel: grpc.Channel, answers: list[bytes | grpc.RpcError]) -> None:
    stub = oxia_client_pb2_grpc.OxiaClientStub(channel)
    request = pb.ReadRequest(shard=0, gets=[pb.GetRequest(key=KEY, include_value=True)])
    try:
        [response] = list(stub.Read(request, metadata=LEADER_ROUTING_METADATA, timeout=20))
        answers.append(response.gets[0].value)
    except grpc.RpcError as e:
        answers.append(e)


def test_a_resumed_deposed_leader_never_serves_its_stale_value(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(nodes=3, shards=1, replication_factor=3)
    channels = {node: grpc.insecure_channel(node) for node in cluster.nodes}
    try:
        for round_no in range(1, ROUNDS + 1):
            leader = cluster.leader_of(0)
            assert leader is not None
            term = cluster.shard_metadata(0).term
            old = f"old-{round_no}".encode()
            _put(channels[leader], old)
            cluster.pause(leader)
            answers: list[bytes | grpc.RpcError] = []
            try:
                new_leader, _ = cluster.wait_new_leader(0, not_on=leader, after_term=term)
                elected_at = time.monotonic()
                new = f"new-{round_no}".encode()
                _put_until_acknowledged(channels[new_leader], new)
                reader = threading.Thread(target=_get, args=(channels[leader], answers))
                reader.start()
                # The get waits in the paused leader's socket; the NewTerm call gives up.
                time.sleep(max(0.2, elected_at + PAUSED_AFTER_ELECTION_S - time.monotonic()))
            finally:
                cluster.resume(leader)
            reader.join(30)
            [answer] = answers
            if isinstance(answer, grpc.RpcError):
                assert "not leader" in (answer.details() or ""), answer
            else:
                assert answer == new, f"round {round_no}: the old leader served {answer!r}"
            cluster.wait_following(leader, 0)
    finally:
        for channel in channels.values():
            channel.close()
