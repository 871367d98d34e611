"""Model checks of the state-store provider's Scala data structures (executor_node/src/test)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from quorumstore.spark import jar_build


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return jar_build.check_classpath(tmp_path_factory.mktemp("classes"))


def _run_check(classpath: str, main_class: str) -> str:
    java = shutil.which("java")
    assert java is not None, "a JDK is needed for the Spark tier"
    result = subprocess.run(
        [java, "-cp", classpath, f"io.quorumstore.spark.state.{main_class}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_family_map_matches_a_sorted_map_model(classpath: str) -> None:
    assert "FamilyMapCheck ok: 200 seeds" in _run_check(classpath, "FamilyMapCheck")


def test_data_chunks_read_back_what_was_written_compressed_or_not(classpath: str) -> None:
    assert "CodecCheck ok: 300 seeds" in _run_check(classpath, "CodecCheck")
