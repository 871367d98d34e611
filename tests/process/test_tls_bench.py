"""bench/tls_bench.py runs: a row per configuration, with ratios against plaintext."""

from __future__ import annotations

import pytest
import tls_bench

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


def test_prints_a_row_per_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        tls_bench.main(["--seconds", "0.5", "--callers", "4", "--puts", "20", "--keys", "50"]) == 0
    )
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [" ".join(row[:-5]) for row in rows] == list(tls_bench.CONFIGS)
    assert all(float(row[-5].replace(",", "")) > 0 for row in rows)
    assert rows[0][-4] == "1.00"


def test_refuses_bad_numbers() -> None:
    with pytest.raises(SystemExit):
        tls_bench.main(["--callers", "0"])
