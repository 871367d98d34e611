"""bench/grpc_floor_bench.py runs and reports every kind of exchange."""

from __future__ import annotations

import grpc_floor_bench
import pytest

pytestmark = pytest.mark.integration


def test_prints_wall_and_cpu_per_exchange(capsys: pytest.CaptureFixture[str]) -> None:
    assert grpc_floor_bench.main(["--calls", "20"]) == 0
    out = capsys.readouterr().out
    for kind in (
        "unary call",
        "unary call + 2 metadata entries",
        "bidirectional stream round trip",
    ):
        assert kind in out
    assert "x the CPU of a round trip on an open stream" in out


def test_refuses_a_non_positive_call_count() -> None:
    with pytest.raises(SystemExit):
        grpc_floor_bench.main(["--calls", "0"])
