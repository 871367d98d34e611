"""The official Oxia Python client (`oxia` 0.2.1) against `quorumstore standalone` and
against a cluster of 3 `quorumstore node` processes (replication factor 3).

This is the compatibility claim tested end to end: an unmodified Oxia client
discovers the shards, routes by its own hash, and sees Oxia's semantics for puts,
gets, conditional writes, deletes and hierarchical scans merged across shards.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import grpc
import oxia
import oxia.ex
import pytest

from cluster_harness import LocalCluster
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.testing import official_oxia_client, standalone_server
from quorumstore.wire.keys import compare_keys

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

SHARDS = 3


@pytest.fixture(scope="module", params=["standalone", "cluster"])
def standalone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A `quorumstore standalone` process with SHARDS shards, or a 3-node cluster with
    SHARDS shards at replication factor 3; yields a client address."""
    data_dir = tmp_path_factory.mktemp(request.param)
    if request.param == "standalone":
        with standalone_server(data_dir / "data", SHARDS) as address:
            yield address
        return
    cluster = LocalCluster(data_dir, nodes=3, shards=SHARDS, replication_factor=3)
    try:
        cluster.start()
        yield cluster.nodes[0]
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def module_client(standalone: str) -> Iterator[oxia.Client]:
    client = official_oxia_client(standalone)
    yield client
    client.close()


@pytest.fixture
def client(module_client: oxia.Client) -> oxia.Client:
    """The module's client over an empty store."""
    for key in module_client.list("", ""):
        module_client.delete(key)
    return module_client


def hierarchical(keys: list[str]) -> list[str]:
    return sorted(keys, key=functools.cmp_to_key(compare_keys))


def keys_per_shard(address: str, keys: list[str]) -> dict[int, int]:
    """How many of `keys` each shard holds, asked shard by shard with our own stub."""
    with grpc.insecure_channel(address) as channel:
        stub = oxia_client_pb2_grpc.OxiaClientStub(channel)
        counts = {}
        for shard in range(SHARDS):
            listed = [k for r in stub.List(pb.ListRequest(shard=shard)) for k in r.keys]
            counts[shard] = len(set(listed) & set(keys))
    return counts


def test_put_and_get(client: oxia.Client) -> None:
    key, version = client.put("/users/alice", b"hello")
    assert key == "/users/alice"
    assert version.modifications_count() == 0
    assert not version.is_ephemeral()

    got_key, value, got_version = client.get("/users/alice")
    assert (got_key, value) == ("/users/alice", b"hello")
    assert got_version.version_id() == version.version_id()
    assert got_version.created_timestamp() == version.created_timestamp()

    _, second = client.put("/users/alice", "again")  # str values are UTF-8 encoded
    assert second.modifications_count() == 1
    assert second.version_id() > version.version_id()
    assert second.created_timestamp() == version.created_timestamp()
    assert client.get("/users/alice", include_value=False)[1] is None

    with pytest.raises(oxia.ex.KeyNotFound):
        client.get("/users/nobody")


def test_conditional_put(client: oxia.Client) -> None:
    absent = oxia.EXPECTED_RECORD_DOES_NOT_EXIST
    _, version = client.put("/lock", b"mine", expected_version_id=absent)
    with pytest.raises(oxia.ex.UnexpectedVersionId):
        client.put("/lock", b"theirs", expected_version_id=absent)
    with pytest.raises(oxia.ex.UnexpectedVersionId):
        client.put("/lock", b"theirs", expected_version_id=version.version_id() + 1)
    _, updated = client.put("/lock", b"still mine", expected_version_id=version.version_id())
    assert client.get("/lock")[1] == b"still mine"
    assert updated.modifications_count() == 1


def test_delete(client: oxia.Client) -> None:
    _, version = client.put("/tmp/file", b"x")
    with pytest.raises(oxia.ex.UnexpectedVersionId):
        client.delete("/tmp/file", expected_version_id=version.version_id() + 1)
    assert client.delete("/tmp/file", expected_version_id=version.version_id()) is True
    assert client.delete("/tmp/file") is False
    with pytest.raises(oxia.ex.KeyNotFound):
        client.get("/tmp/file")


def test_list_and_range_scan_merge_shards_in_hierarchical_order(
    client: oxia.Client, standalone: str
) -> None:
    keys = [f"/dir/{i:02}" for i in range(30)] + [f"/dir/{i:02}/sub" for i in range(10)]
    keys += ["/dir", "/a", "/dir0"]
    for key in keys:
        client.put(key, key.encode())
    spread = keys_per_shard(standalone, keys)
    assert sum(1 for n in spread.values() if n) >= 2, spread  # really across shards

    expected = hierarchical(keys)
    assert client.list("", "") == expected
    # One level below /dir: "/dir/00/sub" sorts after "/dir/~", a level deeper.
    assert client.list("/dir/", "/dir/~") == [f"/dir/{i:02}" for i in range(30)]

    scanned = list(client.range_scan("/dir/00/", "/dir/~/"))
    assert [k for k, _, _ in scanned] == [f"/dir/{i:02}/sub" for i in range(10)]
    assert all(value == key.encode() for key, value, _ in scanned)


def test_get_with_comparison_across_shards(client: oxia.Client) -> None:
    for key in ["/n/10", "/n/20", "/n/30", "/n/20/x"]:
        client.put(key, key.encode())
    floor = client.get("/n/25", comparison_type=oxia.ComparisonType.FLOOR)
    assert floor[:2] == ("/n/20", b"/n/20")
    assert client.get("/n/25", comparison_type=oxia.ComparisonType.CEILING)[0] == "/n/30"
    assert client.get("/n/20", comparison_type=oxia.ComparisonType.LOWER)[0] == "/n/10"
    assert client.get("/n/30", comparison_type=oxia.ComparisonType.HIGHER)[0] == "/n/20/x"


def test_delete_range_across_shards(client: oxia.Client) -> None:
    keys = [f"/r/{i:02}" for i in range(20)] + ["/r/05/deeper", "/s/1"]
    for key in keys:
        client.put(key, b"v")
    client.delete_range("/r/05", "/r/15")
    remaining = [f"/r/{i:02}" for i in range(20) if not 5 <= i < 15] + ["/r/05/deeper", "/s/1"]
    assert client.list("", "") == hierarchical(remaining)
