"""Both KV engines behave the same; RocksKv persists, MemoryKv models crashes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumstore.storage import kv as kv_module
from quorumstore.storage import rocks_kv
from quorumstore.storage.kv import KvClosedError, KvStore
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.rocks_kv import KvMemory, RocksKv


@pytest.fixture(params=["memory", "rocks"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KvStore]:
    store: KvStore = MemoryKv() if request.param == "memory" else RocksKv(tmp_path / "db")
    yield store
    store.close()


def fill(kv: KvStore, keys: list[bytes]) -> None:
    kv.write([(k, b"v" + k) for k in keys], [], [])


KEYS = [b"\x00meta", b"\x01a", b"\x01b", b"\x01c", b"\x02a", b"\x02a\x00", b"\x02b"]


def test_point_reads(kv: KvStore) -> None:
    fill(kv, KEYS)
    assert kv.get(b"\x01b") == b"v\x01b"
    assert kv.get(b"\x01bb") is None
    assert kv.multi_get([b"\x02b", b"nope", b"\x00meta"]) == [b"v\x02b", None, b"v\x00meta"]
    assert kv.multi_get([]) == []


def test_multi_get_across_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RocksKv looks keys up a slice at a time: every slice, the last partial one
    included, answers in order."""
    monkeypatch.setattr(rocks_kv, "_MULTI_GET_SLICE", 3)
    store = RocksKv(tmp_path / "db")
    fill(store, KEYS)
    asked = [b"nope", *reversed(KEYS), b"\x01bb", KEYS[0]]
    assert store.multi_get(asked) == [store.get(key) for key in asked]
    assert store.multi_get(asked)[1:3] == [b"v" + KEYS[-1], b"v" + KEYS[-2]]
    store.close()


def keys(items: Iterator[tuple[bytes, bytes]]) -> list[bytes]:
    return [k for k, _ in items]


def test_scans(kv: KvStore) -> None:
    fill(kv, KEYS)
    assert keys(kv.scan(b"", None)) == KEYS
    assert keys(kv.scan(b"\x01b", b"\x02a\x00")) == [b"\x01b", b"\x01c", b"\x02a"]
    assert keys(kv.scan(b"\x01b", b"\x02a\x00", reverse=True)) == [b"\x02a", b"\x01c", b"\x01b"]
    assert keys(kv.scan(b"\x01", None, reverse=True)) == KEYS[:0:-1]
    assert keys(kv.scan(b"\x02", b"\x01")) == []
    assert list(kv.scan(b"\x01a", b"\x01b")) == [(b"\x01a", b"v\x01a")]


@pytest.mark.parametrize("view", ["store", "snapshot"])
def test_scan_runs_are_the_scan_in_columns(kv: KvStore, view: str) -> None:
    many = [b"\x01k%04d" % i for i in range(250)]
    fill(kv, [*KEYS, *many])
    reader = kv.snapshot() if view == "snapshot" else kv
    runs = list(reader.scan_runs(b"\x01", b"\x02", 100))
    expected = list(reader.scan(b"\x01", b"\x02"))
    assert [len(k) for k, _ in runs] == [100, 100, 53]
    assert [item for k, v in runs for item in zip(k, v)] == expected
    assert list(reader.scan_runs(b"\x01", b"\x02", len(expected))) == [
        ([k for k, _ in expected], [v for _, v in expected])
    ]
    assert list(reader.scan_runs(b"\x03", None, 10)) == []
    assert list(reader.scan_runs(b"\x02", b"\x01", 10)) == []
    for bad in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="run_items and run_bytes must be positive"):
            next(reader.scan_runs(b"", None, *bad))


@pytest.mark.parametrize("view", ["store", "snapshot"])
def test_scan_runs_end_with_the_item_that_reaches_run_bytes(kv: KvStore, view: str) -> None:
    # Items of 10-byte keys and 100-2,000-byte values: a run never holds more than
    # run_bytes plus its last item, however many items run_items allows.
    sizes = [100 + (i * 37) % 1900 for i in range(300)]
    kv.write([(b"k%09d" % i, b"v" * n) for i, n in enumerate(sizes)], [], [])
    reader = kv.snapshot() if view == "snapshot" else kv
    runs = list(reader.scan_runs(b"", None, 10_000, 5_000))
    assert [item for k, v in runs for item in zip(k, v)] == list(reader.scan(b"", None))
    for i, (keys, values) in enumerate(runs):
        held = [len(k) + len(v) for k, v in zip(keys, values)]
        assert sum(held[:-1]) < 5_000
        assert sum(held) >= 5_000 or i == len(runs) - 1
    # run_items still bounds a run of small items first.
    assert max(len(k) for k, _ in reader.scan_runs(b"", None, 3, 1 << 30)) == 3


@pytest.mark.parametrize("view", ["store", "snapshot"])
def test_a_scan_cut_by_bytes_reads_every_item_both_ways(
    kv: KvStore, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run cut by bytes is short of its item count without being the last one.
    monkeypatch.setattr(kv_module, "DEFAULT_RUN_BYTES", 5_000)
    items = [(b"k%09d" % i, b"v" * (100 + (i * 37) % 1900)) for i in range(300)]
    kv.write(items, [], [])
    reader = kv.snapshot() if view == "snapshot" else kv
    runs: list[int] = []
    real = reader._run  # type: ignore[attr-defined]

    def run(*args: object) -> tuple[list[bytes], list[bytes]]:
        keys, values = real(*args)
        runs.append(sum(map(len, keys[:-1])) + sum(map(len, values[:-1])))
        return keys, values

    monkeypatch.setattr(reader, "_run", run)
    assert list(reader.scan(b"", None)) == items
    assert list(reader.scan(b"", None, reverse=True)) == items[::-1]
    assert len(runs) > 40 and max(runs) < 5_000


def test_seeks(kv: KvStore) -> None:
    fill(kv, [b"b", b"d"])
    assert kv.seek_ge(b"b") == (b"b", b"vb")
    assert kv.seek_gt(b"b") == (b"d", b"vd")
    assert kv.seek_le(b"c") == (b"b", b"vb")
    assert kv.seek_lt(b"d") == (b"b", b"vb")
    assert kv.seek_le(b"d") == (b"d", b"vd")
    assert kv.seek_lt(b"b") is None
    assert kv.seek_le(b"a") is None
    assert kv.seek_gt(b"d") is None
    assert kv.seek_ge(b"e") is None
    assert kv.seek_ge(b"") == (b"b", b"vb")


def test_write_applies_ranges_then_deletes_then_puts(kv: KvStore) -> None:
    fill(kv, [b"a", b"b", b"c", b"d"])
    kv.write(
        puts=[(b"b", b"new"), (b"e", b"ve")],
        deletes=[b"d", b"missing"],
        delete_ranges=[(b"a", b"c"), (b"z", b"y")],  # the inverted range deletes nothing
    )
    assert list(kv.scan(b"", None)) == [(b"b", b"new"), (b"c", b"vc"), (b"e", b"ve")]


def test_write_takes_its_puts_as_made_by_a_generator(kv: KvStore) -> None:
    """A large apply hands its records over as they are made (columnar_apply._items)."""
    made: list[bytes] = []

    def puts() -> Iterator[tuple[bytes, bytes]]:
        for i in range(3):
            made.append(b"k%d" % i)
            yield made[-1], b"v%d" % i

    kv.write(puts(), [b"old"], [])
    assert made == [b"k0", b"k1", b"k2"]  # consumed once
    assert list(kv.scan(b"", None)) == [(b"k0", b"v0"), (b"k1", b"v1"), (b"k2", b"v2")]


def test_load_sorted_puts_every_run_at_once(kv: KvStore, tmp_path: Path) -> None:
    kv.write([(b"\x00meta", b"m")], [], [])
    runs = [([b"a", b"b"], [b"va", b"vb"]), ([], []), ([b"c"], [b"vc"])]
    kv.load_sorted(iter(runs))
    kv.load_sorted(iter([]))
    assert list(kv.scan(b"", None)) == [
        (b"\x00meta", b"m"),
        (b"a", b"va"),
        (b"b", b"vb"),
        (b"c", b"vc"),
    ]
    assert list(tmp_path.rglob("*.load.sst")) == []


def test_a_load_whose_runs_fail_or_disorder_writes_nothing(kv: KvStore, tmp_path: Path) -> None:
    def cut() -> Iterator[tuple[list[bytes], list[bytes]]]:
        yield [b"a", b"b"], [b"va", b"vb"]
        raise ValueError("snapshot stream ended")

    with pytest.raises(ValueError, match="snapshot stream ended"):
        kv.load_sorted(cut())
    for disordered in ([b"b", b"a"], [b"a", b"a"]):
        with pytest.raises(ValueError, match="cannot bulk load into"):
            kv.load_sorted(iter([(disordered, [b"1", b"2"])]))
    assert list(kv.scan(b"", None)) == []
    assert list(tmp_path.rglob("*.load.sst")) == []


def test_rocks_removes_what_a_crashed_load_left(tmp_path: Path) -> None:
    RocksKv(tmp_path / "db").close()
    (tmp_path / "db" / "tmp1234.load.sst").write_bytes(b"half an SST file")
    kv = RocksKv(tmp_path / "db")
    kv.load_sorted(iter([([b"k"], [b"v"])]))
    kv.close()
    assert list((tmp_path / "db").glob("*.load.sst")) == []
    reopened = RocksKv(tmp_path / "db")
    assert list(reopened.scan(b"", None)) == [(b"k", b"v")]
    reopened.close()


def test_long_scan_survives_writes_while_suspended(kv: KvStore) -> None:
    keys = [b"k%05d" % i for i in range(5000)]
    fill(kv, keys)
    seen = []
    for i, (key, _) in enumerate(kv.scan(b"", None)):
        seen.append(key)
        if i == 100:
            kv.write([], [], [(b"k00050", b"k00200")])
    assert seen == sorted(set(seen))
    assert seen[:101] == keys[:101]
    assert seen[-1] == keys[-1]
    assert b"k04000" in seen


def test_snapshot_is_a_consistent_view(kv: KvStore) -> None:
    fill(kv, [b"a", b"b", b"c"])
    snap = kv.snapshot()
    kv.write([(b"b", b"changed"), (b"d", b"vd")], [b"a"], [])
    assert snap.get(b"a") == b"va"
    assert snap.get(b"d") is None
    assert snap.multi_get([b"b", b"d"]) == [b"vb", None]
    assert list(snap.scan(b"", None)) == [(b"a", b"va"), (b"b", b"vb"), (b"c", b"vc")]
    assert keys(snap.scan(b"", None, reverse=True)) == [b"c", b"b", b"a"]
    assert snap.seek_gt(b"c") is None
    assert snap.seek_lt(b"b") == (b"a", b"va")
    assert kv.get(b"a") is None
    snap.close()
    with pytest.raises(KvClosedError):
        snap.get(b"a")


def test_use_after_close_fails(kv: KvStore) -> None:
    snap = kv.snapshot()
    kv.close()
    with pytest.raises(KvClosedError):
        kv.get(b"a")
    with pytest.raises(KvClosedError):
        kv.write([(b"a", b"b")], [], [])
    with pytest.raises(KvClosedError):
        list(snap.scan(b"", None))


def test_rocks_persists_and_reopens_despite_open_snapshots(tmp_path: Path) -> None:
    kv = RocksKv(tmp_path / "db")
    fill(kv, [b"a", b"b"])
    kv.write([], [b"a"], [])
    snap = kv.snapshot()
    scan = kv.scan(b"", None)
    next(scan)
    kv.close()  # must release the database although a snapshot and a scan are open
    reopened = RocksKv(tmp_path / "db")
    assert list(reopened.scan(b"", None)) == [(b"b", b"vb")]
    reopened.close()
    del snap


def test_memory_crash_loses_unflushed_writes() -> None:
    kv = MemoryKv()
    fill(kv, [b"a", b"b", b"c"])
    kv.flush()
    kv.write([(b"a", b"changed"), (b"x", b"vx")], [b"b"], [(b"c", b"d")])
    kv.write([(b"y", b"vy")], [b"x"], [])
    snap = kv.snapshot()
    kv.crash()
    assert list(kv.scan(b"", None)) == [(b"a", b"va"), (b"b", b"vb"), (b"c", b"vc")]
    with pytest.raises(KvClosedError):
        snap.get(b"a")
    kv.write([(b"z", b"vz")], [], [])
    kv.flush()
    kv.crash()
    assert kv.get(b"z") == b"vz"


def test_memory_close_is_a_clean_shutdown() -> None:
    kv = MemoryKv()
    fill(kv, [b"a"])
    kv.close()
    kv.crash()  # the process dies after a clean close: nothing is lost
    assert kv.get(b"a") == b"va"


def test_memory_write_is_all_or_nothing() -> None:
    kv = MemoryKv()
    fill(kv, [b"a"])
    with pytest.raises(TypeError):
        kv.write([(b"b", b"vb"), ("c", b"vc")], [b"a"], [])  # type: ignore[list-item]
    assert list(kv.scan(b"", None)) == [(b"a", b"va")]


@pytest.mark.parametrize("shared", [True, False], ids=["one budget", "a budget each"])
def test_stores_under_one_memory_budget_flush_to_stay_within_it(
    tmp_path: Path, shared: bool
) -> None:
    """Four stores each take 24 MB: under one 64 MiB budget (32 MiB of memtables) they
    flush to SST files; on their own (two 64 MiB memtables each) they keep it all in memory."""
    memory = KvMemory(64 << 20) if shared else None
    stores = [RocksKv(tmp_path / f"kv{i}", memory) for i in range(4)]
    value = bytes(range(256)) * 4
    for i, store in enumerate(stores):
        for start in range(0, 24_000, 1000):
            store.write([(b"%d/%06d" % (i, n), value) for n in range(start, start + 1000)], [], [])
    sst_files = sorted(tmp_path.glob("kv*/*.sst"))
    if memory is not None:
        assert sst_files, "nothing was flushed under the budget"
        # Flushes run on RocksDB's background threads (writes do not stall for them), so
        # the memtables come back within the budget once the flushes under way end.
        deadline = time.monotonic() + 30
        while memory.write_buffers.get_usage() > memory.budget_bytes:
            assert time.monotonic() < deadline, memory.write_buffers.get_usage()
            time.sleep(0.05)
    else:
        assert sst_files == []
    for i, store in enumerate(stores):
        assert store.get(b"%d/%06d" % (i, 23_999)) == value
        store.close()


def test_a_memory_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive, got 0"):
        KvMemory(0)
