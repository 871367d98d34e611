"""Where a Spark-hosted node keeps its data and which address it binds, on its host."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import pytest

from quorumstore.spark import node_task


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        # A standalone executor's own directories, per application, under the worker's.
        (
            "SPARK_EXECUTOR_DIRS",
            os.pathsep.join(
                [
                    "/data/local/spark-0a1b2c3d-1111-2222-3333-444455556666/executor-9f8e7d6c-aaaa",
                    "/data2/local/spark-0a1b2c3d-1111/executor-9f8e7d6c",
                ]
            ),
            "/data/local",
        ),
        # What PySpark hands a Python worker: the block manager's directories.
        (
            "SPARK_LOCAL_DIRS",
            "/mnt/ssd/spark-0a1b2c3d-1111/executor-9f8e7d6c-2222/blockmgr-12345678-abcd,/mnt/b",
            "/mnt/ssd",
        ),
        ("SPARK_LOCAL_DIRS", "/var/lib/spark-tmp", "/var/lib/spark-tmp"),
        ("LOCAL_DIRS", "/yarn/appcache/application_1_0001", "/yarn/appcache/application_1_0001"),
    ],
)
def test_node_data_goes_beside_sparks_per_application_directories(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    for name in ("SPARK_EXECUTOR_DIRS", "SPARK_LOCAL_DIRS", "LOCAL_DIRS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    assert node_task.executor_local_dir() == Path(expected)


def test_without_local_directories_the_temporary_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SPARK_EXECUTOR_DIRS", "SPARK_LOCAL_DIRS", "LOCAL_DIRS"):
        monkeypatch.delenv(name, raising=False)
    assert node_task.executor_local_dir() == Path(tempfile.gettempdir())


def test_a_node_binds_the_address_that_routes_to_the_coordinator() -> None:
    assert node_task.routed_address("127.0.0.1") == "127.0.0.1"


def _spec(tmp_path: Path, **changes: object) -> node_task.NodeTaskSpec:
    fields = {f: None for f in node_task.NodeTaskSpec.__dataclass_fields__}
    fields.update(
        host=None,
        client_ports=(0,),
        internal_ports=(0,),
        coordinator="127.0.0.1:1",
        data_dir=str(tmp_path),
        cluster_name="c",
    )
    fields.update(changes)
    return node_task.NodeTaskSpec(**fields)  # type: ignore[arg-type]


def test_a_restarted_node_asks_for_its_last_ports_while_they_are_free(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert node_task._ports(spec, 0, "127.0.0.1") == (0, 0)  # never ran here
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        last = (a.getsockname()[1], b.getsockname()[1])
    spec.ports_file(0).write_text(
        json.dumps({"host": "127.0.0.1", "client": last[0], "internal": last[1]})
    )
    assert node_task._ports(spec, 0, "127.0.0.1") == last
    assert node_task._ports(spec, 0, "127.0.0.2") == (0, 0)  # another host's ports
    with socket.create_server(("127.0.0.1", last[0])):
        assert node_task._ports(spec, 0, "127.0.0.1") == (0, 0)  # taken meanwhile
    fixed = _spec(tmp_path, client_ports=(7000,), internal_ports=(7001,))
    assert node_task._ports(fixed, 0, "127.0.0.1") == (7000, 7001)
