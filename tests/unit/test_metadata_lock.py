"""One coordinator per metadata location: the lock beside a local metadata file, and
the check that rebuilt metadata fits the replicas the nodes hold."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from quorumstore.coordinator.metadata_store import MetadataError, MetadataStore
from quorumstore.coordinator.server import (
    CoordinatorServer,
    CoordinatorServerConfig,
    check_replicas_fit,
)
from quorumstore.protocol.coordinator import initial_metadata
from quorumstore.protocol.messages import NodeStatus, ShardStatus
from quorumstore.protocol.types import LogPosition, Role

NODES = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


def test_a_held_location_is_refused_naming_its_holder_until_released(tmp_path: Path) -> None:
    url = str(tmp_path / "coordinator" / "metadata.pb")
    first, second = MetadataStore(url), MetadataStore(url)
    first.hold()
    assert first.lock_path == tmp_path / "coordinator" / "metadata.pb.lock"
    assert first.lock_path.read_text().startswith(f"pid {os.getpid()} on ")
    with pytest.raises(MetadataError, match=rf"in use by another coordinator \(pid {os.getpid()} "):
        second.hold()
    first.release()
    second.hold()
    second.release()


def test_the_lock_of_a_process_killed_9_is_free(tmp_path: Path) -> None:
    url = str(tmp_path / "metadata.pb")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import time\n"
                "from quorumstore.coordinator.metadata_store import MetadataStore\n"
                f"MetadataStore({url!r}).hold()\n"
                "print('held', flush=True)\n"
                "time.sleep(60)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(MetadataError, match=rf"\(pid {holder.pid} on "):
            MetadataStore(url).hold()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    store = MetadataStore(url)
    store.hold()
    store.release()


def test_object_store_locations_are_not_held() -> None:
    store = MetadataStore("memory://quorumstore-lock-test/metadata.pb")
    assert store.lock_path is None
    store.hold()
    MetadataStore("memory://quorumstore-lock-test/metadata.pb").hold()


def _config(url: str, shards: int = 2, nodes: list[str] = NODES) -> CoordinatorServerConfig:
    return CoordinatorServerConfig(
        nodes=nodes,
        metadata_url=url,
        internal_addresses={n: n.replace(":70", ":80") for n in nodes},
        namespaces={"default": shards},
        replication_factor=3,
    )


def test_a_second_coordinator_server_on_one_path_fails_to_start(tmp_path: Path) -> None:
    """Its nodes are unreachable (nothing listens): a start that makes new metadata
    does not wait for them."""
    url = str(tmp_path / "metadata.pb")

    async def run() -> None:
        first = CoordinatorServer(_config(url))
        await first.start()
        try:
            with pytest.raises(MetadataError, match="in use by another coordinator"):
                await CoordinatorServer(_config(url)).start()
        finally:
            await first.stop()
        again = CoordinatorServer(_config(url))
        await again.start()
        await again.stop()

    asyncio.run(run())


def _holding(node: str, *shards: int, term: int = 4) -> NodeStatus:
    return NodeStatus(
        node,
        tuple(
            ShardStatus(("default", s), term, Role.FOLLOWER, LogPosition(term, 10, 0), 9)
            for s in shards
        ),
    )


def test_new_nodes_make_a_new_cluster_and_fitting_replicas_a_rebuilt_one() -> None:
    config = _config("unused", shards=2)
    metadata = initial_metadata(NODES, {"default": 2}, 3)
    assert not check_replicas_fit(metadata, [_holding(n) for n in NODES], config)
    wiped = _holding(NODES[2])
    assert check_replicas_fit(metadata, [_holding(NODES[0], 0, 1), wiped], config)


_HELD_3_OF_2 = "holds default/0, default/1, default/2 where it would hold default/0, default/1"
_HELD_2_OF_3 = "holds default/0, default/1 where it would hold default/0, default/1, default/2"
_HELD_3_OF_0_2 = "holds default/0, default/1, default/2 where it would hold default/0, default/2"


@pytest.mark.parametrize(
    ("held", "shards", "nodes", "misfit"),
    [
        ((0, 1, 2), 2, NODES, _HELD_3_OF_2),
        ((0, 1), 3, NODES, _HELD_2_OF_3),
        ((0, 1, 2), 3, [*NODES, "127.0.0.1:7004"], _HELD_3_OF_0_2),
    ],
)
def test_replicas_that_do_not_fit_the_rebuilt_metadata_are_refused(
    held: tuple[int, ...], shards: int, nodes: list[str], misfit: str
) -> None:
    """Another shard count either way, or the nodes in another order."""
    config = _config("/data/metadata.pb", shards=shards, nodes=nodes)
    metadata = initial_metadata(nodes, {"default": shards}, 3)
    with pytest.raises(MetadataError) as refused:
        check_replicas_fit(metadata, [_holding(NODES[0], *held)], config)
    assert misfit in str(refused.value)
    assert "no coordinator metadata at /data/metadata.pb" in str(refused.value)
    assert "start the coordinator with the shard count, replication factor and nodes" in str(
        refused.value
    )
