"""`quorumstore standalone` restarted on its data directory, on another port.

A standalone server's identity is its data directory: `--port 0` picks a new port on
every start, and the shards must follow. Before this was handled, the coordinator
kept electing the old address and no shard ever got a leader again.
"""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import pytest

from cluster_harness import run_cli, start_cli
from quorumstore import Client
from quorumstore.client import QuorumStoreError
from quorumstore.coordinator.metadata_store import MetadataStore
from quorumstore.protocol.coordinator import initial_metadata
from quorumstore.testing import standalone_server

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]


def test_restart_on_a_new_port_serves_the_data_written_before(tmp_path: Path) -> None:
    """Also with another --shards: shard counts are fixed when the data is created."""
    data = tmp_path / "data"
    with standalone_server(data, 2) as first, Client(first) as client:
        versions = {
            f"/restart/{i}": client.put(f"/restart/{i}", f"v{i}".encode()).version_id
            for i in range(20)
        }
    with standalone_server(data, 5) as second:
        assert second != first
        with Client(second) as client:
            for key, version in versions.items():
                record = client.get(key)
                assert (record.value, record.version.version_id) == (
                    f"v{key.rsplit('/', 1)[1]}".encode(),
                    version,
                )
            client.put("/restart/after", b"new")
            assert client.get("/restart/after").value == b"new"


def test_data_directory_of_a_cluster_is_refused_in_one_line(tmp_path: Path) -> None:
    metadata = initial_metadata(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], {"default": 2}, 3)
    MetadataStore(str(tmp_path / "coordinator" / "metadata.pb")).save(metadata)
    result = run_cli("standalone", "--port", "0", "--data-dir", str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "describes a cluster of 3 nodes" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_standalone_whose_file_writes_fail_stops_in_one_line_and_keeps_what_it_acked(
    tmp_path: Path,
) -> None:
    """Its files capped (RLIMIT_FSIZE on the live process: writes fail with EFBIG, as on a
    full disk), `standalone` stops with exit status 1 and one line naming the shard and
    the error, instead of serving a shard it can no longer write; started again, it
    serves every write it acknowledged."""
    data = tmp_path / "data"
    process = start_cli(
        "standalone", "--port", "0", "--data-dir", str(data), stderr=subprocess.PIPE
    )
    acked: list[str] = []
    try:
        assert process.stdout is not None and process.stderr is not None
        address = process.stdout.readline().rsplit(" ", 1)[-1].strip()
        with Client(address, request_timeout_s=5) as client:
            for i in range(5000):
                if i == 20:
                    limit = (64 * 1024, resource.RLIM_INFINITY)
                    resource.prlimit(process.pid, resource.RLIMIT_FSIZE, limit)
                try:
                    client.put(f"/full/{i:04d}", b"x" * 1000)
                except QuorumStoreError:
                    break
                acked.append(f"/full/{i:04d}")
        assert 20 <= len(acked) < 5000
        assert process.wait(30) == 1
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert stderr.count("quorumstore: error: shard default/0 on node") == 1, stderr
    assert "File too large" in stderr and "restart the node" in stderr, stderr
    with standalone_server(data) as again, Client(again) as client:
        assert [key for key in acked if client.get(key).value != b"x" * 1000] == []
