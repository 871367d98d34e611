"""bench/notifications_bench.py runs, and its subscribers receive what the writers write."""

from __future__ import annotations

import notifications_bench
import pytest


def test_prints_a_row_per_subscriber_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert notifications_bench.main(["--subscribers", "0,2", "--seconds", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["0", "2"]
    puts_s = [float(row[1].replace(",", "")) for row in rows]
    notified_s = [float(row[3].replace(",", "")) for row in rows]
    assert all(p > 0 for p in puts_s)
    assert notified_s[0] == 0
    assert notified_s[1] > puts_s[1]  # two subscribers, each told of every put


def test_refuses_bad_counts() -> None:
    with pytest.raises(SystemExit):
        notifications_bench.main(["--subscribers", "a,b"])
    with pytest.raises(SystemExit):
        notifications_bench.main(["--subscribers", "-1"])
