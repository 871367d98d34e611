"""bench/publish_bench.py runs: it publishes a staged part on a node and prints its row."""

from __future__ import annotations

import publish_bench
import pytest


def test_prints_a_row_per_part_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert publish_bench.main(["--mb", "1,2", "--value-bytes", "50"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["1", "2"]
    assert [int(row[1].replace(",", "")) for row in rows] == [15_873, 31_746]
    before_mb = [float(row[3].replace(",", "")) for row in rows]
    peak_mb = [float(row[5].replace(",", "")) for row in rows]
    assert all(0 < before <= peak for before, peak in zip(before_mb, peak_mb, strict=True))


def test_refuses_bad_sizes() -> None:
    with pytest.raises(SystemExit):
        publish_bench.main(["--mb", "a"])
    with pytest.raises(SystemExit):
        publish_bench.main(["--mb", "0"])
    with pytest.raises(SystemExit):
        publish_bench.main(["--value-bytes", "0"])
