"""A node reads only a data directory in its own on-disk format, and says so otherwise."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from quorumstore import Client, __version__
from quorumstore.node.data_format import DATA_FORMAT, MARKER_FILE, DataFormatError
from quorumstore.node.node import Node, NodeConfig
from quorumstore.testing import standalone_server


async def _start_and_stop(data_dir: Path) -> None:
    node = Node(NodeConfig(data_dir, port=0, wal_sync=False))
    try:
        await node.start()
    finally:
        await node.stop()


def test_a_new_data_directory_is_marked_with_this_builds_format(tmp_path: Path) -> None:
    asyncio.run(_start_and_stop(tmp_path / "node"))
    marker = json.loads((tmp_path / "node" / MARKER_FILE).read_text())
    assert marker == {"format": DATA_FORMAT, "written_by": f"quorumstore {__version__}"}
    asyncio.run(_start_and_stop(tmp_path / "node"))  # and it is read back


def test_a_directory_in_another_format_is_refused_before_anything_in_it_is_read(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "node"
    wal = data_dir / "shards" / "default" / "0" / "wal"
    wal.mkdir(parents=True)
    # Opening this shard would fail with a WAL error: the refusal must come first.
    (wal / "00000000000000000001.wal").write_bytes(b"a record of another format")
    marker = json.dumps({"format": DATA_FORMAT + 1, "written_by": "quorumstore 9.0.0"})
    (data_dir / MARKER_FILE).write_text(marker)
    before = sorted(p.relative_to(data_dir) for p in data_dir.rglob("*"))

    with pytest.raises(DataFormatError) as refused:
        asyncio.run(_start_and_stop(data_dir))

    message = str(refused.value)
    assert f"{data_dir} holds node data in format {DATA_FORMAT + 1}" in message
    assert "written by quorumstore 9.0.0" in message
    assert f"reads only format {DATA_FORMAT}" in message
    assert (data_dir / MARKER_FILE).read_text() == marker
    assert sorted(p.relative_to(data_dir) for p in data_dir.rglob("*")) == before


@pytest.mark.parametrize("content", ["", "{not json", '{"format": "1"}', '{"version": 1}', "[1]"])
def test_a_damaged_marker_is_refused(tmp_path: Path, content: str) -> None:
    tmp_path.joinpath(MARKER_FILE).write_text(content)
    with pytest.raises(DataFormatError, match="does not name a data format"):
        asyncio.run(_start_and_stop(tmp_path))


def test_the_command_line_refuses_another_format_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / MARKER_FILE).write_text(json.dumps({"format": DATA_FORMAT + 1}))
    # A process with a deadline: a standalone that did start would serve until killed.
    argv = ["standalone", "--port", "0", "--data-dir", str(tmp_path)]
    result = subprocess.run(
        [sys.executable, "-m", "quorumstore.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert err.startswith("quorumstore: error: ") and err.count("\n") == 1, err
    assert "writer unknown" in err and "run this node with the quorumstore version" in err


def test_a_directory_written_before_the_marker_existed_is_adopted(tmp_path: Path) -> None:
    with standalone_server(tmp_path, fsync=False) as address, Client(address) as client:
        client.put("/kept", b"across the upgrade")
    (tmp_path / "node" / MARKER_FILE).unlink()  # as every directory was before the marker

    with standalone_server(tmp_path, fsync=False) as address, Client(address) as client:
        assert client.get("/kept")[1] == b"across the upgrade"
    assert json.loads((tmp_path / "node" / MARKER_FILE).read_text())["format"] == DATA_FORMAT
