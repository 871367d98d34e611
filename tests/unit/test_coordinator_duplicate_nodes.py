"""Each replica of a shard needs a node of its own: a coordinator configured with one
node's address twice is refused, by the CLI and by its configuration (issue 49)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumstore.cli import main
from quorumstore.coordinator.server import CoordinatorServerConfig


def test_the_configuration_refuses_a_node_given_twice() -> None:
    internal = {"a:1": "a:11", "a:2": "a:12", "b:2": "b:12"}
    with pytest.raises(ValueError, match="list a:1 more than once"):
        CoordinatorServerConfig(["a:1", "a:1", "b:2"], "memory://x", internal)
    assert CoordinatorServerConfig(["a:1", "a:2", "b:2"], "memory://x", internal)


def test_the_cli_refuses_a_node_given_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["coordinator", "--nodes", "127.0.0.1:1,127.0.0.1:1,127.0.0.2:2"]
    argv += ["--internal-addresses", "127.0.0.1:11,127.0.0.1:11,127.0.0.2:12"]
    assert main([*argv, "--metadata", str(tmp_path / "metadata")]) == 2
    error = capsys.readouterr().err
    assert "quorumstore: error:" in error and "127.0.0.1:1 more than once" in error
    assert not (tmp_path / "metadata").exists()
