"""Options of the DataFrame source that only the cluster can check, against a real
standalone server: namespaces it has and offsets within each shard's log."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from pyspark.sql.types import StructType

from quorumstore import Client
from quorumstore.client.data_service import DataClient
from quorumstore.spark.datasource_options import QuorumstoreOptionError, SourceOptions, Use, connect
from quorumstore.spark.datasource_stream import QuorumstoreChangeFeed
from quorumstore.testing import standalone_server

pytestmark = pytest.mark.integration

SHARDS = 2


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_server(tmp_path_factory.mktemp("standalone"), SHARDS, fsync=False) as a:
        with Client(a) as client:
            client.put_many({f"/k{i}": b"v" for i in range(20)})  # both shards get some
        yield a


def _feed(address: str, starting: dict[str, int]) -> QuorumstoreChangeFeed:
    options = SourceOptions.parse(
        {"address": address, "startingOffsets": json.dumps(starting)}, Use.STREAM_READ
    )
    return QuorumstoreChangeFeed(options, StructType())


def test_an_unknown_namespace_is_named_as_such_not_as_unreachable(address: str) -> None:
    options = SourceOptions.parse({"address": address, "namespace": "nosuch"}, Use.READ)
    with pytest.raises(QuorumstoreOptionError) as caught:
        connect(options)
    assert caught.value.getCondition() == "QUORUMSTORE_INVALID_OPTION"
    assert "has no namespace 'nosuch'" in str(caught.value)
    assert "this cluster has ['default']" in str(caught.value)


def test_starting_offsets_must_lie_within_each_shards_log(address: str) -> None:
    """Beyond the commit offset the stream silently waited for offsets never written."""
    with DataClient(address) as client:
        commits = {f"default/{s}": client.offsets(s).commit_offset for s in range(SHARDS)}
    assert all(c >= 0 for c in commits.values()), commits
    _feed(address, commits)  # the end of each log is a fine start
    _feed(address, {key: -1 for key in commits})  # so is the beginning (nothing expired)
    beyond = {**commits, "default/1": commits["default/1"] + 1}
    with pytest.raises(QuorumstoreOptionError) as caught:
        _feed(address, beyond)
    assert (
        f"{commits['default/1'] + 1} for shard default/1 is beyond its commit offset "
        f"{commits['default/1']}; start between -1 and {commits['default/1']}"
    ) in str(caught.value)
