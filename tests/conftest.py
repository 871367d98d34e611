"""Shared test setup: the package is imported from the source tree when not installed."""

import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1] / "python"
if str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))
