"""Shared test setup: the package is imported from the source tree when not installed, and
the benchmarks (bench/, scripts rather than a package) by their module names."""

import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]
for _path in (_REPO / "python", _REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# Before any test module imports grpc: quorumstore sets gRPC's fork handling on import,
# which only works before grpc is loaded (see quorumstore/__init__.py). The Spark tests
# launch JVMs (a fork) after their clusters' gRPC channels are in use.
import quorumstore  # noqa: F401


@pytest.fixture
def computed_applies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The offset of each entry whose apply a ShardStateMachine computes (applies proper
    and prepares, not the writes of prepared ones), in order."""
    from quorumstore.protocol.types import LogEntry
    from quorumstore.storage.state_machine import EntryResult, ShardStateMachine

    computed: list[int] = []
    apply_entry = ShardStateMachine._apply_entry

    def counted(self: ShardStateMachine, entry: LogEntry) -> EntryResult:
        computed.append(entry.offset)
        return apply_entry(self, entry)

    monkeypatch.setattr(ShardStateMachine, "_apply_entry", counted)
    return computed
