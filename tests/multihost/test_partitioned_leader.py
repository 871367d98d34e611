"""A leader partitioned from its followers and the coordinator never serves a stale read.

Three `quorumstore node` processes on three hosts and the coordinator on a fourth, each
a network namespace; the test (the client) is in the root namespace, which reaches every
host whatever the partition. The leader's host is cut off from the other hosts, the
coordinator's included, while the client still reaches it: the rest elect a new leader
and take a new value, and a read sent straight to the old leader (leader routing, no
relay) must not return the old value. The old leader still believes it leads (no new
term reached it); its read barrier cannot commit without its followers, so the read
fails. After the partition heals, the old leader follows the new one.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from netns import Hosts

from cluster_harness import LocalCluster
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.wire.metadata import LEADER_ROUTING_METADATA

pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(600)]

KEY = "/partitioned"
ROUNDS = 2
#: How long the read at the partitioned old leader may wait before it counts as refused.
READ_TIMEOUT_S = 10.0


def _put(channel: grpc.Channel, value: bytes) -> None:
    response = oxia_client_pb2_grpc.OxiaClientStub(channel).Write(
        pb.WriteRequest(shard=0, puts=[pb.PutRequest(key=KEY, value=value)]),
        metadata=LEADER_ROUTING_METADATA,
        timeout=5,
    )
    assert response.puts[0].status == pb.OK, response


def _put_until_acknowledged(channel: grpc.Channel, value: bytes, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _put(channel, value)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _get(channel: grpc.Channel) -> bytes | grpc.RpcError:
    request = pb.ReadRequest(shard=0, gets=[pb.GetRequest(key=KEY, include_value=True)])
    try:
        [response] = list(
            oxia_client_pb2_grpc.OxiaClientStub(channel).Read(
                request, metadata=LEADER_ROUTING_METADATA, timeout=READ_TIMEOUT_S
            )
        )
    except grpc.RpcError as e:
        return e
    return bytes(response.gets[0].value)


def test_a_partitioned_old_leader_serves_no_stale_read(four_hosts: Hosts, tmp_path: Path) -> None:
    hosts = list(four_hosts)
    cluster = LocalCluster(tmp_path, nodes=3, shards=1, replication_factor=3, places=hosts)
    host_of = dict(zip(cluster.nodes, hosts, strict=False))
    channels = {node: grpc.insecure_channel(node) for node in cluster.nodes}
    try:
        cluster.start()
        for round_no in range(1, ROUNDS + 1):
            leader = cluster.leader_of(0)
            assert leader is not None
            term = cluster.shard_metadata(0).term
            old, new = f"old-{round_no}".encode(), f"new-{round_no}".encode()
            _put(channels[leader], old)
            rest = [h for h in hosts if h is not host_of[leader]]
            four_hosts.partition([[host_of[leader]], rest])
            try:
                new_leader, _ = cluster.wait_new_leader(0, not_on=leader, after_term=term)
                _put_until_acknowledged(channels[new_leader], new)
                answer = _get(channels[leader])
                if isinstance(answer, grpc.RpcError):
                    assert answer.code() in (
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.UNAVAILABLE,
                    ), answer
                else:
                    assert answer == new, f"round {round_no}: the old leader served {answer!r}"
                assert _get(channels[new_leader]) == new
            finally:
                four_hosts.heal_partition()
            cluster.wait_following(leader, 0)
    except BaseException:
        print(four_hosts.describe())
        for node in cluster.nodes:
            print(f"----- {node}\n{cluster.log_text(node)[-3000:]}")
        raise
    finally:
        for channel in channels.values():
            channel.close()
        cluster.close()
