"""Two real nodes on loopback with one shard: the first leads it, the second follows.

For integration tests that drive a leader's `ShardHost` directly and watch a real
follower answer over the internal plane.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from quorumstore.node.data_format import REPLICATION_METADATA
from quorumstore.node.node import Node, NodeConfig
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.protocol.messages import ShardKey
from quorumstore.protocol.types import EMPTY_POSITION
from quorumstore.wire import replication as wire


@asynccontextmanager
async def leader_and_follower(
    data_dir: Path, shard: ShardKey, **config: Any
) -> AsyncIterator[tuple[Node, Node]]:
    """Starts both nodes (each with the `NodeConfig` options in `config`), makes the
    first the shard's leader in term 1 with replication factor 2 (each write commits on
    the follower's Ack), and stops both on leaving."""
    leader = Node(NodeConfig(data_dir / "a", port=0, **config))
    follower = Node(NodeConfig(data_dir / "b", port=0, **config))
    nodes = [await leader.start(), await follower.start()]
    internal = [leader.internal_address, follower.internal_address]
    leader.transport.set_addresses(
        dict(zip(nodes, internal, strict=True)), dict(zip(nodes, nodes, strict=True))
    )
    try:
        for address in internal:
            async with grpc.aio.insecure_channel(address) as channel:
                await pb_grpc.NodeControlStub(channel).NewTerm(
                    pb.NewTermRequest(namespace=shard[0], shard=shard[1], term=1),
                    metadata=REPLICATION_METADATA,
                    timeout=10,
                )
        async with grpc.aio.insecure_channel(internal[0]) as channel:
            await pb_grpc.NodeControlStub(channel).BecomeLeader(
                pb.BecomeLeaderRequest(
                    namespace=shard[0],
                    shard=shard[1],
                    term=1,
                    replication_factor=2,
                    follower_map={nodes[1]: wire.position_to_pb(EMPTY_POSITION)},
                ),
                metadata=REPLICATION_METADATA,
                timeout=10,
            )
        yield leader, follower
    finally:
        await follower.stop()
        await leader.stop()
