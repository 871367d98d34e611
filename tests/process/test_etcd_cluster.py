"""The etcd benchmark peer's cluster and client against a real 3-member etcd on loopback
(slow, and skipped where the Debian ``etcd-server`` package is not installed)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import etcd_peer
import pytest

pytestmark = pytest.mark.process


def _processes_under(directory: Path) -> list[int]:
    """Pids of processes whose command line mentions `directory` (this test's own etcds)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(directory).encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("etcd") is None and not os.environ.get("CI"),
    reason="etcd not installed (apt-get install etcd-server; scripts/test.sh does when root, "
    "and CI runs this test always)",
)
def test_etcd_cluster_put_get_failover_restart_and_clean_stop(tmp_path: Path) -> None:
    async def write_until_accepted(client: etcd_peer.EtcdClient, key: bytes, value: bytes) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                await client.put(key, value)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def scenario(cluster: etcd_peer.EtcdCluster) -> None:
        endpoints = cluster.client_endpoints()
        async with etcd_peer.EtcdClient(endpoints, timeout_s=2.0) as client:
            revision = await client.put(b"greeting", b"hello")
            assert revision > 0
            assert await client.get(b"greeting") == b"hello"
            assert await client.get(b"missing") is None

            cluster.start_rss_sampling()
            killed = cluster.kill_leader()
            assert killed not in cluster.pids()
            await write_until_accepted(client, b"after-kill", b"still writable")
            assert await client.get(b"after-kill") == b"still writable"
            assert cluster.leader_index() != killed
            rss = cluster.stop_rss_sampling()
            assert set(rss) == {0, 1, 2} and all(10 < mb < 2048 for mb in rss.values())

            cluster.restart(killed)
        # The restarted member caught up on what was written while it was down.
        async with etcd_peer.EtcdClient([endpoints[killed]], timeout_s=5.0) as client:
            assert await client.get(b"after-kill") == b"still writable"

    with etcd_peer.EtcdCluster(tmp_path, members=3) as cluster:
        cluster.wait_ready()
        for pid in cluster.pids().values():
            assert b"--unsafe-no-fsync" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        asyncio.run(scenario(cluster))
        assert all(count > 0 for count in cluster.wal_fsync_counts().values())
        pids = list(cluster.pids().values())
    assert len(pids) == 3
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"etcd pid {pid} survived the cluster"
    assert _processes_under(tmp_path) == []
