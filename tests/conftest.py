"""Shared test setup: the package is imported from the source tree when not installed, and
the benchmarks (bench/, scripts rather than a package) and the tests' shared modules
(tests/cluster_harness.py, tests/state_machine_logs.py) by their module names."""

import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]
for _path in (_REPO / "python", _REPO / "bench", _REPO / "tests"):
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
    from quorumstore.storage.results import EntryResult
    from quorumstore.storage.state_machine import ShardStateMachine

    computed: list[int] = []
    apply_entry = ShardStateMachine._apply_entry

    def counted(self: ShardStateMachine, entry: LogEntry) -> EntryResult:
        computed.append(entry.offset)
        return apply_entry(self, entry)

    monkeypatch.setattr(ShardStateMachine, "_apply_entry", counted)
    return computed


class RecordingChannel:
    """Stands in for grpc.Channel: records which multicallables a stub creates."""

    def __init__(self) -> None:
        self.methods: dict[str, tuple[bool, bool]] = {}

    def _record(self, client_streaming: bool, server_streaming: bool):
        def factory(method, *args, **kwargs):
            self.methods[method] = (client_streaming, server_streaming)
            return object()

        return factory

    def __getattr__(self, name: str):
        shapes = {
            "unary_unary": (False, False),
            "unary_stream": (False, True),
            "stream_unary": (True, False),
            "stream_stream": (True, True),
        }
        if name not in shapes:
            raise AttributeError(name)
        return self._record(*shapes[name])


@pytest.fixture
def recording_channel() -> RecordingChannel:
    """A channel for checking the method paths and streaming shapes of generated stubs."""
    return RecordingChannel()
