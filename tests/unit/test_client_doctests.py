"""The examples in module docstrings (the client's, the Spark settings') run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "quorumstore.client.errors",
    "quorumstore.client.types",
    "quorumstore.client.routing",
    "quorumstore.client.retry",
    "quorumstore.client.loop_thread",
    "quorumstore.spark.conf_keys",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
