"""A node whose address is decided where it runs tells the coordinator where it is.

On a Spark cluster a node binds on its executor's host, on a free port, so nobody can
configure its address in advance. It calls the coordinator's `CoordinatorRegistry`
(on the coordinator's internal port, as a member: cluster secret or mutual TLS) with
its member name and addresses; the coordinator then dials it and hands its addresses
to the other members and to clients. The node registers again whenever the
coordinator has not pinged it for `REREGISTER_AFTER_S`: a new coordinator (the driver
restarted) or a coordinator that lost track of it learns where it is within seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

import grpc

from quorumstore.backoff import DoublingBackoff
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.wire.membership import Membership

log = logging.getLogger(__name__)

#: Without a ping for this long, the node registers again.
REREGISTER_AFTER_S = 1.0
#: How often the node checks whether it is due to register again.
CHECK_INTERVAL_S = 0.25
_REGISTER_TIMEOUT_S = 5.0
#: A coordinator unreachable for this long is warned about; a shorter gap (it restarts,
#: or stops just before its application's node tasks do) is logged at debug level.
WARN_AFTER_S = 5.0


class RegisteringNode(Protocol):
    """What registration needs of a node (a `Node`)."""

    name: str
    address: str
    internal_address: str
    #: When the coordinator last pinged the node (monotonic seconds).
    last_ping_at: float


async def keep_registered(node: RegisteringNode, coordinator: str, membership: Membership) -> None:
    """Registers `node` with the coordinator at `coordinator` whenever it is not pinged."""
    request = pb.RegisterRequest(
        node_name=node.name,
        client_address=node.address,
        internal_address=node.internal_address,
    )
    backoff = DoublingBackoff(first_s=CHECK_INTERVAL_S, max_s=5.0)
    warned = False
    failing_since: float | None = None
    async with membership.channel(coordinator) as channel:
        registry = pb_grpc.CoordinatorRegistryStub(channel)
        while True:
            if time.monotonic() - node.last_ping_at < REREGISTER_AFTER_S:
                await asyncio.sleep(CHECK_INTERVAL_S)
                continue
            try:
                await registry.Register(
                    request, timeout=_REGISTER_TIMEOUT_S, metadata=membership.metadata
                )
            except grpc.aio.AioRpcError as e:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                due = not warned and now - failing_since >= WARN_AFTER_S
                level = logging.WARNING if due else logging.DEBUG
                warned = warned or due
                log.log(
                    level,
                    "node %s could not register with the coordinator at %s (%s: %s); retrying",
                    node.name,
                    coordinator,
                    e.code().name,
                    e.details(),
                )
                await asyncio.sleep(backoff.delay_after())
                continue
            if warned:
                log.info("node %s registered with the coordinator at %s", node.name, coordinator)
            warned, failing_since = False, None
            backoff = DoublingBackoff(first_s=CHECK_INTERVAL_S, max_s=5.0)
            # Give the coordinator time to dial in before registering again.
            await asyncio.sleep(REREGISTER_AFTER_S + CHECK_INTERVAL_S)
