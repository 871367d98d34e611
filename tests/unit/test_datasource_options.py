"""Options of the DataFrame source and sink: refused before any Spark task runs, saying why."""

from __future__ import annotations

import pytest

from quorumstore.spark.datasource_options import (
    QuorumstoreOptionError,
    SourceOptions,
    Use,
)
from quorumstore.spark.datasource_write import check_stream_mode


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
