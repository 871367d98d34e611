"""Options of the DataFrame source and sink: refused before any Spark task runs, saying why.

The checks that ask the cluster run against a real standalone server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from pyspark.sql.types import StructType

from quorumstore import Client
from quorumstore.data_client import DataClient
from quorumstore.spark.datasource_options import (
    QuorumstoreOptionError,
    SourceOptions,
    Use,
    connect,
)
from quorumstore.spark.datasource_stream import QuorumstoreChangeFeed
from quorumstore.spark.datasource_write import check_stream_mode
from quorumstore.testing import standalone_server

SHARDS = 2


def _refused(options: dict[str, str], use: Use, condition: str, fragment: str) -> None:
    with pytest.raises(QuorumstoreOptionError) as caught:
        SourceOptions.parse(options, use)
    assert caught.value.getCondition() == condition, caught.value
    assert fragment in str(caught.value), caught.value


@pytest.mark.parametrize("name", ["connectTimeout", "retryTimeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "soon"])
def test_a_timeout_must_be_a_positive_finite_number(name: str, value: str) -> None:
    """A NaN timeout never expired: a read of an unreachable address retried for ever."""
    _refused(
        {"address": "127.0.0.1:1", name: value},
        Use.READ,
        "QUORUMSTORE_INVALID_OPTION",
        f"option {name} must be a positive finite number, got {value!r}",
    )
    assert SourceOptions.parse({"address": "h:1", name: "2.5"}, Use.READ) is not None


def test_a_missing_address_names_the_register_function_that_exists() -> None:
    _refused({}, Use.READ, "QUORUMSTORE_MISSING_OPTION", "quorumstore.spark.datasource.register(")


def test_addresses_may_be_ipv6_literals_in_brackets() -> None:
    parsed = SourceOptions.parse({"address": "[::1]:6648, 10.0.0.2:7000"}, Use.READ)
    assert parsed.address == "[::1]:6648,10.0.0.2:7000"
    _refused({"address": "::1:6648"}, Use.READ, "QUORUMSTORE_INVALID_OPTION", "host:port")


def test_the_sink_names_the_one_output_mode_it_supports() -> None:
    """It advertised update mode too, which Spark then refused for it."""
    with pytest.raises(QuorumstoreOptionError, match="append output mode only, not complete"):
        check_stream_mode(overwrite=True)
    check_stream_mode(overwrite=False)


@pytest.mark.parametrize("offsets", ['{"default/0": -5, "default/1": 0}', '{"default/0": 1.5}'])
def test_starting_offsets_below_minus_one_are_malformed(offsets: str) -> None:
    _refused(
        {"address": "h:1", "startingOffsets": offsets},
        Use.STREAM_READ,
        "QUORUMSTORE_INVALID_OPTION",
        "offsets of -1 or more",
    )


# ------------------------------------------------------------------ against a cluster


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
