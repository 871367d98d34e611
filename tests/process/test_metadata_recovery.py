"""A coordinator whose metadata is lost, damaged or already in use, with real processes.

Once terms have passed the first, metadata rebuilt from scratch starts its shards in
terms the replicas have left behind. The coordinator elects above the terms the
replicas report and keeps every acknowledged write; rebuilt metadata that does not fit
the replicas (another shard count) is refused in one line saying what to do. A second
coordinator on a metadata path in use is refused; one killed -9 leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster_harness import LocalCluster, run_cli
from quorumstore import Client
from quorumstore.testing import standalone_server

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

#: How long a coordinator with rebuilt metadata may take to bring every shard online.
REBUILD_ONLINE_S = 20.0


def _put(client: Client, keys: dict[str, int], prefix: str, count: int) -> None:
    for i in range(count):
        key = f"{prefix}/{i:03d}"
        keys[key] = client.put(key, key.encode()).version_id


def _assert_all_there(client: Client, keys: dict[str, int]) -> None:
    lost = {
        key: version
        for key, version in keys.items()
        if (record := client.get(key)).value != key.encode() or record.version.version_id != version
    }
    assert lost == {}, f"{len(lost)} of {len(keys)} acknowledged writes differ"


def test_cluster_whose_metadata_is_deleted_after_elections_rebuilds_it_and_keeps_every_write(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(shards=2)
    keys: dict[str, int] = {}
    with Client(cluster.nodes) as client:
        _put(client, keys, "/before", 30)
    for round_ in range(3):  # three leaders killed, the coordinator killed -9 after each
        leader = cluster.leader_of(0)
        assert leader is not None
        term = cluster.shard_metadata(0).term
        cluster.kill9(leader)
        cluster.wait_new_leader(0, not_on=leader, after_term=term)
        cluster.restart(leader)
        cluster.wait_rejoined(leader)
        cluster.kill9_coordinator()
        cluster.restart_coordinator()  # its lock died with it
        cluster.wait_online()
        with Client(cluster.nodes) as client:
            _put(client, keys, f"/round{round_}", 20)
    before = {m.shard: m.term for m in cluster.status().metadata.shards}
    assert before[0] >= 3

    cluster.kill9_coordinator()
    cluster.metadata_path.unlink()
    started = time.monotonic()
    cluster.restart_coordinator()
    status = cluster.wait_online(REBUILD_ONLINE_S)
    print(f"rebuilt metadata online in {time.monotonic() - started:.1f} s")
    assert all(m.term > before[m.shard] for m in status.metadata.shards), status.metadata
    assert "the nodes hold replicas: rebuilt it" in cluster.coordinator.log_tail(20_000)
    for node in cluster.nodes:
        cluster.wait_rejoined(node)
    with Client(cluster.nodes) as client:
        _assert_all_there(client, keys)
        _put(client, keys, "/after", 20)
        _assert_all_there(client, keys)


def test_a_second_coordinator_on_the_metadata_path_is_refused_in_one_line(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster()
    result = run_cli(*cluster.coordinator.argv[:-2], "--admin-port", "0", timeout_s=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is in use by another coordinator" in result.stderr
    assert f"pid {cluster.pid('coordinator')} on " in result.stderr
    assert "Traceback" not in result.stderr
    cluster.wait_online()  # the first one goes on


def test_standalone_restarted_three_times_then_its_metadata_damaged_or_deleted_serves_its_data(
    tmp_path: Path,
) -> None:
    """The damaged file's error says to move it aside and restart; doing so works."""
    data = tmp_path / "data"
    metadata = data / "coordinator" / "metadata.pb"
    keys: dict[str, int] = {}
    for round_ in range(4):
        with standalone_server(data, 2) as address, Client(address) as client:
            _put(client, keys, f"/start{round_}", 10)

    metadata.write_bytes(b"\xff" * 40)
    result = run_cli("standalone", "--shards", "2", "--port", "0", "--data-dir", str(data))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is unreadable" in result.stderr and "move it aside" in result.stderr
    assert "backup" not in result.stderr and "Traceback" not in result.stderr

    metadata.rename(metadata.with_name("metadata.pb.damaged"))
    with standalone_server(data, 2) as address, Client(address) as client:
        _assert_all_there(client, keys)
        _put(client, keys, "/moved-aside", 10)

    metadata.unlink()
    with standalone_server(data, 2) as address, Client(address) as client:
        _assert_all_there(client, keys)
        _put(client, keys, "/deleted", 10)
        _assert_all_there(client, keys)


def test_metadata_rebuilt_for_another_shard_count_is_refused_with_what_to_do(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    keys: dict[str, int] = {}
    with standalone_server(data, 2) as address, Client(address) as client:
        _put(client, keys, "/two", 20)
    (data / "coordinator" / "metadata.pb").unlink()
    for shards in ("1", "3"):
        result = run_cli("standalone", "--shards", shards, "--port", "0", "--data-dir", str(data))
        assert result.returncode == 2, result.stdout + result.stderr
        assert "do not fit metadata rebuilt for 'default' with " in result.stderr
        assert "holds default/0, default/1 where it would hold" in result.stderr
        assert "start the coordinator with the shard count" in result.stderr
        assert "Traceback" not in result.stderr
    with standalone_server(data, 2) as address, Client(address) as client:
        _assert_all_there(client, keys)
