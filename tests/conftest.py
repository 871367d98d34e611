"""Shared test setup: the package is imported from the source tree when not installed, and
the benchmarks (bench/, scripts rather than a package) by their module names."""

import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
for _path in (_REPO / "python", _REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# Before any test module imports grpc: quorumstore sets gRPC's fork handling on import,
# which only works before grpc is loaded (see quorumstore/__init__.py). The Spark tests
# launch JVMs (a fork) after their clusters' gRPC channels are in use.
import quorumstore  # noqa: F401
