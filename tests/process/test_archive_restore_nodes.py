"""The archive of a cluster of separately started `node` and `coordinator` processes:
every disk lost, the coordinator's metadata too, and the same processes started again
with `--archive-url` restore the cluster by themselves (`coordinator/archive_recovery.py`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from cluster_harness import LocalCluster, poll_until
from quorumstore import Client
from quorumstore.coordinator.cluster_status import archive_behind

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

SHARDS = 2
KEYS = [f"/nodes-lost/{i:03d}" for i in range(120)]


def _cluster(root: Path, archive: Path, node_flags: list[str]) -> LocalCluster:
    return LocalCluster(
        root,
        nodes=3,
        shards=SHARDS,
        replication_factor=3,
        node_args=["--archive-url", str(archive), "--archive-snapshot-entries", "30", *node_flags],
        coordinator_args=["--archive-url", str(archive)],
    )


def _wait_archived(cluster: LocalCluster) -> None:
    poll_until(lambda: not archive_behind(cluster.status()), 60, "the archive to hold every commit")


def _lose_every_disk(cluster: LocalCluster) -> None:
    cluster.close()
    for node in cluster.nodes:
        shutil.rmtree(cluster.node_dir(node))
    shutil.rmtree(cluster.metadata_path.parent)


def test_nodes_and_a_coordinator_that_lost_every_disk_restore_by_themselves(
    tmp_path: Path,
) -> None:
    """Every archived write is back with its version; the coordinator said it restored,
    and the restored cluster takes new writes."""
    cluster = _cluster(tmp_path / "cluster", tmp_path / "archive", [])
    try:
        cluster.start()
        with Client(cluster.nodes) as client:
            versions = {key: client.put(key, key.encode()).version_id for key in KEYS}
        _wait_archived(cluster)
        _lose_every_disk(cluster)
        started = time.monotonic()
        cluster.start()
        restored_s = time.monotonic() - started
        log = cluster.coordinator.log_path.read_text()
        assert "no node holds a replica: restoring the cluster archived at" in log, log
        with Client(cluster.nodes) as client:
            for key in KEYS:
                record = client.get(key)
                assert (record.value, record.version.version_id) == (key.encode(), versions[key])
            client.put("/nodes-lost/after", b"new")
        print(f"restored {len(KEYS)} keys on {SHARDS} shards and came online in {restored_s:.1f} s")
    finally:
        cluster.close()


def test_nodes_that_archive_elsewhere_are_named_and_nothing_is_restored(
    tmp_path: Path,
) -> None:
    """Nodes restarted with another --archive-url than the coordinator's refuse its
    restore: the coordinator exits naming a node and both URLs, and saves no metadata."""
    archive, other = tmp_path / "archive", tmp_path / "other-archive"
    cluster = _cluster(tmp_path / "cluster", archive, [])
    try:
        cluster.start()
        with Client(cluster.nodes) as client:
            client.put(KEYS[0], b"v")
        _wait_archived(cluster)
        _lose_every_disk(cluster)
        cluster.add_node_args("--archive-url", str(other))
        for node in cluster.nodes:
            cluster.restart(node)
        cluster.coordinator.start()
        assert cluster.coordinator.popen is not None
        assert cluster.coordinator.popen.wait(60) != 0
        log = cluster.coordinator.log_path.read_text()
        assert "cannot rebuild its replicas from the archive at" in log, log
        assert f"archives to {other}" in log, log
        assert not cluster.metadata_path.exists()
    finally:
        cluster.close()
