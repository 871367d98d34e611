"""A node reads only a data directory in its own on-disk format, and says so otherwise."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from quorumstore import Client, __version__
from quorumstore.node.data_format import (
    DATA_FORMAT,
    MARKER_FILE,
    METADATA_KEY,
    DataFormatError,
    RefusalLog,
)
from quorumstore.node.node import Node, NodeConfig
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.testing import standalone_server

pytestmark = pytest.mark.integration


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


async def _replication_errors(data_dir: Path, metadata: tuple[tuple[str, str], ...]) -> dict:
    """Each Replication call, made to a real node with `metadata`, and the error it got."""
    node = Node(NodeConfig(data_dir, port=0, wal_sync=False))
    await node.start()
    errors: dict[str, grpc.aio.AioRpcError] = {}
    try:
        async with grpc.aio.insecure_channel(node.internal_address) as channel:
            stub = pb_grpc.ReplicationStub(channel)
            unknown_shard = pb.TruncateRequest(namespace="default", shard=7, term=1)
            calls = {
                "Truncate": lambda: stub.Truncate(unknown_shard, metadata=metadata, timeout=10),
                "Replicate": lambda: _drain(
                    stub.Replicate(iter(()), metadata=metadata, timeout=10)
                ),
                "SendSnapshot": lambda: stub.SendSnapshot(iter(()), metadata=metadata, timeout=10),
            }
            for name, call in calls.items():
                try:
                    await call()
                except grpc.aio.AioRpcError as e:
                    errors[name] = e
    finally:
        await node.stop()
    return errors


async def _drain(stream: grpc.aio.StreamStreamCall) -> None:
    async for _ in stream:
        pass


def test_replication_in_another_data_format_is_refused_with_the_nodes_own(tmp_path: Path) -> None:
    errors = asyncio.run(_replication_errors(tmp_path, ((METADATA_KEY, str(DATA_FORMAT + 1)),)))
    assert set(errors) == {"Truncate", "Replicate", "SendSnapshot"}
    for error in errors.values():
        assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert (
            f"reads data format {DATA_FORMAT}, but the call carries format {DATA_FORMAT + 1}"
            in (error.details() or "")
        )
        assert (METADATA_KEY, str(DATA_FORMAT)) in tuple(error.trailing_metadata() or ())


@pytest.mark.parametrize(
    "metadata", [(), ((METADATA_KEY, str(DATA_FORMAT)),)], ids=["older build", "same format"]
)
def test_replication_in_this_data_format_passes_the_check(
    tmp_path: Path, metadata: tuple[tuple[str, str], ...]
) -> None:
    """A call without the header comes from a build older than it, which is format 1."""
    errors = asyncio.run(_replication_errors(tmp_path, metadata))
    # What is left are the calls' own answers: no such shard, an empty snapshot stream.
    assert errors["Truncate"].code() is grpc.StatusCode.NOT_FOUND
    assert errors["SendSnapshot"].code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "Replicate" not in errors


def test_a_leader_warns_about_a_refusing_follower_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refused = asyncio.run(_replication_errors(tmp_path / "a", ((METADATA_KEY, "9"),)))
    other = asyncio.run(_replication_errors(tmp_path / "b", ()))
    refusals = RefusalLog()
    with caplog.at_level(logging.WARNING, logger="quorumstore.node.data_format"):
        for error in [*refused.values(), *other.values()]:
            refusals.note("127.0.0.1:1", error)
        refusals.note("127.0.0.1:2", refused["Truncate"])
    assert caplog.messages == [
        f"follower 127.0.0.1:{port} reads data format {DATA_FORMAT}, and this node replicates "
        f"format {DATA_FORMAT}: it gets no entries until it runs a quorumstore version of format "
        f"{DATA_FORMAT}"
        for port in (1, 2)
    ]
