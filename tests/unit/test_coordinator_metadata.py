"""Starting a coordinator: saved metadata (renamed nodes, mismatched node lists and shard
counts, bad URLs) checked before it serves anything."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from quorumstore.coordinator.metadata_store import MetadataError, MetadataStore
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
from quorumstore.protocol.coordinator import (
    ShardState,
    initial_metadata,
    placed_nodes,
    replace_node,
)

NODES = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


def test_replace_node_renames_ensemble_leader_and_eligible_set() -> None:
    metadata = initial_metadata(NODES, {"default": 3}, 2)
    key = ("default", 0)
    metadata.shards[key] = replace(
        metadata.shards[key],
        term=4,
        leader=NODES[0],
        state=ShardState.ONLINE,
        incarnations={NODES[0]: "i0", NODES[1]: "i1"},
    )
    moved = replace_node(metadata, NODES[0], "127.0.0.1:9000")
    assert moved.version == metadata.version + 1
    assert placed_nodes(moved) == {"127.0.0.1:9000", *NODES[1:]}
    shard = moved.shards[key]
    assert shard.leader == "127.0.0.1:9000" and shard.term == 4 and shard.state is ShardState.ONLINE
    assert shard.incarnations == {"127.0.0.1:9000": "i0", NODES[1]: "i1"}
    for before, after in zip(metadata.shards.values(), moved.shards.values(), strict=True):
        rename = {NODES[0]: "127.0.0.1:9000"}
        assert after.ensemble == tuple(rename.get(n, n) for n in before.ensemble)
        assert after.eligible == frozenset(rename.get(n, n) for n in before.eligible)
        assert (after.hash_range, after.known_commit_offset) == (
            before.hash_range,
            before.known_commit_offset,
        )


def test_coordinator_refuses_metadata_placed_on_other_nodes(tmp_path: Path) -> None:
    url = str(tmp_path / "metadata.pb")
    MetadataStore(url).save(initial_metadata(NODES, {"default": 2}, 3))
    config = CoordinatorServerConfig(
        nodes=[*NODES[:2], "127.0.0.1:7999"],
        metadata_url=url,
        internal_addresses={n: n.replace(":7", ":8") for n in [*NODES[:2], "127.0.0.1:7999"]},
        namespaces={"default": 2},
        replication_factor=3,
    )
    with pytest.raises(
        MetadataError, match=r"places shards on 127\.0\.0\.1:7003, which is not among"
    ):
        asyncio.run(CoordinatorServer(config).start())


def test_an_unknown_metadata_url_scheme_is_refused_with_what_to_do() -> None:
    with pytest.raises(MetadataError, match=r"cannot keep coordinator metadata at nope://x/y"):
        MetadataStore("nope://x/y")
