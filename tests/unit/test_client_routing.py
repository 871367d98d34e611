"""quorumstore.client.routing: Oxia's XXH3 router over the assignments' hash ranges."""

from __future__ import annotations

import pytest
import xxhash

from quorumstore.client.routing import ShardAssignment, ShardMap
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.wire.hashing import key_hash

HALF = 2**31


def two_shards(leader_1: str = "b:1") -> ShardMap:
    return ShardMap(
        [ShardAssignment(1, leader_1, HALF, 2**32 - 1), ShardAssignment(0, "a:1", 0, HALF - 1)]
    )


def test_key_hash_is_the_low_32_bits_of_xxh3_64() -> None:
    for key in ["/a", "/users/7", "ünïcode/ключ", "x" * 1000]:
        assert key_hash(key) == xxhash.xxh3_64_intdigest(key.encode()) & 0xFFFFFFFF
    # Not the official Python client's XXH64:
    assert key_hash("/a") != xxhash.xxh64_intdigest(b"/a") & 0xFFFFFFFF


def test_keys_route_to_the_shard_whose_range_holds_their_hash() -> None:
    routing = two_shards()
    for i in range(200):
        key = f"/k/{i}"
        expected = 0 if key_hash(key) < HALF else 1
        assert routing.shard_for(key) == expected
    assert routing.shards == [0, 1]
    assert routing.leader(0) == "a:1"


@pytest.mark.parametrize(
    "ranges, problem",
    [
        ([(0, 0, HALF - 1)], "end at 0x7fffffff"),
        ([(0, 0, HALF - 1), (1, HALF + 1, 2**32 - 1)], "does not continue at 0x80000000"),
        ([(0, 1, 2**32 - 1)], "does not continue at 0x00000000"),
        ([], "at least one shard"),
    ],
)
def test_a_map_whose_ranges_do_not_tile_the_hash_space_is_refused(
    ranges: list[tuple[int, int, int]], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        ShardMap(ShardAssignment(s, "n:1", low, high) for s, low, high in ranges)


def test_a_shard_without_a_leader_has_none() -> None:
    routing = two_shards(leader_1="")
    assert routing.leader(1) is None
    assert routing.leader(99) is None


def test_a_leader_hint_changes_one_shard_only_in_a_new_map() -> None:
    routing = two_shards()
    hinted = routing.with_leader(1, "c:1")
    assert (hinted.leader(0), hinted.leader(1)) == ("a:1", "c:1")
    assert routing.leader(1) == "b:1"
    assert hinted.shard_for("/users/7") == routing.shard_for("/users/7")


def test_from_proto_reads_the_assignments_and_refuses_other_routers() -> None:
    message = pb.NamespaceShardsAssignment(
        assignments=[
            pb.ShardAssignment(
                shard=3,
                leader="n:1",
                int32_hash_range=pb.Int32HashRange(
                    min_hash_inclusive=0, max_hash_inclusive=2**32 - 1
                ),
            )
        ],
        shard_key_router=pb.XXHASH3,
    )
    routing = ShardMap.from_proto(message)
    assert (routing.shards, routing.leader(3), routing.shard_for("/x")) == ([3], "n:1", 3)
    message.shard_key_router = pb.UNKNOWN
    with pytest.raises(ValueError, match="only knows XXHASH3"):
        ShardMap.from_proto(message)
