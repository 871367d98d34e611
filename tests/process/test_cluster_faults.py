"""Process-level fault tests of a replicated cluster (the "runnable replicated cluster" issue).

Every test runs real OS processes (`quorumstore node` x3 and `quorumstore coordinator`,
see cluster_harness.LocalCluster) and drives them with the official Oxia client. The faults
are real too: kill -9, SIGSTOP/SIGCONT, deleting a data directory, restarting on the
same port.

What "done" means, one test each:
1. kill -9 of a shard's leader, 5 times in a row under 8 concurrent writers: writes
   resume after each failover and every acknowledged write is read back;
2. kill -9 of a follower: writes go on, with no election;
3. a follower that lost its data directory rejoins by snapshot and converges;
4. kill -9 of the coordinator: the data path keeps working, and the restarted
   coordinator (same metadata) manages the shards it had (it elects a new leader);
and the CLI's `cluster` command end to end. Also: a leader paused (SIGSTOP) until it is
replaced, then resumed, acknowledges no write it did not keep; a leader whose file
writes fail (RLIMIT_FSIZE) stops and is replaced; an election waits for a coordinator
whose metadata saves fail and completes once they work.

Failover times (kill -9 to the first acknowledged write issued after the kill) are
printed in the terminal summary.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster_harness import LocalCluster, WriteLoad, poll_until, run_cli, start_cli
from quorumstore.cli.status import fetch_status
from quorumstore.coordinator.cluster_status import all_replicas_serving, format_status
from quorumstore.storage.reads import ShardReader
from quorumstore.storage.rocks_kv import RocksKv
from quorumstore.storage.wal import Wal
from quorumstore.testing import official_oxia_client

MakeCluster = Callable[..., LocalCluster]
MakeLoad = Callable[..., WriteLoad]
Measure = Callable[[str], None]

pytestmark = [pytest.mark.process, pytest.mark.slow]

LEADER_KILLS = 5
#: Bound on one failover (kill -9 to the first acknowledged write issued after it).
FAILOVER_TIMEOUT_S = 20.0


# ------------------------------------------------------------------ 1. leader kills


@pytest.mark.timeout(240)
def test_leader_killed_five_times_under_concurrent_writes(
    make_cluster: MakeCluster, write_load: MakeLoad, measure: Measure
) -> None:
    """8 writers; the leader of shard 0 is killed -9 and restarted, 5 times in a row."""
    cluster = make_cluster(nodes=3, shards=2, replication_factor=3)
    shard = 0
    failovers: list[float] = []
    load = write_load(cluster)
    load.wait_for_write_after(time.monotonic(), None, 20, count=50)
    for round_no in range(1, LEADER_KILLS + 1):
        leader = cluster.leader_of(shard)
        assert leader is not None
        term = cluster.shard_metadata(shard).term
        killed_at = cluster.kill9(leader)
        first = load.wait_for_write_after(killed_at, shard, FAILOVER_TIMEOUT_S)
        new_leader, new_term = cluster.wait_new_leader(shard, not_on=leader, after_term=term)
        failovers.append(first.acked_at - killed_at)
        measure(
            f"leader kill {round_no}: {leader} (term {term}) -> {new_leader} (term {new_term}); "
            f"first write issued after the kill acknowledged {failovers[-1]:.2f} s after it"
        )
        cluster.restart(leader)
        cluster.wait_rejoined(leader)  # a majority of every shard is up before the next kill
    load.wait_for_write_after(time.monotonic(), shard, FAILOVER_TIMEOUT_S, count=20)
    load.stop()
    measure(
        f"leader failover, kill -9 -> first acknowledged write, {LEADER_KILLS} kills: "
        f"min {min(failovers):.2f} s, mean {sum(failovers) / len(failovers):.2f} s, max {max(failovers):.2f} s; "
        f"{load.acked_count()} writes acknowledged to {load.clients} clients"
    )
    measure("  " + load.verify())


@pytest.mark.timeout(240)
def test_paused_leader_replaced_and_resumed_acknowledges_nothing_it_lost(
    make_cluster: MakeCluster, write_load: MakeLoad, measure: Measure
) -> None:
    """The leader of shard 0 is paused (SIGSTOP) under 8 writers until another node leads,
    then resumed, 3 times. Writes sent to it meanwhile wait in its sockets; on waking it
    still takes itself for the leader, proposes them, and learns of the new term and
    leader only afterwards. None of them may be acknowledged unless it took effect:
    every acknowledged write is read back with its value. (This did not reproduce the
    deposed-leader bug of tests/unit/test_shard_host.py in 3 runs on the old code.)"""
    cluster = make_cluster(nodes=3, shards=2, replication_factor=3)
    shard = 0
    load = write_load(cluster)
    load.wait_for_write_after(time.monotonic(), None, 20, count=50)
    for round_no in range(1, 4):
        leader = cluster.leader_of(shard)
        assert leader is not None
        term = cluster.shard_metadata(shard).term
        paused_at = cluster.pause(leader)
        try:
            # (Writers whose put waits on the paused node wait with it: the official
            # client sets no deadline.)
            new_leader, new_term = cluster.wait_new_leader(shard, not_on=leader, after_term=term)
            elected_at = time.monotonic()
        finally:
            cluster.resume(leader)
        first = load.wait_for_write_after(elected_at, shard, FAILOVER_TIMEOUT_S)
        cluster.wait_following(leader, shard)
        measure(
            f"leader pause {round_no}: {leader} (term {term}) -> {new_leader} (term {new_term}) "
            f"{elected_at - paused_at:.2f} s after the pause; resumed, it follows; first write "
            f"issued after the election acknowledged {first.acked_at - elected_at:.2f} s after it"
        )
    load.wait_for_write_after(time.monotonic(), shard, FAILOVER_TIMEOUT_S, count=20)
    load.stop()
    measure("  " + load.verify())


@pytest.mark.timeout(120)
def test_a_leader_paused_for_less_than_the_failure_timeout_keeps_its_shard(
    make_cluster: MakeCluster,
) -> None:
    """With --failure-timeout-ms 3000, a leader paused for 1.5 s (3x the default timeout)
    is still the leader in the same term once resumed; paused for good, it is replaced,
    and not before the timeout has run (less one tick for its last report's age)."""
    cluster = make_cluster(
        nodes=3, shards=1, replication_factor=3, coordinator_args=["--failure-timeout-ms", "3000"]
    )
    leader = cluster.leader_of(0)
    assert leader is not None
    term = cluster.shard_metadata(0).term
    cluster.pause(leader)
    time.sleep(1.5)
    cluster.resume(leader)
    time.sleep(0.5)  # health reports flow again
    assert (cluster.leader_of(0), cluster.shard_metadata(0).term) == (leader, term)
    paused_at = cluster.pause(leader)
    try:
        cluster.wait_new_leader(0, not_on=leader, after_term=term)
        replaced_after_s = time.monotonic() - paused_at
    finally:
        cluster.resume(leader)
    assert replaced_after_s >= 2.8, f"replaced {replaced_after_s:.2f} s after the pause"


@pytest.mark.timeout(120)
def test_a_paused_node_does_not_hold_back_the_others_news_of_new_leaders(
    make_cluster: MakeCluster,
) -> None:
    """A shard's leader, not the last node the coordinator pushes assignments to (it
    pushes in the nodes' order), is paused. The new leader must reach every other node's
    map soon after its election, not after the paused node's push timed out (5 s):
    clients that follow a map from those nodes, and the calls they relay, wait until
    then."""
    cluster = make_cluster(nodes=3, shards=3, replication_factor=3)
    shard, paused = next(
        (s, leader)
        for s in range(cluster.shards)
        if (leader := cluster.leader_of(s)) not in (None, cluster.nodes[-1])
    )
    term = cluster.shard_metadata(shard).term
    cluster.pause(paused)
    try:
        new_leader, _ = cluster.wait_new_leader(shard, not_on=paused, after_term=term)
        elected_at = time.monotonic()
        for node in cluster.nodes:
            if node != paused:
                poll_until(
                    lambda node=node: cluster.listed_leader(node, shard) == new_leader or None,
                    10,
                    f"{node}'s map to name {new_leader} for shard {shard}",
                )
        known_after_s = time.monotonic() - elected_at
    finally:
        cluster.resume(paused)
    assert known_after_s < 2.0, f"the other nodes knew the new leader {known_after_s:.2f} s later"


# ------------------------------------------------------------------ leader storage failure


@pytest.mark.timeout(180)
def test_a_leader_whose_storage_fails_stops_and_the_cluster_goes_on(
    make_cluster: MakeCluster, write_load: MakeLoad, measure: Measure
) -> None:
    """A leader whose file writes start failing (a full disk; here its files reach the
    RLIMIT_FSIZE set on its running process) must not hold on to a shard it can no
    longer commit to: it stops with one clear error, another node leads, the writers go
    on, and restarted with room again it recovers from its files and catches up. No
    acknowledged write is lost."""
    cluster = make_cluster(nodes=3, shards=1, replication_factor=3)
    shard = 0
    load = write_load(cluster)
    load.wait_for_write_after(time.monotonic(), None, 20, count=50)
    leader = cluster.leader_of(shard)
    assert leader is not None
    term = cluster.shard_metadata(shard).term
    limited_at = time.monotonic()
    cluster.limit_file_size(leader, cluster.log_size(leader) + 128 * 1024)
    assert cluster.wait_exited(leader, 30) == 1
    stopped_after = time.monotonic() - limited_at
    log = cluster.log_text(leader)
    failure = f"shard default/0 on node {leader} failed"
    assert log.count(" CRITICAL ") == 1 and failure in log, log[-3000:]
    assert "File too large" in log and f"quorumstore: error: {failure}" in log, log[-3000:]
    new_leader, new_term = cluster.wait_new_leader(shard, not_on=leader, after_term=term)
    first = load.wait_for_write_after(time.monotonic(), shard, FAILOVER_TIMEOUT_S, count=20)
    measure(
        f"leader storage failure: {leader} stopped {stopped_after:.2f} s after its file size "
        f"limit was set; {new_leader} leads in term {new_term}; writes went on "
        f"({first.key} acknowledged)"
    )
    cluster.restart(leader)  # a new process, without the limit
    cluster.wait_rejoined(leader)
    load.stop()
    _, mine = cluster.wait_caught_up(leader, shard)
    measure(f"  restarted, it caught up: head {mine.head.offset}, commit {mine.commit_offset}")
    measure("  " + load.verify())


# ------------------------------------------------------------------ 2. follower kill


@pytest.mark.timeout(150)
def test_follower_kill_does_not_interrupt_writes(
    make_cluster: MakeCluster, write_load: MakeLoad, measure: Measure
) -> None:
    """Losing one follower of three changes nothing for writers: no election, no pause."""
    cluster = make_cluster(nodes=3, shards=1, replication_factor=3)
    shard = 0
    before = cluster.shard_metadata(shard)
    follower = next(n for n in before.ensemble if n != before.leader)
    load = write_load(cluster, clients=4)
    load.wait_for_write_after(time.monotonic(), shard, 20, count=50)
    killed_at = cluster.kill9(follower)
    first = load.wait_for_write_after(killed_at, shard, 5)
    load.wait_for_write_after(killed_at, shard, 20, count=100)
    window_end = time.monotonic()
    after = cluster.shard_metadata(shard)
    assert (after.term, after.leader) == (before.term, before.leader), (
        "losing a follower started an election"
    )
    gap = load.largest_gap(killed_at, window_end, shard)
    measure(
        f"follower kill: first write issued after the kill acknowledged in {first.acked_at - killed_at:.3f} s; "
        f"longest pause between acknowledgements {gap:.3f} s; term stayed {after.term}, leader stayed {after.leader}"
    )
    cluster.restart(follower)
    cluster.wait_following(follower, shard)
    load.stop()
    _, mine = cluster.wait_caught_up(follower, shard)
    measure(f"  restarted follower caught up: head {mine.head.offset}, commit {mine.commit_offset}")
    measure("  " + load.verify())


# ------------------------------------------------------------------ 3. wiped follower


@pytest.mark.timeout(150)
def test_wiped_follower_rejoins_by_snapshot(
    make_cluster: MakeCluster, write_load: MakeLoad, measure: Measure
) -> None:
    """A follower whose data directory was deleted while down is rebuilt from a snapshot."""
    cluster = make_cluster(nodes=3, shards=1, replication_factor=3)
    shard = 0
    meta = cluster.shard_metadata(shard)
    follower = next(n for n in meta.ensemble if n != meta.leader)
    load = write_load(cluster, clients=4)
    load.wait_for_write_after(time.monotonic(), shard, 20, count=200)
    killed_at = cluster.kill9(follower)
    cluster.wipe(follower)
    load.wait_for_write_after(killed_at, shard, 20, count=100)  # the other two go on
    cluster.restart(follower)
    restarted_at = time.monotonic()
    cluster.wait_following(follower, shard)
    load.wait_for_write_after(restarted_at, shard, 20, count=100)
    load.stop()
    cluster.wait_caught_up(follower, shard)
    converged_s = time.monotonic() - restarted_at
    # Verifying reads: each read commits a no-op entry first (docs/protocol.md, Reads), so
    # the follower is compared with the leader after them.
    verified = load.verify()
    _, mine = cluster.wait_caught_up(follower, shard)
    measure(
        f"wiped follower rejoined and converged {converged_s:.2f} s after its restart: "
        f"head {mine.head.offset} and commit {mine.commit_offset} equal the leader's"
    )
    measure("  " + verified)

    # Offline look at the rebuilt replica: its log starts at a snapshot position, and
    # its KV holds every acknowledged write.
    cluster.kill9(follower)
    shard_dir = cluster.node_dir(follower) / "shards" / "default" / str(shard)
    with Wal.open(shard_dir / "wal", sync=False) as wal:
        snapshot_at = wal.base.offset
    assert snapshot_at >= 0, (
        "the follower's log starts at the beginning: it was not rebuilt from a snapshot"
    )
    kv = RocksKv(shard_dir / "kv")
    try:
        reader = ShardReader(kv)
        assert reader.applied_position.offset == mine.commit_offset
        for write in load.acked:
            record = reader.get(write.key)
            assert record is not None and record.value == write.value, (
                f"{write.key} on the rebuilt follower"
            )
    finally:
        kv.close()
    measure(
        f"  its log starts after a snapshot at offset {snapshot_at}; its KV holds all {len(load.acked)} writes"
    )
    cluster.restart(follower)
    cluster.wait_following(follower, shard)


# ------------------------------------------------------------------ 4. coordinator kill


@pytest.mark.timeout(180)
def test_an_election_waits_for_a_failing_metadata_save_and_then_completes(
    make_cluster: MakeCluster, write_load: MakeLoad, measure: Measure
) -> None:
    """The coordinator cannot save its metadata (its directory replaced by a file, so every
    save fails with ENOTDIR, as a full disk or an object store's outage would fail it) when
    a leader dies: the election waits, and says why in the log, instead of the coordinator's
    loop ending for good. Once saves work again the shard gets a leader and writes resume;
    no acknowledged write is lost."""
    cluster = make_cluster(nodes=3, shards=1, replication_factor=3)
    load = write_load(cluster)
    load.wait_for_write_after(time.monotonic(), None, 20, count=50)
    leader = cluster.leader_of(0)
    assert leader is not None
    term = cluster.shard_metadata(0).term
    directory = cluster.metadata_path.parent
    moved = directory.with_name(directory.name + ".moved")
    directory.rename(moved)
    directory.write_text("a file where the metadata directory was")
    try:
        cluster.kill9(leader)
        poll_until(
            lambda: "saving the coordinator metadata" in cluster.coordinator.log_tail(20_000),
            20,
            "the coordinator to log a failed metadata save",
        )
        time.sleep(2)  # a few retries
    finally:
        directory.unlink()
        moved.rename(directory)
    restored_at = time.monotonic()
    new_leader, new_term = cluster.wait_new_leader(0, not_on=leader, after_term=term)
    first = load.wait_for_write_after(restored_at, 0, FAILOVER_TIMEOUT_S, count=20)
    log = cluster.coordinator.log_tail(20_000)
    assert f"saving the coordinator metadata to {cluster.metadata_path} failed" in log, log
    assert "elections and leader changes wait until it succeeds" in log, log
    measure(
        f"metadata saves failing: election after killing {leader} waited; {new_leader} leads in "
        f"term {new_term}, first write issued after saves work again acknowledged "
        f"{first.acked_at - restored_at:.2f} s after"
    )
    cluster.restart(leader)
    cluster.wait_rejoined(leader)
    load.stop()
    measure("  " + load.verify())


@pytest.mark.timeout(150)
def test_coordinator_kill_and_restart(
    make_cluster: MakeCluster, write_load: MakeLoad, measure: Measure
) -> None:
    """Without the coordinator the data path works; restarted, it manages the same shards."""
    cluster = make_cluster(nodes=3, shards=2, replication_factor=3)
    before = {m.shard: (m.term, m.leader) for m in cluster.status().metadata.shards}
    load = write_load(cluster, clients=4)
    load.wait_for_write_after(time.monotonic(), None, 20, count=50)

    killed_at = cluster.kill9_coordinator()
    for shard in range(cluster.shards):
        load.wait_for_write_after(killed_at, shard, 10, count=30)
    with cluster.open_client() as reader:
        acked_so_far = load.writes_issued_after(0)
        sample = load.writes_issued_after(killed_at)[-1]
        assert reader.get(sample.key)[1] == sample.value
        listed = set(reader.list("/load/", "/load/~"))
        assert all(w.key in listed for w in acked_so_far), (
            "a list without the coordinator misses acknowledged keys"
        )
    measure(
        f"coordinator down: {len(load.writes_issued_after(killed_at))} writes acknowledged and reads served "
        f"within {time.monotonic() - killed_at:.2f} s of its kill"
    )

    cluster.restart_coordinator()
    status = cluster.wait_online()
    after = {m.shard: (m.term, m.leader) for m in status.metadata.shards}
    assert after == before, (
        f"the restarted coordinator changed roles without a fault: {before} -> {after}"
    )

    shard = 0
    term, leader = after[shard]
    killed_at = cluster.kill9(leader)
    first = load.wait_for_write_after(killed_at, shard, FAILOVER_TIMEOUT_S)
    new_leader, new_term = cluster.wait_new_leader(shard, not_on=leader, after_term=term)
    # `quorumstore status` shows the new leader's offsets, not "?" behind the dead one's
    # last report (which the coordinator keeps).
    deadline = time.monotonic() + 10
    while True:
        table = format_status(cluster.status())
        row = next(line for line in table.splitlines() if line.startswith(f"default/{shard} "))
        if "?" not in row or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "?" not in row, f"status lost the new leader's offsets:\n{table}"
    measure(
        f"restarted coordinator replaced killed leader {leader} by {new_leader} (term {term} -> {new_term}); "
        f"first write issued after the kill acknowledged {first.acked_at - killed_at:.2f} s after it"
    )
    cluster.restart(leader)
    cluster.wait_rejoined(leader)
    load.stop()
    measure("  " + load.verify())


# ------------------------------------------------------------------ the CLI's cluster command


def _children_of(pid: int) -> list[int]:
    """Pids whose parent is `pid` (from /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == pid:
            children.append(int(entry))
    return children


def _command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _blocks(pid: int, signum: signal.Signals) -> bool:
    """Whether the main thread of process `pid` has `signum` blocked."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.MULTILINE)
    assert mask is not None, status
    return bool(int(mask.group(1), 16) >> (signum - 1) & 1)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = (
        Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        if Path(f"/proc/{pid}").exists()
        else "X"
    )
    return state not in ("Z", "X")


def _start_cli_cluster(data_dir: Path, base_port: int) -> subprocess.Popen[str]:
    return start_cli(
        "cluster", "--nodes", "3", "--shards", "2", "--replication-factor", "3",
        "--data-dir", str(data_dir), "--base-port", str(base_port),
    )  # fmt: skip


def _follow_output(process: subprocess.Popen[str]) -> tuple[list[str], threading.Thread]:
    """Collects the output lines of `cluster` in a thread, once its banner is complete;
    returns them (the list keeps growing) and the thread."""
    lines: list[str] = []
    ready = threading.Event()

    def read_output() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "Ctrl-C stops the cluster" in line:
                ready.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    assert ready.wait(60), f"`quorumstore cluster` did not come up:\n{''.join(lines)}"
    return lines, reader


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [pid for pid in pids if _pid_exists(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.timeout(120)
def test_cli_cluster_command_end_to_end(tmp_path: Path, port_block: Callable[[int], int]) -> None:
    """`quorumstore cluster` starts, serves the official client, reports status, stops on Ctrl-C."""
    nodes = 3
    base = port_block(nodes + 1)
    process = _start_cli_cluster(tmp_path / "qs", base)
    children: list[int] = []
    try:
        lines, reader = _follow_output(process)
        output = "".join(lines)
        client_address = re.search(r"client address: (\S+)", output)
        coordinator = re.search(r"coordinator:\s+(\S+)", output)
        assert client_address and coordinator, output
        children = _children_of(process.pid)
        assert len(children) == nodes + 1, (
            f"expected {nodes} nodes and a coordinator, found children {children}"
        )

        with official_oxia_client(client_address.group(1)) as client:
            for i in range(20):
                client.put(f"/cli/{i}", f"value-{i}")
            assert [client.get(f"/cli/{i}")[1] for i in range(20)] == [
                f"value-{i}".encode() for i in range(20)
            ]

        status = run_cli("status", "--coordinator", coordinator.group(1), timeout_s=30)
        assert status.returncode == 0, status.stderr
        assert re.search(r"default/0\s+online", status.stdout) and re.search(
            r"default/1\s+online", status.stdout
        ), status.stdout

        # A child that dies is reported with the end of its log and restarted: a node
        # follows its shards again, the coordinator resumes from its metadata; the rest
        # go on meanwhile.
        named = {
            f"node{int(port.group(1)) - base}"
            if (port := re.search(r" node .*--port (\d+)", _command_line(pid)))
            else "coordinator": pid
            for pid in children
        }
        assert sorted(named) == ["coordinator", "node0", "node1", "node2"], named
        for name in ("node1", "node2", "coordinator"):
            os.kill(named[name], signal.SIGKILL)
            poll_until(
                lambda n=name: f"{n} restarted (pid " in "".join(lines),
                timeout_s=15,
                what=f"`cluster` to restart {name}",
                describe=lambda: "".join(lines),
            )
            output = "".join(lines)
            log_file = tmp_path / "qs" / f"{name}.log"
            assert f"{name} exited (killed by SIGKILL); the end of {log_file}" in output
            assert "restarting it in 0.5 s from its data directory" in output
            poll_until(
                lambda: all_replicas_serving(fetch_status(coordinator.group(1))),
                timeout_s=30,
                what=f"every replica to serve again after {name} restarted",
            )
        with official_oxia_client(client_address.group(1)) as client:
            for i in range(20):
                client.put(f"/cli/after/{i}", f"after-{i}")
            assert [client.get(f"/cli/after/{i}")[1] for i in range(20)] == [
                f"after-{i}".encode() for i in range(20)
            ]
        children = _children_of(process.pid)
        assert len(children) == nodes + 1, children
        # `cluster` blocks the stop signals while it watches; a restarted child must not
        # inherit that, or SIGTERM would not stop it.
        assert not [pid for pid in children if _blocks(pid, signal.SIGTERM)], children

        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        reader.join(5)
        assert "cluster stopped" in "".join(lines)
        assert "".join(lines).count(" exited (") == 3
        left = [pid for pid in children if _pid_exists(pid)]
        assert not left, f"child processes {left} outlived `quorumstore cluster`"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(180)
def test_cli_cluster_children_never_outlive_it(
    tmp_path: Path, port_block: Callable[[int], int]
) -> None:
    """Closing the terminal (SIGHUP) stops the cluster as Ctrl-C does; kill -9 of the
    `cluster` process takes its children down too; a second cluster on ports in use is
    refused in one line instead of reporting the first one's status as its own."""
    base = port_block(4)
    first = _start_cli_cluster(tmp_path / "qs", base)
    children: list[int] = []
    try:
        _follow_output(first)
        children = _children_of(first.pid)
        assert len(children) == 4, f"expected 3 nodes and a coordinator, found {children}"

        second = run_cli(
            "cluster", "--nodes", "3", "--shards", "2",
            "--data-dir", str(tmp_path / "other"), "--base-port", str(base),
        )  # fmt: skip
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"cannot listen on 127.0.0.1:{base} for node 0" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr

        first.kill()
        first.wait()
        assert not _wait_gone(children, 15), "cluster children outlived a kill -9 of `cluster`"

        again = _start_cli_cluster(tmp_path / "qs", base)
        try:
            _follow_output(again)
            children = _children_of(again.pid)
            assert len(children) == 4, f"expected 3 nodes and a coordinator, found {children}"
            again.send_signal(signal.SIGHUP)
            assert again.wait(30) == 0
            assert not _wait_gone(children, 5), "cluster children outlived SIGHUP"
        finally:
            if again.poll() is None:
                again.kill()
    finally:
        if first.poll() is None:
            first.kill()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
