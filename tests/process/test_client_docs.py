"""docs/client.md's examples run as written, as a doctest, against a fresh server;
so does the README's client example."""

from __future__ import annotations

import doctest
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumstore import Client
from quorumstore.client import KeyNotFound

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "client.md"
README = ROOT / "README.md"


def test_client_guide_examples(
    make_cluster: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The guide's server: one node and three shards, like `quorumstore standalone --shards 3`.
    cluster = make_cluster(nodes=1, shards=3, replication_factor=1)
    monkeypatch.setenv("QUORUMSTORE_ADDRESS", cluster.nodes[0])  # type: ignore[attr-defined]
    result = doctest.testfile(str(DOC), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 20
    assert result.failed == 0, (
        f"{result.failed} of the guide's examples failed (see the output above)"
    )


def test_the_readme_client_example(make_cluster: Callable[..., object], tmp_path: Path) -> None:
    cluster = make_cluster(nodes=1, shards=3, replication_factor=1)
    address: str = cluster.nodes[0]  # type: ignore[attr-defined]
    section = README.read_text().split("\n## Clients\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1, "the README's Clients section should hold one Python example"
    script = tmp_path / "readme_client.py"
    script.write_text(blocks[0].replace('"127.0.0.1:6648"', repr(address)))
    run = subprocess.run(
        [sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    with Client(address) as client:  # what it wrote is there; its ephemeral record is not
        assert client.get("ada", use_index="name").value == b"Ada Lovelace"
        assert client.list("/users/", "/users/~") == ["/users/ada", "/users/bob", "/users/cy"]
        assert client.list("/log", "/log~", partition_key="log") == ["/log-00000000000000000001"]
        with pytest.raises(KeyNotFound):
            client.get("/workers/w1")
