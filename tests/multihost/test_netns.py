"""Hosts as network namespaces: they reach each other, each fault cuts what it claims to,
its undo restores it, and teardown leaves nothing behind, even after a failure.

Reachability is a TCP echo (tests/multihost/probe.py) run inside the hosts: a server on
every host and on the bridge address, a client started in the host under test.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import Host, Hosts

pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(300)]

PROBE = Path(__file__).with_name("probe.py")
PORT = 7400
#: How long a probe waits before calling a host unreachable; a reachable one answers in ms.
CUT_TIMEOUT_S = 1.0
#: How long a probe of a reachable host may take on a busy machine.
REACH_TIMEOUT_S = 10.0
DELAY_MS = 100.0


@pytest.fixture(scope="module")
def echo_servers(hosts: Hosts) -> Iterator[list[subprocess.Popen[Any]]]:
    """A TCP echo server on every host (index i) and on the bridge address (last)."""
    servers = []
    for host, address in [*((h, "0.0.0.0") for h in hosts), (hosts.root, hosts.gateway)]:
        server = host.popen(
            [sys.executable, str(PROBE), "serve", address, str(PORT)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        servers.append(server)
    yield servers  # hosts.close() kills them


def probe(source: Host, address: str, timeout_s: float = REACH_TIMEOUT_S) -> dict[str, Any]:
    """The probe's report from inside `source` to `address`: `rtt_ms` (echo round trips)
    when it got through, `error` when not."""
    result = source.run(
        [sys.executable, str(PROBE), "connect", address, str(PORT), str(timeout_s), "5"],
        capture_output=True,
        text=True,
        timeout=timeout_s * 10 + 30,
    )
    try:
        return dict(json.loads(result.stdout))
    except ValueError:
        return {"error": f"exit {result.returncode}: {result.stdout} {result.stderr}"}


def rtts(source: Host, address: str) -> list[float]:
    """The echo round trips (ms) from `source` to `address`, which must answer."""
    report = probe(source, address)
    assert "rtt_ms" in report, f"{source} cannot reach {address}: {report}"
    return list(report["rtt_ms"])


def reaches(source: Host, address: str) -> bool:
    """Whether `address` echoes within REACH_TIMEOUT_S (asserting on it shows why not)."""
    return bool(rtts(source, address))


def cut_off(source: Host, address: str) -> bool:
    """Whether `source` gets no echo from `address` within CUT_TIMEOUT_S."""
    report = probe(source, address, CUT_TIMEOUT_S)
    assert "error" in report, f"{source} still reaches {address}: {report}"
    return True


def test_hosts_reach_each_other_and_the_bridge(healed: Hosts, echo_servers: list[Any]) -> None:
    addresses = [host.address for host in healed]
    assert len(set(addresses)) == len(healed)
    for source in healed:
        for address in [*addresses, healed.gateway]:
            assert reaches(source, address), f"{source} cannot reach {address}"


def test_isolate_cuts_a_host_off_and_heal_restores_it(
    healed: Hosts, echo_servers: list[Any]
) -> None:
    h0, h1, h2 = healed
    healed.isolate(h1)
    assert cut_off(h0, h1.address)
    assert cut_off(h1, h2.address)
    assert cut_off(h1, healed.gateway)
    assert reaches(h0, h2.address), "isolating h1 must leave the others connected"
    healed.heal(h1)
    assert reaches(h0, h1.address)
    assert reaches(h1, healed.gateway)


def test_partition_blocks_between_groups_not_within(healed: Hosts, echo_servers: list[Any]) -> None:
    h0, h1, h2 = healed
    healed.partition([[h0], [h1, h2]])
    assert cut_off(h0, h1.address)
    assert cut_off(h1, h0.address)
    assert cut_off(h2, h0.address)
    assert reaches(h1, h2.address)
    assert reaches(h2, h1.address)
    assert reaches(h0, healed.gateway), "the root namespace stays reachable from every group"
    healed.partition([[h0, h1], [h2]])  # a new partition replaces the old one
    assert reaches(h0, h1.address)
    assert cut_off(h1, h2.address)
    healed.heal_partition()
    assert reaches(h0, h2.address)
    assert reaches(h2, h0.address)


def one_way(source: Host, target: Host) -> bool:
    """Whether a UDP datagram from `source` reaches `target` (nothing comes back, so this
    sees one direction where a TCP echo needs both)."""
    receiver = target.popen(
        [
            sys.executable,
            str(PROBE),
            "udp-receive",
            target.address,
            str(PORT),
            str(CUT_TIMEOUT_S * 3),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        source.run(
            [sys.executable, str(PROBE), "udp-send", target.address, str(PORT), "20"], check=True
        )
        return bool(json.loads(receiver.communicate(timeout=REACH_TIMEOUT_S)[0])["received"])
    finally:
        receiver.kill()
        receiver.wait()
        target.processes.remove(receiver)


def test_drop_cuts_one_direction_only(healed: Hosts, echo_servers: list[Any]) -> None:
    h0, h1, h2 = healed
    healed.drop(h0, h1)
    assert not one_way(h0, h1)
    assert one_way(h1, h0), "dropping h0 -> h1 must leave h1 -> h0"
    # TCP needs answers both ways: a handshake either way loses its SYN or its SYN-ACK.
    assert cut_off(h0, h1.address)
    assert cut_off(h1, h0.address)
    assert reaches(h0, h2.address)
    assert reaches(h2, h1.address)
    healed.heal_partition()
    assert one_way(h0, h1)
    assert reaches(h0, h1.address)


def test_drop_both_ways_makes_a_bridge(healed: Hosts, echo_servers: list[Any]) -> None:
    """h0-h1 and h1-h2 connected, h0-h2 cut: two majorities overlapping in h1."""
    h0, h1, h2 = healed
    healed.drop(h0, h2)
    healed.drop(h2, h0)
    assert cut_off(h0, h2.address)
    assert cut_off(h2, h0.address)
    for a, b in ((h0, h1), (h1, h0), (h1, h2), (h2, h1)):
        assert reaches(a, b.address), f"the bridge must keep {a} -> {b}"
    healed.heal_partition()
    assert reaches(h0, h2.address)


def test_delay_adds_latency_and_loss_drops(healed: Hosts, echo_servers: list[Any]) -> None:
    h0, h1, _ = healed
    before = rtts(h0, h1.address)
    assert statistics.median(before) < DELAY_MS / 4, before
    healed.delay(h1, DELAY_MS)
    delayed = rtts(h0, h1.address)
    # Every reply leaves h1 DELAY_MS late (the connect's SYN-ACK too).
    assert min(delayed) >= 0.9 * DELAY_MS, delayed
    healed.clear_delay(h1)
    after = rtts(h0, h1.address)
    assert statistics.median(after) < DELAY_MS / 4, after
    healed.delay(h1, 0, loss_pct=100)
    assert cut_off(h0, h1.address)
    healed.clear_delay(h1)
    assert reaches(h0, h1.address)


def test_pause_freezes_a_process_and_resume_thaws_it(
    healed: Hosts, echo_servers: list[subprocess.Popen[Any]]
) -> None:
    h0, h1, _ = healed
    healed.pause(echo_servers[h1.index])
    # The kernel still accepts the connection; the frozen server never echoes.
    assert cut_off(h0, h1.address)
    healed.resume(echo_servers[h1.index])
    assert reaches(h0, h1.address)


def _links() -> str:
    return subprocess.run(
        ["ip", "-o", "link", "show"], check=False, capture_output=True, text=True
    ).stdout


def _namespaces() -> str:
    return subprocess.run(
        ["ip", "netns", "list"], check=False, capture_output=True, text=True
    ).stdout


def test_teardown_leaves_nothing_behind_even_after_a_failure() -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), Hosts(2) as made:
        sleeper = made[0].popen(["sleep", "600"])
        server = made[1].popen(
            [sys.executable, str(PROBE), "serve", "0.0.0.0", str(PORT)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        made.isolate(made[0])
        made.partition([[made[0]], [made[1]]])
        made.delay(made[1], 50, loss_pct=10)
        netem = made[1].processes[-1]
        made.pause(server)
        names = [str(h.netns) for h in made]
        assert all(name in _namespaces() for name in names)
        assert made.bridge in _links()
        raise Boom
    for proc in (sleeper, server, netem):
        assert proc.returncode is not None, f"{proc.args!r} still runs"
    namespaces = _namespaces()
    assert not [name for name in names if name in namespaces]
    assert not made.leftover_namespaces()
    assert f"qs{made.run_id}" not in _links()
