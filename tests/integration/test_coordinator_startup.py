"""A coordinator started over saved metadata keeps its shard counts and says so."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from quorumstore.coordinator.metadata_store import MetadataStore
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
from quorumstore.protocol.coordinator import initial_metadata

pytestmark = pytest.mark.integration

NODES = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


def test_coordinator_keeps_saved_shard_counts_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(tmp_path / "metadata.pb")
    MetadataStore(url).save(initial_metadata(NODES, {"default": 2}, 3))
    config = CoordinatorServerConfig(
        nodes=NODES,
        metadata_url=url,
        internal_addresses={n: n.replace(":70", ":80") for n in NODES},
        namespaces={"default": 5},
        replication_factor=3,
    )

    async def start_and_stop() -> int:
        server = CoordinatorServer(config)
        await server.start()
        try:
            assert server.engine is not None
            return len(server.engine.metadata.shards)
        finally:
            await server.stop()

    with caplog.at_level(logging.WARNING, logger="quorumstore.coordinator.server"):
        assert asyncio.run(start_and_stop()) == 2
    assert "holds 'default' with 2 shards; keeping it, not 'default' with 5 shards" in caplog.text
