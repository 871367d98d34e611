"""The internal plane of real processes: a standalone's internal port turns every attack
away without the secret, before and after a restart; a cluster of `quorumstore node`
processes sharing a secret file works end to end; a node with another secret cannot join;
a node refuses to listen beyond loopback without a secret."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from cluster_harness import LocalCluster, poll_until, run_cli, start_cli
from quorumstore import Client
from quorumstore.node.data_format import REPLICATION_METADATA
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.wire.auth import ClusterSecret

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

KEYS = 50
_LISTENING = re.compile(r"listening on (\S+)")
_INTERNAL = re.compile(r"internal port \(.*\): (\S+)")


@contextmanager
def standalone(data_dir: Path) -> Iterator[tuple[str, str]]:
    """`quorumstore standalone` on free ports; yields (client address, internal address)."""
    process = start_cli("standalone", "--port", "0", "--data-dir", str(data_dir), "--no-fsync")
    lines: list[str] = []
    found = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if _INTERNAL.search(line):
                found.set()
        found.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert found.wait(60), "".join(lines)
        text = "".join(lines)
        client, internal = _LISTENING.search(text), _INTERNAL.search(text)
        assert client and internal, text
        yield client.group(1), internal.group(1)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def _attacks(channel: grpc.Channel) -> dict[str, Callable[[], Any]]:
    control = pb_grpc.NodeControlStub(channel)
    snapshot = pb.SnapshotChunk(
        namespace="default", shard=0, term=2, position=pb.LogPosition(term=2), last=True
    )
    update = pb.ShardAssignmentsUpdate(
        version=1 << 62,
        namespaces=[
            pb.NamespaceAssignments(
                namespace="default",
                shards=[pb.ShardAssignment(shard=0, leader="203.0.113.9:6648", term=1)],
            )
        ],
    )
    return {
        "NewTerm": lambda: control.NewTerm(
            pb.NewTermRequest(namespace="default", shard=0, term=2), timeout=5
        ),
        "SendSnapshot": lambda: pb_grpc.ReplicationStub(channel).SendSnapshot(
            iter([snapshot]), metadata=REPLICATION_METADATA, timeout=5
        ),
        "NewTerm 10^15": lambda: control.NewTerm(
            pb.NewTermRequest(namespace="default", shard=0, term=10**15), timeout=5
        ),
        "PushShardAssignments": lambda: control.PushShardAssignments(update, timeout=5),
        "NewTerm escaping": lambda: control.NewTerm(
            pb.NewTermRequest(namespace="../../../escaped", shard=0, term=1), timeout=5
        ),
        "BecomeLeader factor 0": lambda: control.BecomeLeader(
            pb.BecomeLeaderRequest(namespace="default", shard=0, term=1, replication_factor=0),
            timeout=5,
        ),
    }


def test_a_standalone_turns_every_attack_away_and_keeps_its_keys_across_a_restart(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with standalone(data) as (address, internal):
        with Client(address) as client:
            for i in range(KEYS):
                client.put(f"/k{i:02d}", b"v")
        with grpc.insecure_channel(internal) as channel:
            for name, attack in _attacks(channel).items():
                with pytest.raises(grpc.RpcError) as refused:
                    attack()
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        with Client(address) as client:
            assert len(client.list("/", "")) == KEYS
    assert not any(p.name == "escaped" for p in tmp_path.rglob("escaped"))
    with standalone(data) as (address, _), Client(address) as client:
        assert len(client.list("/", "")) == KEYS
        client.put("/after-restart", b"serving")


def test_three_node_processes_with_a_secret_file_serve_and_a_stranger_cannot_join(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(nodes=3, replication_factor=3)
    assert cluster.secret_file.stat().st_mode & 0o777 == 0o600
    with Client(cluster.nodes[0]) as client:
        for i in range(KEYS):
            client.put(f"/k{i:02d}", b"v")
        assert len(client.list("/", "")) == KEYS
    stranger = cluster.nodes[2]
    cluster.kill9(stranger)
    # The node comes back with another cluster's secret; the coordinator keeps this one.
    ClusterSecret.generate().write_file(cluster.secret_file)
    cluster.restart(stranger, wait=False)
    poll_until(
        lambda: "refuses this coordinator's cluster secret" in cluster.coordinator.log_tail(20_000),
        30,
        "the coordinator to report the refused secret",
    )
    assert "a wrong cluster secret" in cluster.log_text(stranger)
    time.sleep(1)
    assert not cluster.status().nodes_alive[stranger]
    with Client(cluster.nodes[0]) as client:  # a majority still serves
        client.put("/while-a-stranger-knocks", b"v")
        assert len(client.list("/", "")) == KEYS + 1


def test_a_node_refuses_to_listen_beyond_loopback_without_a_secret(tmp_path: Path) -> None:
    result = run_cli(
        "node",
        "--host",
        "0.0.0.0",
        "--advertise-host",
        "192.0.2.1",
        "--port",
        "0",
        "--internal-port",
        "0",
        "--data-dir",
        str(tmp_path / "node"),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "nothing to tell members of the cluster from strangers" in result.stderr
    assert "Traceback" not in result.stderr
