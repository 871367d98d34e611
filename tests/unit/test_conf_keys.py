"""The list of spark.quorumstore.* settings matches what Python and Scala read, and other
keys under the prefix are warned about with a suggestion."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from quorumstore.node.limits import limit_settings
from quorumstore.spark import config
from quorumstore.spark.conf_keys import KNOWN_KEYS, unknown_key_warnings, warn_unknown_keys

SCALA_SOURCES = Path(__file__).resolve().parents[2] / "executor_node" / "src" / "main" / "scala"


def _hosting_keys() -> set[str]:
    return {config.PREFIX + key for key, _parse in config._KEYS.values()}


def _limit_keys() -> set[str]:
    return {setting.spark_conf for setting in limit_settings().values()}


def _scala_keys() -> set[str]:
    literals = set()
    for source in SCALA_SOURCES.rglob("*.scala"):
        literals |= set(re.findall(r'"(spark\.quorumstore\.[A-Za-z.]+)"', source.read_text()))
    return literals


def test_the_list_is_exactly_the_keys_python_and_scala_read() -> None:
    hosting, limits, scala = _hosting_keys(), _limit_keys(), _scala_keys()
    assert len(hosting) == 23 and len(scala) >= 10
    assert len(limits) == 7
    assert hosting | limits | scala == KNOWN_KEYS


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("spark.quorumstore.replicationfactor", "spark.quorumstore.replicationFactor"),
        ("spark.quorumstore.node", "spark.quorumstore.nodes"),
        ("spark.quorumstore.adress", "spark.quorumstore.address"),
        ("spark.quorumstore.prefix", "spark.quorumstore.stateStore.prefix"),
        ("spark.quorumstore.stateStore.address", "spark.quorumstore.address"),
        ("spark.quorumstore.stateStore.timeoutms", "spark.quorumstore.timeoutMs"),
    ],
)
def test_a_misspelled_key_gets_the_known_key_it_resembles(key: str, suggestion: str) -> None:
    assert unknown_key_warnings([key]) == [
        f"unknown setting {key} (ignored); did you mean {suggestion}?"
    ]


def test_known_keys_and_other_prefixes_are_not_warned_about() -> None:
    assert unknown_key_warnings([*KNOWN_KEYS, "spark.app.name", "spark.quorumstorex"]) == []


def test_a_key_like_no_other_points_to_the_docs() -> None:
    (message,) = unknown_key_warnings(["spark.quorumstore.zzz"])
    assert message.startswith("unknown setting spark.quorumstore.zzz (ignored); the settings are")
    assert "docs/running-on-spark.md" in message and "docs/state-store.md" in message


def test_warnings_name_their_source(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="quorumstore.spark.conf_keys"):
        warn_unknown_keys(
            {"spark.quorumstore.shard": "4", "spark.quorumstore.nodes": "3"}, "f.conf"
        )
    expected = (
        "f.conf: unknown setting spark.quorumstore.shard (ignored); "
        "did you mean spark.quorumstore.shards?"
    )
    assert [r.getMessage() for r in caplog.records] == [expected]
