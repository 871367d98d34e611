"""The restore of a Spark-hosted cluster from its archive, on the paths the Spark tier
does not reach: node directories that still hold the old cluster's data, a start that
fails after the driver planned the restore, and the restored nodes serving the archived
keys.

No SparkSession: the pieces a hosted cluster runs are run in this process as Spark would
run them. The driver's side is `HostedCluster._planned_restore` / `_restore_done` on a
handle that holds only its `HostingConfig` (they read nothing else), and the coordinator
a `CoordinatorThread` as `launch` makes it. Each node task's side is `node_task._restore`
and then `node_task._start_until_up`, on a `NodeTaskSpec` made as `submit_node_jobs`
makes it. The archive is written by such a cluster too: a hosted cluster's members are
named ``node<i>`` (a `standalone`'s are its addresses), and each node task rebuilds the
replicas of its own name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from quorumstore import event_loops
from quorumstore.archive.restore import RESTORE_MARKER, LatestRestore, archived_metadata
from quorumstore.archive.store import ArchiveStore
from quorumstore.client import Client, KeyNotFound
from quorumstore.coordinator.cluster_status import archive_behind
from quorumstore.coordinator.metadata_store import MetadataStore
from quorumstore.coordinator.server import CoordinatorServer
from quorumstore.node.node import Node
from quorumstore.protocol.coordinator import ClusterMetadata
from quorumstore.protocol.messages import ShardKey
from quorumstore.spark import node_task
from quorumstore.spark.config import HostingConfig
from quorumstore.spark.coordinator_thread import CoordinatorThread
from quorumstore.spark.hosting import ClusterStartError, HostedCluster, _serving, coordinator_config
from quorumstore.spark.node_jobs import node_task_spec
from quorumstore.storage.replica_files import load_incarnation, replica_dir
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.certificates import CertificateAuthority

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

NODES = 3
#: Fewer replicas than nodes: each node holds only some shards, so a node's restored
#: directory is told apart from another's.
REPLICATION_FACTOR = 2
SHARDS = 3
KEYS = [f"/restore-paths/{i:03d}" for i in range(90)]
_TIMEOUT_S = 60.0


def _config(data_dir: Path, archive_url: str) -> HostingConfig:
    """The settings of a hosted cluster with its data under `data_dir` and its metadata
    at the default place, ``data_dir/coordinator/metadata.pb``."""
    return HostingConfig.resolve(
        {},
        nodes=NODES,
        shards=SHARDS,
        replication_factor=REPLICATION_FACTOR,
        data_dir=data_dir,
        archive_url=archive_url,
        host="127.0.0.1",
        wal_sync=False,
        kv_memory_bytes=64 << 20,
        start_timeout_s=_TIMEOUT_S,
        failure_timeout_s=2.0,
        archive_snapshot_entries=40,
    )


def _driver(config: HostingConfig) -> HostedCluster:
    """The driver's handle of a new start, as far as planning the restore goes:
    `_planned_restore` and `_restore_done` read only the config (the Spark session,
    coordinator and node jobs of a real handle are not needed for them)."""
    cluster = HostedCluster.__new__(HostedCluster)
    cluster.config = config
    return cluster


class InProcessHosting:
    """The coordinator and the node tasks of a hosted cluster, run in this process: the
    coordinator as `launch` runs it in the driver, and node i as its task runs it up to
    the point where it only supervises (restore by the plan, if any, then start)."""

    def __init__(self, config: HostingConfig, restore: LatestRestore | None):
        self.config = config
        secret = ClusterSecret.generate()
        ca = CertificateAuthority.create()
        self.coordinator = CoordinatorThread(coordinator_config(config, "127.0.0.1", secret, ca))
        registry = self.coordinator.open_registry()
        assert registry is not None
        # Independent placement: no barrier to gather at.
        self.spec = node_task_spec(config, registry, secret, ca, barrier=False, restore=restore)
        self._loop = event_loops.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._tasks: list[concurrent.futures.Future[Node]] = []

    async def _node_task(self, index: int) -> Node:
        """`node_task._supervise` up to its supervision loop."""
        if self.spec.restore is not None:
            await asyncio.to_thread(
                node_task._restore, self.spec.restore, index, self.spec.node_dir(index)
            )
        return await node_task._start_until_up(self.spec, index)

    def start(self) -> None:
        """Starts the node tasks and then the coordinator, as `_launch` does; returns once
        every shard has a leader and all its replicas."""
        self._tasks = [
            asyncio.run_coroutine_threadsafe(self._node_task(i), self._loop)
            for i in range(self.config.nodes)
        ]
        started = self.coordinator.start()
        for task in self._tasks:
            task.result(_TIMEOUT_S)
        started.result(_TIMEOUT_S)
        deadline = time.monotonic() + _TIMEOUT_S
        while not _serving(self.coordinator.call(CoordinatorServer.cluster_status)):
            assert time.monotonic() < deadline, "the cluster did not serve"
            time.sleep(0.1)

    @property
    def nodes(self) -> list[Node]:
        """The nodes started so far."""
        done = [t for t in self._tasks if t.done() and not t.cancelled()]
        return [t.result() for t in done if t.exception() is None]

    @property
    def addresses(self) -> list[str]:
        return [node.address for node in self.nodes]

    def wait_archived(self) -> None:
        """Until the archive holds every committed entry and the coordinator's metadata,
        as `HostedCluster.stop` waits before it stops the nodes."""
        deadline = time.monotonic() + _TIMEOUT_S
        store = ArchiveStore(str(self.config.archive_url))
        while True:
            behind = archive_behind(self.coordinator.call(CoordinatorServer.cluster_status))
            if not behind and archived_metadata(store) is not None:
                return
            assert time.monotonic() < deadline, f"the archive is behind: {behind}"
            time.sleep(0.2)

    def close(self) -> None:
        nodes = self.nodes

        async def stop_nodes() -> None:
            for node in nodes:
                await node.stop()
            await event_loops.cancel_other_tasks()  # node tasks still retrying their start

        try:
            self.coordinator.stop()
            asyncio.run_coroutine_threadsafe(stop_nodes(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()


@dataclass(frozen=True)
class Archived:
    """What the module's first hosted cluster left: its archive, its node directories
    (with its data; it was stopped cleanly) and the writes the archive holds."""

    archive: Path
    data_dir: Path
    versions: dict[str, int]


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archived]:
    root = tmp_path_factory.mktemp("first-application")
    archive, data_dir = root / "archive", root / "hosts"
    cluster = InProcessHosting(_config(data_dir, str(archive)), restore=None)
    try:
        cluster.start()
        with Client(cluster.addresses) as client:
            versions = {key: client.put(key, key.encode()).version_id for key in KEYS}
            client.delete(KEYS[0])
        del versions[KEYS[0]]
        cluster.wait_archived()
    finally:
        cluster.close()
    yield Archived(archive, data_dir, versions)


def _archive_copy(archived: Archived, tmp_path: Path) -> str:
    """A test's own copy of the archive (a restored cluster archives on into it)."""
    copy = tmp_path / "archive"
    shutil.copytree(archived.archive, copy)
    return str(copy)


def _contents(directory: Path) -> dict[str, str]:
    """Every file under `directory` (relative path) -> digest of its bytes."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def _replicas(node_dir: Path) -> set[ShardKey]:
    return {
        (namespace.name, int(shard.name))
        for namespace in (node_dir / "shards").iterdir()
        for shard in namespace.iterdir()
    }


def _held_by(metadata: ClusterMetadata, member: str) -> set[ShardKey]:
    return {key for key, shard in metadata.shards.items() if member in shard.ensemble}


def _set_aside(node_dir: Path) -> list[Path]:
    return sorted(node_dir.parent.glob(f"{node_dir.name}.before-restore-*"))


# ------------------------------------------------------------------ tests


def test_old_data_is_moved_aside_once_and_each_node_gets_its_replicas(
    tmp_path: Path, archived: Archived
) -> None:
    """Node directories still holding the old cluster's data (one with a file of the
    operator's in it, one marked by an earlier restore) are moved aside whole; each then
    holds, under the restore's marker, a replica of exactly the shards its member name
    is placed on; a node task run again with the same plan (a restarted task) moves
    nothing and rebuilds nothing."""
    archive_url = _archive_copy(archived, tmp_path)
    hosts = tmp_path / "hosts"
    for i in (0, 1):  # node2's host is new: no directory
        shutil.copytree(archived.data_dir / f"node{i}", hosts / f"node{i}")
    (hosts / "node1" / "shards" / "operator-notes.txt").write_text("keep me")
    # node0 was itself restored once, by another restore: its marker names that one.
    (hosts / "node0" / RESTORE_MARKER).write_text("an-earlier-restore")
    before = {i: _contents(hosts / f"node{i}") for i in (0, 1)}
    assert all(before.values()) and "shards/operator-notes.txt" in before[1]

    restore = _driver(_config(hosts, archive_url))._planned_restore()
    assert restore is not None
    assert restore.archive_url == archive_url
    for i in range(NODES):
        node_task._restore(restore, i, hosts / f"node{i}")

    incarnations = {}
    for i in range(NODES):
        node_dir = hosts / f"node{i}"
        aside = _set_aside(node_dir)
        if i in (0, 1):
            assert len(aside) == 1, aside
            assert _contents(aside[0]) == before[i]  # moved whole, nothing lost
        else:
            assert aside == []
        assert (node_dir / RESTORE_MARKER).read_text() == restore.restore_id
        held = _held_by(restore.metadata, f"node{i}")
        assert held and _replicas(node_dir) == held
        assert not (node_dir / "shards" / "operator-notes.txt").exists()
        incarnations[i] = {key: load_incarnation(replica_dir(node_dir, key)) for key in held}
    # A new epoch: no restored replica keeps the old cluster's incarnation.
    for i in (0, 1):
        old = archived.data_dir / f"node{i}"
        for key, incarnation in incarnations[i].items():
            if replica_dir(old, key).exists():
                assert incarnation != load_incarnation(replica_dir(old, key))

    after = {i: _contents(hosts / f"node{i}") for i in range(NODES)}
    time.sleep(1.1)  # a second move aside would get a name of its own
    for i in range(NODES):
        node_task._restore(restore, i, hosts / f"node{i}")
    for i in range(NODES):
        node_dir = hosts / f"node{i}"
        assert len(_set_aside(node_dir)) == (1 if i in (0, 1) else 0)
        assert _contents(node_dir) == after[i]  # not rebuilt: same files, same incarnations
    assert sorted(p.name for p in hosts.iterdir() if ".restoring" in p.name) == []


def test_a_start_that_failed_after_planning_is_carried_on_with_the_same_plan(
    tmp_path: Path, archived: Archived
) -> None:
    """The metadata a failed start's plan saved does not make the next start take the
    cluster for one that needs no restore: it reads the plan kept at
    ``<metadataUrl>.restore-plan`` and carries it on, keeping the metadata the failed
    start's coordinator may have moved on since; once the cluster serves the plan is
    forgotten and a later start plans nothing."""
    config = _config(tmp_path / "hosts", _archive_copy(archived, tmp_path))
    metadata = MetadataStore(config.metadata_url)
    pending = Path(config.metadata_url + ".restore-plan")
    assert metadata.load() is None

    first = _driver(config)._planned_restore()
    assert first is not None
    assert metadata.load() == first.metadata
    assert pending.is_file()
    assert set(first.plans) == set(first.metadata.shards) and len(first.plans) == SHARDS

    # The start fails (a node job fails, the timeout passes); the application's next
    # start makes a new handle.
    again = _driver(config)._planned_restore()
    assert again is not None, "the next start took the restored metadata for a live cluster"
    assert again.restore_id == first.restore_id
    assert again.plans == first.plans
    assert again.metadata == first.metadata
    assert {key: s.known_commit_offset for key, s in again.metadata.shards.items()} == {
        key: s.known_commit_offset for key, s in first.metadata.shards.items()
    }

    # Failed between keeping the plan and saving the metadata: the plan's is saved.
    Path(config.metadata_url).unlink()
    third = _driver(config)._planned_restore()
    assert third is not None and third.restore_id == first.restore_id
    assert metadata.load() == first.metadata

    # The failed start's coordinator had moved the metadata on: that is kept.
    moved_on = replace(first.metadata, version=first.metadata.version + 5)
    metadata.save(moved_on)
    fourth = _driver(config)._planned_restore()
    assert fourth is not None and fourth.restore_id == first.restore_id
    assert metadata.load() == moved_on

    # The cluster serves: the plan is forgotten, and the next start restores nothing.
    _driver(config)._restore_done()
    assert not pending.exists()
    assert _driver(config)._planned_restore() is None
    assert metadata.load() == moved_on
    assert not pending.exists()


def test_the_restored_nodes_serve_the_archived_keys(tmp_path: Path, archived: Archived) -> None:
    """A new application's cluster, on hosts of which one still holds the old node's
    data, is restored by the plan and serves every archived key with its version (the
    deleted key stays deleted) and takes new writes; the plan is then forgotten. Node
    tasks started again with the same plan (Spark resubmits them with the same closure)
    keep their directories: the write made after the restore is still there."""
    hosts = tmp_path / "hosts"
    shutil.copytree(archived.data_dir / "node0", hosts / "node0")
    config = _config(hosts, _archive_copy(archived, tmp_path))
    driver = _driver(config)
    restore = driver._planned_restore()
    assert restore is not None
    cluster = InProcessHosting(config, restore)
    try:
        cluster.start()
        driver._restore_done()
        with Client(cluster.addresses) as client:
            for key, version in archived.versions.items():
                record = client.get(key)
                assert (record.value, record.version.version_id) == (key.encode(), version)
            with pytest.raises(KeyNotFound):
                client.get(KEYS[0])
            client.put("/restore-paths/after", b"new")
            assert client.get("/restore-paths/after").value == b"new"
    finally:
        cluster.close()
    assert not Path(config.metadata_url + ".restore-plan").exists()
    assert _driver(config)._planned_restore() is None

    restarted = InProcessHosting(config, restore)
    try:
        restarted.start()
        with Client(restarted.addresses) as client:
            assert client.get("/restore-paths/after").value == b"new"
            assert client.get(KEYS[1]).version.version_id == archived.versions[KEYS[1]]
    finally:
        restarted.close()
    assert [len(_set_aside(hosts / f"node{i}")) for i in range(NODES)] == [1, 0, 0]


def test_an_archive_of_a_larger_cluster_is_refused_naming_the_missing_nodes(
    tmp_path: Path, archived: Archived
) -> None:
    """An application with fewer nodes than the archived cluster has no task for some
    replicas: the start is refused at once, naming them, and plans nothing."""
    config = replace(_config(tmp_path / "hosts", _archive_copy(archived, tmp_path)), nodes=2)
    with pytest.raises(ClusterStartError, match=r"shards are on node2, which this application"):
        _driver(config)._planned_restore()
    assert MetadataStore(config.metadata_url).load() is None
    assert not Path(config.metadata_url + ".restore-plan").exists()
