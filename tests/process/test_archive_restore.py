"""The archive with real `standalone` servers, on a local path and on an S3-compatible
server (moto's, on loopback, through s3fs): every disk lost and restored, kill -9 in
the middle of uploads, a point-in-time restore, lost metadata taken from the archive,
and an archive that is unreachable for a while."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cluster_harness import S3_BUCKET, run_cli, s3_environment, start_cli
from quorumstore import Client
from quorumstore.archive.store import ArchiveStore
from quorumstore.client import QuorumStoreError

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

_LISTENING = re.compile(r"listening on (\S+)")
_STATUS = re.compile(r"status --coordinator (\S+)")


class Standalone:
    """A `quorumstore standalone` process with an archive; its output is kept."""

    def __init__(self, data_dir: Path, *args: str):
        self.process = start_cli("standalone", "--port", "0", "--data-dir", str(data_dir), *args)
        self.lines: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(90) or self.process.poll() is not None:
            self.kill9()
            raise AssertionError("standalone did not start:\n" + "".join(self.lines))
        text = "".join(self.lines)
        self.address = _LISTENING.findall(text)[0]
        self.status_address = _STATUS.findall(text)[0]

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if "status --coordinator" in line:
                self._ready.set()
        self._ready.set()

    def status(self) -> str:
        result = run_cli("status", "--coordinator", self.status_address)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def kill9(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill9()


@contextmanager
def standalone(data_dir: Path, *args: str) -> Iterator[Standalone]:
    server = Standalone(data_dir, *args)
    try:
        yield server
    finally:
        server.stop()


def _lag(server: Standalone) -> tuple[int, str]:
    """Entries the archive is behind, and the status line of shard 0."""
    line = next(row for row in server.status().splitlines() if row.startswith("default/0"))
    found = re.search(r"(\d+) entries, [\d.]+ s", line)
    assert found is not None, line
    return int(found.group(1)), line


def _wait_archived(server: Standalone, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries, line = _lag(server)
        if entries == 0 and "failing" not in line:
            return
        time.sleep(0.3)
    raise AssertionError(f"the archive did not catch up: {line}")


def _read_all(address: str, keys: list[str]) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    with Client(address) as client:
        for key in keys:
            try:
                out[key] = client.get(key).value
            except QuorumStoreError:
                out[key] = None
    return out


# ------------------------------------------------------------------ archives


@pytest.fixture(params=["local", "s3"])
def archive_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """An empty archive: a local path, or a prefix in the moto server's bucket (the
    servers this test starts find it through fsspec's environment configuration)."""
    if request.param == "local":
        return str(tmp_path / "archive")
    endpoint, _, _ = request.getfixturevalue("moto_endpoint")
    s3_environment(monkeypatch, endpoint)
    return f"s3://{S3_BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}-{time.time_ns()}"


# ------------------------------------------------------------------ tests


def test_every_disk_lost_is_restored_from_the_archive(tmp_path: Path, archive_url: str) -> None:
    """Every write the archive holds is back, with its version, after the data directory
    is gone; the restored cluster then takes new writes and archives on."""
    flags = ["--archive-url", archive_url, "--archive-snapshot-entries", "40"]
    keys = [f"/lost/{i:03d}" for i in range(150)]
    with standalone(tmp_path / "first", *flags) as server:
        with Client(server.address) as client:
            versions = {key: client.put(key, key.encode()).version_id for key in keys}
            client.delete(keys[0])
        _wait_archived(server)
        server.kill9()
    with standalone(tmp_path / "second", *flags) as server:
        assert "restoring it from the archive" in "".join(server.lines)
        with Client(server.address) as client:
            for key in keys[1:]:
                record = client.get(key)
                assert (record.value, record.version.version_id) == (key.encode(), versions[key])
            with pytest.raises(QuorumStoreError):
                client.get(keys[0])
            client.put("/lost/after", b"new")
        _wait_archived(server)


def test_kill9_during_uploads_leaves_a_consistent_archive(tmp_path: Path) -> None:
    """With archive-sync, a node killed -9 again and again while it uploads segments and
    snapshots: a restore holds every write that was acknowledged, and nothing an
    upload left half-written is read."""
    archive = str(tmp_path / "archive")
    flags = ["--archive-url", archive, "--archive-sync", "--archive-snapshot-entries", "25"]
    acked: dict[str, bytes] = {}
    for round_ in range(3):
        with standalone(tmp_path / "data", *flags) as server:
            stop = threading.Event()

            def write(
                client_id: int,
                server: Standalone = server,
                round_: int = round_,
                stop: threading.Event = stop,
            ) -> None:
                with Client(server.address, request_timeout_s=5) as client:
                    i = 0
                    while not stop.is_set():
                        key = f"/kill/{round_}/{client_id}/{i:05d}"
                        value = os.urandom(2000)
                        try:
                            client.put(key, value)
                        except QuorumStoreError:
                            return
                        acked[key] = value
                        i += 1

            writers = [threading.Thread(target=write, args=(c,)) for c in range(4)]
            for writer in writers:
                writer.start()
            time.sleep(3)
            server.kill9()
            stop.set()
            for writer in writers:
                writer.join(30)
    assert len(acked) > 100
    result = run_cli("restore", "--archive-url", archive, "--data-dir", str(tmp_path / "restored"))
    assert result.returncode == 0, result.stdout + result.stderr
    with standalone(tmp_path / "restored") as server:
        found = _read_all(server.address, sorted(acked))
    lost = [key for key, value in acked.items() if found[key] != value]
    assert lost == [], f"{len(lost)} of {len(acked)} acknowledged writes missing after restore"


def test_point_in_time_restore_equals_what_was_read_then(tmp_path: Path) -> None:
    archive = str(tmp_path / "archive")
    # Snapshots every 30 entries, all kept: retention must not drop the one before `at`
    # (each put may be an entry of its own, 160 entries in all).
    flags = ["--archive-url", archive, "--archive-snapshot-entries", "30"]
    flags += ["--archive-keep-snapshots", "100"]
    keys = [f"/pit/{i:03d}" for i in range(120)]
    with standalone(tmp_path / "data", *flags) as server:
        _wait_archived(server)  # the first snapshot: the archive reaches back to it
        with Client(server.address) as client:
            for key in keys[:80]:
                client.put(key, b"before")
            time.sleep(0.05)
            at = datetime.now(UTC)
            time.sleep(0.05)
        then = _read_all(server.address, keys)
        with Client(server.address) as client:
            for key in keys[40:]:
                client.put(key, b"after")
            for key in keys[:10]:
                client.delete(key)
        _wait_archived(server)
    assert set(then.values()) == {b"before", None}
    restored = tmp_path / "restored"
    result = run_cli(
        "restore", "--archive-url", archive, "--data-dir", str(restored), "--at", at.isoformat()
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "applied entries" in result.stdout
    with standalone(restored) as server:
        assert _read_all(server.address, keys) == then
    early = run_cli(
        "restore", "--archive-url", archive, "--data-dir", str(tmp_path / "early"),
        "--at", "2001-01-01T00:00:00Z",
    )  # fmt: skip
    assert early.returncode == 2 and "before the oldest kept snapshot" in early.stderr
    unknown = run_cli(
        "restore", "--archive-url", archive, "--data-dir", str(tmp_path / "x"), "--at", "5=3"
    )
    assert unknown.returncode == 2 and "holds no shard default/5" in unknown.stderr
    unreachable = run_cli(
        "restore", "--archive-url", str(tmp_path / "nothing"), "--data-dir", str(tmp_path / "y")
    )
    assert unreachable.returncode == 2 and "nothing is archived" in unreachable.stderr


def test_lost_metadata_is_taken_from_the_archive(tmp_path: Path) -> None:
    archive = str(tmp_path / "archive")
    data = tmp_path / "data"
    with standalone(data, "--archive-url", archive) as server, Client(server.address) as client:
        versions = {f"/meta/{i}": client.put(f"/meta/{i}", b"v").version_id for i in range(20)}
        _wait_archived(server)
    saved = (data / "coordinator" / "metadata.pb").read_bytes()
    assert ArchiveStore(archive).load_metadata() is not None
    (data / "coordinator" / "metadata.pb").unlink()
    with standalone(data, "--archive-url", archive, "--log-level", "WARNING") as server:
        with Client(server.address) as client:
            for key, version in versions.items():
                assert client.get(key).version.version_id == version
        assert "took the copy archived at" in "".join(server.lines)
    assert (data / "coordinator" / "metadata.pb").read_bytes() != saved  # saved anew


def test_an_unreachable_archive_delays_nothing_but_the_archive(
    tmp_path: Path,
    moto_endpoint: tuple[str, Callable[[], None], Callable[[], None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Writes go on while the S3 server is down, the status shows the lag growing and the
    failure, and once the server is back the archive catches up."""
    endpoint, stop, start = moto_endpoint
    s3_environment(monkeypatch, endpoint)
    url = f"s3://{S3_BUCKET}/unreachable-{time.time_ns()}"
    with standalone(tmp_path / "data", "--archive-url", url) as server:
        with Client(server.address) as client:
            client.put("/down/first", b"1")
            _wait_archived(server)
            stop()
            try:
                started = time.monotonic()
                for i in range(50):
                    client.put(f"/down/{i}", b"x")
                assert time.monotonic() - started < 20
                deadline = time.monotonic() + 60
                while True:
                    entries, line = _lag(server)
                    if entries >= 50 and "failing" in line:
                        break
                    assert time.monotonic() < deadline, line
                    time.sleep(0.5)
            finally:
                start()
        _wait_archived(server, timeout_s=120)


def test_the_manifest_stays_small_with_one_entry_per_round(tmp_path: Path) -> None:
    """With archive-sync and one put at a time, every round archives a segment of one
    entry; merged segments keep the manifest, read and written whole every round, at a
    few dozen segments instead of one per put, and a restore still has every put."""
    archive = str(tmp_path / "archive")
    store = ArchiveStore(archive)
    keys = [f"/small/{i:04d}" for i in range(1000)]
    most = 0
    versions = {}
    flags = ["--archive-url", archive, "--archive-sync"]
    with standalone(tmp_path / "data", *flags) as server, Client(server.address) as client:
        for i, key in enumerate(keys):
            versions[key] = client.put(key, key.encode()).version_id
            if i % 50 == 49:
                manifest = store.load_manifest(("default", 0))
                assert manifest is not None and manifest.head.offset >= i
                most = max(most, len(manifest.segments))
    manifest = store.load_manifest(("default", 0))
    assert manifest is not None
    # 1,000 rounds; merges of 16 segments at a time leave fewer than 16 per level.
    assert most < 50 and len(manifest.segments) < 50, (most, len(manifest.segments))
    restored = tmp_path / "restored"
    result = run_cli("restore", "--archive-url", archive, "--data-dir", str(restored))
    assert result.returncode == 0, result.stdout + result.stderr
    with standalone(restored) as server, Client(server.address) as client:
        for key in keys:
            record = client.get(key)
            assert (record.value, record.version.version_id) == (key.encode(), versions[key])
