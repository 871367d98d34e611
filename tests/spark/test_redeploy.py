"""A streaming query whose application is redeployed onto empty disks continues from its
checkpoint with the same output as on Spark's RocksDB provider.

Each provider runs `redeploy_app.py` twice, as two Spark applications on one checkpoint:
first over two input files, then, after two more arrive, on new data directories (the
old hosts' disks are gone). Spark's RocksDB provider keeps its state beside the
checkpoint; quorumstore's cluster keeps it on the nodes' disks and in its archive, and
the second application restores the cluster from the archive before the query loads its
state. The second application also reads the restored cluster through the DataFrame
source before its query runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

APP = Path(__file__).with_name("redeploy_app.py")
#: Events per input file: keys k0..k4, so that later files update earlier keys' state.
EVENTS_PER_FILE = 12


def _write_input(directory: Path, first: int, count: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        rows = [{"k": f"k{(i * 3 + j) % 5}", "v": i * 100 + j} for j in range(EVENTS_PER_FILE)]
        path = directory / f"part-{i:04d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def _run_app(args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [sys.executable, str(APP), *args, "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return run


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_redeployed_query_continues_on_empty_disks_like_rocksdb(
    tmp_path: Path, free_port_block: Callable[[int], int]
) -> None:
    base_port = free_port_block(8)
    archive = tmp_path / "archive"
    logs = {}
    for provider in ("quorumstore", "rocksdb"):
        work = tmp_path / provider
        out = work / "out.jsonl"
        _write_input(work / "in", 0, 2)
        extra = ["--work", str(work)]
        if provider == "quorumstore":
            extra += ["--archive-url", str(archive), "--base-port", str(base_port)]
        first = extra + (["--data-dir", str(work / "hosts-a")] if provider == "quorumstore" else [])
        _run_app(["--provider", provider, *first], out)
        _write_input(work / "in", 2, 2)
        second = extra + (
            ["--data-dir", str(work / "hosts-b")] if provider == "quorumstore" else []
        )
        logs[provider] = _run_app(["--provider", provider, *second], out).stderr

    assert "restoring the cluster archived at" in logs["quorumstore"], logs["quorumstore"][-3000:]
    ours, theirs = (
        _lines(tmp_path / "quorumstore" / "out.jsonl"),
        _lines(tmp_path / "rocksdb" / "out.jsonl"),
    )
    batches = [line for line in ours if "batch" in line]
    assert [b["batch"] for b in batches] == [0, 1, 2, 3]
    assert batches == theirs

    # The DataFrame source read the restored cluster: what the first application wrote.
    reads = [line for line in ours if "batch" not in line]
    assert [next(iter(r)) for r in reads] == ["read_before", "read_after"] * 2
    first_after, second_before = reads[1]["read_after"], reads[2]["read_before"]
    assert first_after and second_before == first_after
    # And the second application's upserts on top of it: each key's latest count.
    latest = {}
    for batch in batches:
        for k, n, total in batch["rows"]:
            latest[f"/counts/{k}"] = {"n": n, "total": total}
    assert {k: json.loads(v) for k, v in reads[3]["read_after"].items()} == latest
