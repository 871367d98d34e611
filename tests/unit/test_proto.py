"""Wire contracts checked without protoc or a server: the generated gRPC modules import
their messages relatively, the official client's bytes decode with our classes, and the
internal messages and services behave as declared."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumstore.proto import oxia_client_pb2, replication_pb2_grpc
from quorumstore.proto import replication_pb2 as rpb

ROOT = Path(__file__).resolve().parents[2]
U64_MAX = 2**64 - 1


# ---------------------------------------------------------- generated code


def test_generated_grpc_modules_use_package_relative_imports():
    for path in sorted((ROOT / "python" / "quorumstore" / "proto").glob("*_pb2_grpc.py")):
        text = path.read_text(encoding="utf-8")
        assert f"from . import {path.stem.removesuffix('_grpc')}" in text, path.name
        assert f"\nimport {path.stem.removesuffix('_grpc')}" not in text, path.name


# ----------------------------------------------------- Oxia compatibility


def test_official_client_messages_decode_byte_for_byte():
    """Encode with the official (betterproto2) classes, decode with ours."""
    import oxia.internal.proto.io.streamnative.oxia.proto as official  # the test extra pins it

    theirs = official.WriteRequest(
        shard=3,
        puts=[
            official.PutRequest(
                key="/a/b",
                value=b"\x00\x01",
                expected_version_id=-1,
                session_id=7,
                partition_key="p",
                sequence_key_delta=[1, 2],
                secondary_indexes=[official.SecondaryIndex(index_name="i", secondary_key="s")],
            )
        ],
        deletes=[official.DeleteRequest(key="/x", expected_version_id=5)],
        delete_ranges=[official.DeleteRangeRequest(start_inclusive="a", end_exclusive="b")],
    )
    wire = bytes(theirs)
    ours = oxia_client_pb2.WriteRequest.FromString(wire)
    assert ours.shard == 3 and ours.HasField("shard")
    assert ours.puts[0].expected_version_id == -1
    assert list(ours.puts[0].sequence_key_delta) == [1, 2]
    assert ours.SerializeToString() == wire

    batch = oxia_client_pb2.NotificationBatch(shard=1, offset=9, timestamp=U64_MAX)
    batch.notifications["k"].type = oxia_client_pb2.KEY_RANGE_DELETED
    batch.notifications["k"].key_range_last = "z"
    decoded = official.NotificationBatch.parse(batch.SerializeToString())
    assert decoded.timestamp == U64_MAX
    assert decoded.notifications["k"].key_range_last == "z"
    assert decoded.notifications["k"].type == official.NotificationType.KEY_RANGE_DELETED


# ------------------------------------------------------ internal protocol


def _pos(term: int, offset: int, checksum: int) -> rpb.LogPosition:
    return rpb.LogPosition(term=term, offset=offset, checksum=checksum)


@pytest.mark.parametrize(
    "message",
    [
        rpb.Append(
            namespace="default",
            shard=4,
            term=2,
            commit_offset=10,
            prev_checksum=U64_MAX,
            entries=[
                rpb.LogEntry(term=2, offset=11, checksum=1, payload=b"arrow-1"),
                rpb.LogEntry(term=2, offset=12, checksum=U64_MAX, payload=b""),
            ],
            leader_name="n1:7000",
        ),
        rpb.Ack(
            namespace="default",
            shard=4,
            term=3,
            head_offset=9,
            commit_offset=8,
            status=rpb.MISMATCH,
            follower_head=_pos(1, 9, 42),
        ),
        rpb.BecomeLeaderRequest(
            namespace="ns",
            shard=0,
            term=5,
            replication_factor=3,
            follower_map={"n2:7000": _pos(4, 7, 1), "n3:7000": _pos(-1, -1, 0)},
        ),
        rpb.HealthReport(
            node_name="n1:7000",
            sequence=17,
            ping_sequence=3,
            shards=[
                rpb.ShardStatus(
                    namespace="ns",
                    shard=1,
                    term=5,
                    role=rpb.LEADER,
                    head=_pos(5, 100, 9),
                    commit_offset=99,
                    followers=[
                        rpb.FollowerStatus(
                            name="n2:7000", acked_offset=99, last_pushed_offset=100, in_sync=True
                        )
                    ],
                )
            ],
        ),
        rpb.ShardAssignmentsUpdate(
            version=12,
            namespaces=[
                rpb.NamespaceAssignments(
                    namespace="default",
                    shards=[
                        rpb.ShardAssignment(
                            shard=0,
                            hash_range=rpb.HashRange(
                                min_hash_inclusive=0, max_hash_inclusive=2**32 - 1
                            ),
                            term=1,
                            leader="n1:7001",
                            followers=["n2:7001", "n3:7001"],
                        )
                    ],
                )
            ],
        ),
        rpb.SnapshotChunk(
            namespace="ns", shard=2, term=3, position=_pos(3, 50, 7), data=b"ipc", last=True
        ),
        rpb.CoordinatorMetadata(
            version=3,
            shards=[
                rpb.ShardMetadata(
                    namespace="ns",
                    shard=2,
                    term=-1,
                    ensemble=["n1:7000", "n2:7000", "n3:7000"],
                    hash_range=rpb.HashRange(min_hash_inclusive=0, max_hash_inclusive=2**31),
                    status=rpb.OFFLINE,
                    eligible=["n1:7000"],
                    last_known_commit_offset=-1,
                )
            ],
        ),
    ],
    ids=lambda m: type(m).__name__,
)
def test_internal_message_round_trip(message):
    wire = message.SerializeToString(deterministic=True)
    decoded = type(message).FromString(wire)
    assert decoded == message
    assert decoded.SerializeToString(deterministic=True) == wire


def test_internal_defaults_and_package():
    assert rpb.DESCRIPTOR.package == "quorumstore.replication.v1"
    assert rpb.GetStatusResponse().role == rpb.NOT_MEMBER
    assert rpb.Ack().status == rpb.OK
    assert rpb.ShardMetadata().status == rpb.ELECTION
    assert not rpb.NewTermResponse().HasField("head")
    assert rpb.EntryId(term=1, offset=2) == rpb.EntryId.FromString(
        rpb.EntryId(term=1, offset=2).SerializeToString()
    )


def test_internal_service_shapes(recording_channel):
    expected = {
        "/quorumstore.replication.v1.NodeControl/NewTerm": (False, False),
        "/quorumstore.replication.v1.NodeControl/BecomeLeader": (False, False),
        "/quorumstore.replication.v1.NodeControl/AddFollower": (False, False),
        "/quorumstore.replication.v1.NodeControl/GetStatus": (False, False),
        "/quorumstore.replication.v1.NodeControl/Health": (True, True),
        "/quorumstore.replication.v1.NodeControl/PushShardAssignments": (False, False),
        "/quorumstore.replication.v1.NodeControl/RebuildFromArchive": (False, False),
        "/quorumstore.replication.v1.Replication/Replicate": (True, True),
        "/quorumstore.replication.v1.Replication/Truncate": (False, False),
        "/quorumstore.replication.v1.Replication/SendSnapshot": (True, False),
    }
    channel = recording_channel
    replication_pb2_grpc.NodeControlStub(channel)
    replication_pb2_grpc.ReplicationStub(channel)
    assert channel.methods == expected
