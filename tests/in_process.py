"""What the integration tier's in-process clusters share: waiting for their shards."""

from __future__ import annotations

import asyncio

from quorumstore.coordinator.server import CoordinatorServer
from quorumstore.protocol.coordinator import ShardState


async def until_online(coordinator: CoordinatorServer, timeout_s: float = 30) -> None:
    """Returns once every shard in the coordinator's metadata is online."""

    async def online() -> None:
        while coordinator.engine is None or not all(
            m.state is ShardState.ONLINE for m in coordinator.engine.metadata.shards.values()
        ):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(online(), timeout_s)
