"""`quorumstore status`'s table from a ClusterStatus, and a hosted cluster's status()."""

from __future__ import annotations

from dataclasses import replace

from quorumstore.coordinator.cluster_status import format_status
from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import ShardState, initial_metadata
from quorumstore.spark.hosting import HostedClusterStatus
from quorumstore.wire import replication as wire

NODES = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


def _leader_report(node: str, term: int, head: int, commit: int) -> pb.ShardStatus:
    followers = [
        pb.FollowerStatus(name=name, acked_offset=commit - 2) for name in NODES if name != node
    ]
    return pb.ShardStatus(
        namespace="default",
        shard=0,
        term=term,
        role=pb.LEADER,
        head=pb.LogPosition(term=term, offset=head),
        commit_offset=commit,
        node=node,
        followers=followers,
    )


def test_a_failed_leaders_last_report_does_not_hide_the_new_leaders() -> None:
    metadata = initial_metadata(NODES, {"default": 1}, 3)
    key = ("default", 0)
    metadata.shards[key] = replace(
        metadata.shards[key], term=5, leader=NODES[0], state=ShardState.ONLINE
    )
    # The coordinator keeps each node's last report, the dead leader's (term 4) too; the
    # reports come sorted by node, so the stale one is listed last here.
    current = _leader_report(NODES[0], 5, head=120, commit=118)
    stale = _leader_report(NODES[2], 4, head=99, commit=97)
    status = pb.ClusterStatus(
        metadata=wire.metadata_to_pb(metadata),
        replicas=[current, stale],
        nodes_alive={NODES[0]: True, NODES[1]: True, NODES[2]: False},
    )
    table = format_status(status).splitlines()
    row = next(line for line in table if line.startswith("default/0 "))
    assert row.split()[:6] == ["default/0", "online", "5", NODES[0], "120", "118"], row
    # The dead node's last acked offset would show a lag like a live follower's.
    assert f"{NODES[1]} (2), {NODES[2]} (2, down)" in row, row
    assert table[-1] == f"unreachable nodes: {NODES[2]}"


def test_a_hosted_cluster_whose_coordinator_was_deposed_is_not_online_and_says_why() -> None:
    metadata = initial_metadata(NODES, {"default": 1}, 3)
    key = ("default", 0)
    metadata.shards[key] = replace(
        metadata.shards[key], term=5, leader=NODES[0], state=ShardState.ONLINE
    )
    cluster = pb.ClusterStatus(
        metadata=wire.metadata_to_pb(metadata),
        replicas=[_leader_report(NODES[0], 5, head=120, commit=118)],
        nodes_alive=dict.fromkeys(NODES, True),
    )
    assert HostedClusterStatus(cluster, ()).online
    why = "another coordinator took the coordinator metadata at s3://b/m.pb (pid 7 on h)"
    deposed = HostedClusterStatus(cluster, (), why)
    assert not deposed.online
    assert str(deposed).splitlines()[0] == f"coordinator stopped: {why}"
