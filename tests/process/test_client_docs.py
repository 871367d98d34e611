"""docs/client.md's examples run as written, as a doctest, against a fresh server."""

from __future__ import annotations

import doctest
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"


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
