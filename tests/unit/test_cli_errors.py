"""Mistakes `quorumstore` catches before starting anything: one line on stderr, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumstore import cli


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("quorumstore: error: ") and err.count("\n") == 1, err
    return err


def test_wildcard_host_needs_an_advertised_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["standalone"], ["node", "--data-dir", str(tmp_path / "n")]):
        err = _fails([*command, "--host", "0.0.0.0", "--data-dir", str(tmp_path / "d")], capsys)
        assert "add --advertise-host" in err


def test_base_port_must_leave_room_for_every_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _fails(["cluster", "--data-dir", str(tmp_path), "--base-port", "65534"], capsys)
    assert "use at most 65532" in err


def test_standalone_and_cluster_do_not_start_on_each_others_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s" / "node").mkdir(parents=True)
    (tmp_path / "c" / "node0").mkdir(parents=True)
    err = _fails(["cluster", "--data-dir", str(tmp_path / "s")], capsys)
    assert "holds the data of `quorumstore standalone`" in err
    err = _fails(["standalone", "--port", "0", "--data-dir", str(tmp_path / "c")], capsys)
    assert "holds the data of `quorumstore cluster`" in err


def test_empty_metadata_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "coordinator").mkdir()
    (tmp_path / "coordinator" / "metadata.pb").write_bytes(b"")
    err = _fails(["standalone", "--port", "0", "--data-dir", str(tmp_path)], capsys)
    assert "describes no shards" in err


def test_log_level_is_accepted_after_the_command() -> None:
    args = cli.build_parser().parse_args(
        ["status", "--coordinator", "127.0.0.1:1", "--log-level", "INFO"]
    )
    assert args.log_level == "INFO"
    args = cli.build_parser().parse_args(["--log-level", "ERROR", "status", "--coordinator", "h:1"])
    assert args.log_level == "ERROR"


def test_a_failure_timeout_under_two_ticks_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (
        ["cluster", "--data-dir", str(tmp_path)],
        ["coordinator", "--nodes", "h:1", "--metadata", str(tmp_path / "m.pb")],
    ):
        with pytest.raises(SystemExit) as exited:
            cli.build_parser().parse_args([*command, "--failure-timeout-ms", "150"])
        assert exited.value.code == 2
        assert "the node failure timeout must be at least 200 ms" in capsys.readouterr().err
    args = cli.build_parser().parse_args(
        ["cluster", "--data-dir", "d", "--failure-timeout-ms", "900"]
    )
    assert args.failure_timeout_ms == 900
