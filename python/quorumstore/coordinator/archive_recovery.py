"""A coordinator that starts without metadata but with an archive: the archive's cluster
is either this one, whose metadata alone was lost, or one whose every disk was lost.

The nodes' first reports tell which. A node that reports a replica still holds the
cluster's data: the coordinator takes the archived metadata (with the replicas'
incarnations) and elects as usual. When every node the archived cluster placed shards
on reports none, nothing but the archive holds the data: the coordinator plans a
restore at the last archived entries (`LatestRestore`), keeps the plan beside the
metadata location, has each node rebuild its replicas by it (`RebuildFromArchive`),
and only then saves the restored metadata and starts electing. An election before
that would count the empty replicas' new incarnations as the restored data. A
coordinator restarted halfway carries the same plan on; nodes that finished answer at
once.

Until it can tell, it waits: an empty node beside nodes that have not reported may be
the one disk that was replaced, and restoring over the others' data would lose what
they hold beyond the archive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import grpc

from quorumstore.archive.manifest import ArchiveError
from quorumstore.archive.restore import (
    LatestRestore,
    archived_metadata,
    forget_pending,
    load_pending,
    save_pending,
)
from quorumstore.archive.store import ArchiveStore
from quorumstore.coordinator.metadata_store import (
    MetadataError,
    MetadataStore,
    keep_archived_copy,
)
from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import ClusterMetadata, placed_nodes
from quorumstore.protocol.messages import NodeStatus

log = logging.getLogger(__name__)

#: How often the coordinator says which nodes it still waits for.
_WAITING_LOG_S = 10.0
#: Pause before calling a node that could not be reached again.
_RETRY_S = 1.0
#: A node call's failures that pass: the node is starting, restarting or unreachable.
_PASSING = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)

#: Sends a node (by name) its part of a restore; raises the call's AioRpcError.
RebuildCall = Callable[[str, pb.RebuildFromArchiveRequest], Awaitable[object]]


class ArchiveRecovery:
    """Decides between the archived metadata and a whole-cluster restore, and carries
    the restore out (see the module docstring)."""

    def __init__(
        self,
        archive: ArchiveStore,
        store: MetadataStore,
        check_placed: Callable[[ClusterMetadata, str], None],
        reports: Callable[[], Mapping[str, NodeStatus | None]],
        rebuild: RebuildCall,
    ) -> None:
        """`check_placed(metadata, where)` raises if `metadata` places shards on nodes
        that are not configured; `reports()` are the nodes' first reports so far."""
        self._archive = archive
        self._store = store
        self._check_placed = check_placed
        self._reports = reports
        self._rebuild = rebuild

    async def recover(self) -> ClusterMetadata | None:
        """The metadata to start from, saved; None if the archive holds no cluster."""
        loop = asyncio.get_running_loop()
        try:
            restore = await loop.run_in_executor(None, load_pending, self._store.url)
            if restore is not None:
                log.warning("carrying on with the restore planned at an earlier start")
            else:
                archived = await loop.run_in_executor(None, archived_metadata, self._archive)
                if archived is None:
                    return None
                self._check_placed(archived, f"the archive at {self._archive.url}")
                if await self._replicas_survive(sorted(placed_nodes(archived))):
                    await loop.run_in_executor(
                        None, keep_archived_copy, self._store, self._archive.url, archived
                    )
                    return archived
                restore = await loop.run_in_executor(None, LatestRestore.plan, self._archive)
                await loop.run_in_executor(None, save_pending, self._store.url, restore)
                log.warning(
                    "no coordinator metadata at %s and no node holds a replica: restoring the "
                    "cluster archived at %s at its last archived entries (%s)",
                    self._store.url,
                    self._archive.url,
                    ", ".join(
                        f"{n}/{i} at offset {shard.known_commit_offset}"
                        for (n, i), shard in sorted(restore.metadata.shards.items())
                    ),
                )
        except ArchiveError as e:
            raise MetadataError(f"cannot recover the cluster from its archive: {e}") from None
        await self._rebuild_members(restore)
        await loop.run_in_executor(None, self._store.save, restore.metadata)
        await loop.run_in_executor(None, forget_pending, self._store.url)
        log.warning("restored the cluster archived at %s; electing leaders", self._archive.url)
        return restore.metadata

    async def _replicas_survive(self, members: list[str]) -> bool:
        """Whether a node holds replicas (True as soon as one reports one); False once
        every member reported none."""
        next_log = time.monotonic() + _WAITING_LOG_S
        while True:
            reports = self._reports()
            if any(r is not None and r.shards for r in reports.values()):
                return True
            silent = [m for m in members if reports.get(m) is None]
            if not silent:
                return False
            if time.monotonic() >= next_log:
                next_log += _WAITING_LOG_S
                log.warning(
                    "no coordinator metadata and the nodes that reported hold no replica: "
                    "waiting for %s to report before restoring the cluster from %s",
                    ", ".join(silent),
                    self._archive.url,
                )
            await asyncio.sleep(0.1)

    async def _rebuild_members(self, restore: LatestRestore) -> None:
        """Has every member rebuild its replicas by `restore`, calling unreachable ones
        again until they answer; MetadataError if one refuses."""
        request = pb.RebuildFromArchiveRequest(plan=restore.to_json())

        async def rebuild(member: str) -> None:
            while True:
                try:
                    await self._rebuild(member, request)
                except grpc.aio.AioRpcError as e:
                    if e.code() in _PASSING:
                        await asyncio.sleep(_RETRY_S)
                        continue
                    raise MetadataError(
                        f"node {member} cannot rebuild its replicas from the archive at "
                        f"{restore.archive_url}: {e.code().name} {e.details()}"
                    ) from None
                log.warning("node %s rebuilt its replicas from the archive", member)
                return

        await asyncio.gather(*(rebuild(m) for m in sorted(placed_nodes(restore.metadata))))
