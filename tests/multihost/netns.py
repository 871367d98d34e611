"""Hosts on one machine: Linux network namespaces on one bridge, with network faults.

`Hosts(n)` makes a bridge in the root namespace with the address `<subnet>.1/24` and n
namespaces `qs-<run>-h<i>`, each joined to the bridge by a veth pair and given the address
`<subnet>.(10+i)/24` and a default route via the bridge. The subnet is 198.18.0.0/24 unless
another run's bridge holds it, then the next free 198.18.N.0/24: all of them lie in the
benchmarking range 198.18.0.0/15, which never leaves the machine. Every name carries a
random run id, so parallel and leftover runs never clash; teardown touches only what this
run made.

Each `Host` runs commands inside its namespace (`ip netns exec`) and remembers every
process it started; `Hosts.root` runs them in the root namespace, where the bridge address
lives. The fault helpers (`isolate`, `partition`, `drop`, `delay`, `pause`) each have an undo, and
`close()` undoes everything, kills every process (SIGKILL of its process group, then any
process still inside a namespace), and deletes the namespaces, veths and the bridge, also
after a failure.

Needs root, `ip` (iproute2) and, for `partition`, `drop` and `delay`, iptables (scripts/test.sh
installs it). The kernel here has no `netem` qdisc, so `delay` queues a host's outgoing
packets to tests/multihost/netem.py through NFQUEUE.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

#: The /24s a run may take, all in the benchmarking range 198.18.0.0/15, first free first.
_SUBNETS = [f"198.18.{n}" for n in range(256)] + [f"198.19.{n}" for n in range(256)]
#: Serialises choosing a subnet and claiming it, between parallel runs.
_LOCK_PATH = Path("/run/lock/quorumstore-multihost.lock")
_NETEM = Path(__file__).with_name("netem.py")
#: The interface inside every namespace (namespaces have their own interface names).
INNER_INTERFACE = "eth0"
_PARTITION_CHAIN = "qs-partition"
_DELAY_CHAIN = "qs-delay"
_KILL_WAIT_S = 10.0


def unavailable_reason() -> str | None:
    """Why this machine cannot make hosts (not root, no `ip netns`), or None when it can."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces, veths, a bridge)"
    if shutil.which("ip") is None:
        return "multi-host tests need `ip` (iproute2)"
    probe = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` is unavailable: {probe.stderr.strip()}"
    return None


def iptables() -> str:
    """The iptables binary: the legacy one, because NFQUEUE has no nf_tables kernel support."""
    for name in ("iptables-legacy", "iptables"):
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError("partition/delay need iptables (scripts/test.sh installs it)")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], check=False, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILLs the process group of `proc` (each tracked process leads its own) and reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_KILL_WAIT_S)


class Host:
    """One host: a network namespace (or the root namespace, `netns=None`) and an address."""

    def __init__(self, index: int, netns: str | None, address: str, veth: str | None) -> None:
        self.index = index
        self.netns = netns
        self.address = address
        #: The root-namespace end of the host's veth pair (None for the root namespace).
        self.veth = veth
        self.processes: list[subprocess.Popen[Any]] = []
        #: Whether the fault chains are hooked into this host's iptables yet.
        self.fault_chains = False

    def __repr__(self) -> str:
        return f"Host({self.netns or 'root'}, {self.address})"

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` as run inside this host."""
        argv = [str(arg) for arg in argv]
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv

    def popen(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Starts `argv` inside this host in a process group of its own (so teardown, pause
        and resume reach its children too) and tracks it."""
        popen_kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(argv), **popen_kwargs)
        self.processes.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | bytes | None = None,
        timeout: float | None = 60.0,
        check: bool = False,
        **popen_kwargs: Any,
    ) -> subprocess.CompletedProcess[Any]:
        """Like `subprocess.run`, inside this host; the process group dies on a timeout."""
        if popen_kwargs.pop("capture_output", False):
            popen_kwargs.setdefault("stdout", subprocess.PIPE)
            popen_kwargs.setdefault("stderr", subprocess.PIPE)
        if input is not None:
            popen_kwargs.setdefault("stdin", subprocess.PIPE)
        proc = self.popen(argv, **popen_kwargs)
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise
        finally:
            self.processes.remove(proc)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        if check:
            result.check_returncode()
        return result

    def pids(self) -> list[int]:
        """Every process inside this host's namespace (the root namespace: untracked, [])."""
        if self.netns is None:
            return []
        listed = _ip("netns", "pids", self.netns, check=False).stdout.split()
        return [int(pid) for pid in listed]

    def kill_all(self) -> None:
        """Kills every process this host started, then any other still inside its namespace
        (Spark executors and Python workers a tracked process spawned)."""
        for proc in self.processes:
            _kill_group(proc)
        self.processes.clear()
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)


class Hosts:
    """N hosts on one bridge, with fault helpers whose effects `close()` always undoes."""

    def __init__(self, count: int, run_id: str | None = None) -> None:
        self.run_id = run_id or secrets.token_hex(3)
        self.count = count
        self.bridge = f"qs{self.run_id}br"
        self.subnet = ""
        self.hosts: list[Host] = []
        self.root = Host(-1, None, "", None)
        self._namespaces: list[str] = []
        self._links: list[str] = []
        self._isolated: set[int] = set()
        self._delays: dict[int, subprocess.Popen[Any]] = {}
        self._paused: list[subprocess.Popen[Any]] = []
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    @property
    def gateway(self) -> str:
        """The bridge's address in the root namespace: where a driver or master listens."""
        return self.root.address

    def start(self) -> None:
        if not 0 < self.count <= 244:
            raise ValueError(f"{self.count} hosts: host addresses run .10 to .254")
        self._claim_subnet()
        for i in range(self.count):
            self._add_host(i)

    def _claim_subnet(self) -> None:
        """Makes the bridge and gives it the first /24 no other interface uses, under a lock
        so two runs starting together never take the same one."""
        _LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        with open(_LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            used = _ip("-4", "-o", "addr", "show").stdout
            free = [s for s in _SUBNETS if f" {s}." not in used]
            if not free:
                raise RuntimeError("no free /24 left in 198.18.0.0/15")
            self.subnet = free[0]
            _ip("link", "add", self.bridge, "type", "bridge")
            self._links.append(self.bridge)
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        self.root.address = f"{self.subnet}.1"

    def _add_host(self, i: int) -> None:
        netns = f"qs-{self.run_id}-h{i}"
        veth = f"qs{self.run_id}h{i}"
        if len(veth) > 15:
            raise ValueError(f"interface name {veth!r} exceeds Linux's 15 characters")
        address = f"{self.subnet}.{10 + i}"
        _ip("netns", "add", netns)
        self._namespaces.append(netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", INNER_INTERFACE, "netns", netns)
        self._links.append(veth)
        _ip("link", "set", veth, "master", self.bridge, "up")
        inside = ("-n", netns)
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "addr", "add", f"{address}/24", "dev", INNER_INTERFACE)
        _ip(*inside, "link", "set", INNER_INTERFACE, "up")
        _ip(*inside, "route", "add", "default", "via", self.root.address)
        self.hosts.append(Host(i, netns, address, veth))

    def close(self) -> None:
        """Kills every process and deletes every namespace, veth and the bridge this run
        made. Safe to call twice and after a partial start."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for proc in self._paused:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGCONT)
        for host in [*self.hosts, self.root]:
            host.kill_all()
        for netns in self._namespaces:
            result = _ip("netns", "del", netns, check=False)
            if result.returncode != 0:
                errors.append(f"ip netns del {netns}: {result.stderr.strip()}")
        # Deleting a namespace deletes its veth pair, but asynchronously: delete the root
        # ends explicitly, then wait until no link of this run remains.
        for link in reversed(self._links):
            _ip("link", "del", link, check=False)
        deadline = time.monotonic() + 10.0
        while self.leftover_links() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.leftover_links():
            errors.append(f"links left: {self.leftover_links()}")
        if errors:
            raise RuntimeError("teardown of hosts failed: " + "; ".join(errors))

    def leftover_links(self) -> list[str]:
        """The links of this run that still exist."""
        listed = _ip("-o", "link", "show", check=False).stdout
        names = [line.split(":")[1].strip().split("@")[0] for line in listed.splitlines()]
        return [name for name in names if name.startswith(f"qs{self.run_id}")]

    def leftover_namespaces(self) -> list[str]:
        """The namespaces of this run that still exist."""
        listed = _ip("netns", "list", check=False).stdout.split()
        return [name for name in listed if name.startswith(f"qs-{self.run_id}-")]

    # ------------------------------------------------------------------ faults

    def isolate(self, host: Host) -> None:
        """Cuts `host` off from every other host and the bridge: its veth goes down."""
        _ip("link", "set", self._veth(host), "down")
        self._isolated.add(host.index)

    def heal(self, host: Host) -> None:
        """Undoes `isolate(host)`, returning once both ends of the veth are operationally
        up: the kernel reports a carrier change (and the bridge forwards again) only
        after its link watch runs, up to a second later or more on a busy machine."""
        veth = self._veth(host)
        _ip("link", "set", veth, "up")
        self._isolated.discard(host.index)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            outer = _ip("-o", "link", "show", "dev", veth).stdout
            inner = _ip("-n", str(host.netns), "-o", "link", "show", "dev", INNER_INTERFACE).stdout
            if " state UP " in outer and " state UP " in inner:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{veth} of {host} is not up 10 s after heal: {outer} {inner}")

    def partition(self, groups: Sequence[Sequence[Host]]) -> None:
        """Drops every packet between hosts of different groups (both ways), replacing any
        earlier partition. A host in no group, and the root namespace, still reach all."""
        self.heal_partition()
        group_of = {host.index: g for g, group in enumerate(groups) for host in group}
        for host in self.hosts:
            if host.index not in group_of:
                continue
            for other in self.hosts:
                if group_of.get(other.index, group_of[host.index]) != group_of[host.index]:
                    # Dropped on arrival, so the sender sees silence, as over a cut cable.
                    self._iptables(host, "-A", _PARTITION_CHAIN, "-s", other.address, "-j", "DROP")

    def drop(self, source: Host, target: Host) -> None:
        """Drops every packet `source` sends to `target`, one way only: `target`'s packets
        still reach `source` (asymmetric loss; both ways, and a bridge or any other shape
        of cut links). Adds to the partition in force; `partition` replaces it."""
        self._iptables(target, "-A", _PARTITION_CHAIN, "-s", source.address, "-j", "DROP")

    def heal_partition(self) -> None:
        """Undoes `partition` and `drop`."""
        for host in self.hosts:
            if host.fault_chains:
                self._iptables(host, "-F", _PARTITION_CHAIN)

    def delay(self, host: Host, ms: float, loss_pct: float = 0.0) -> None:
        """Holds every packet `host` sends for `ms` and drops `loss_pct` percent of them,
        replacing any earlier delay of `host`."""
        self.clear_delay(host)
        netem = host.popen(
            [sys.executable, str(_NETEM), "--delay-ms", str(ms), "--loss-pct", str(loss_pct)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._delays[host.index] = netem
        assert netem.stdout is not None
        line = netem.stdout.readline().strip()
        if line != "ready":
            _kill_group(netem)
            raise RuntimeError(f"netem on {host} did not start: {line} {netem.stdout.read()}")
        # --queue-bypass: should netem die, packets pass rather than vanish.
        queue = ["-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"]
        self._iptables(host, "-A", _DELAY_CHAIN, "-o", INNER_INTERFACE, *queue)

    def clear_delay(self, host: Host) -> None:
        """Undoes `delay(host, ...)`."""
        if host.fault_chains:
            self._iptables(host, "-F", _DELAY_CHAIN)
        netem = self._delays.pop(host.index, None)
        if netem is not None:
            _kill_group(netem)
            host.processes.remove(netem)

    def pause(self, proc: subprocess.Popen[Any]) -> None:
        """Freezes `proc` and its process group (SIGSTOP), as a long GC pause would."""
        os.killpg(proc.pid, signal.SIGSTOP)
        self._paused.append(proc)

    def resume(self, proc: subprocess.Popen[Any]) -> None:
        """Undoes `pause(proc)`."""
        os.killpg(proc.pid, signal.SIGCONT)
        self._paused.remove(proc)

    def heal_all(self) -> None:
        """Undoes every fault: isolation, partition, delays and pauses."""
        for index in list(self._isolated):
            self.heal(self.hosts[index])
        self.heal_partition()
        for index in list(self._delays):
            self.clear_delay(self.hosts[index])
        for proc in list(self._paused):
            self.resume(proc)

    def describe(self) -> str:
        """The hosts and their faults, for a failing test's report."""
        return (
            f"hosts {self.hosts} on {self.bridge} ({self.gateway}); isolated "
            f"{sorted(self._isolated)}; delayed {sorted(self._delays)}; paused "
            f"{[p.pid for p in self._paused]}"
        )

    # ------------------------------------------------------------------ internals

    def _veth(self, host: Host) -> str:
        if host.veth is None:
            raise ValueError("the root namespace has no veth of its own")
        return host.veth

    def _iptables(self, host: Host, *args: str) -> None:
        """Runs iptables inside `host`, first hooking this module's chains into INPUT
        (partition) and OUTPUT (delay); the chains die with the namespace."""
        if not host.fault_chains:
            for chain, hook in ((_PARTITION_CHAIN, "INPUT"), (_DELAY_CHAIN, "OUTPUT")):
                self._iptables_raw(host, "-N", chain)
                self._iptables_raw(host, "-A", hook, "-j", chain)
            host.fault_chains = True
        self._iptables_raw(host, *args)

    def _iptables_raw(self, host: Host, *args: str) -> None:
        result = host.run([iptables(), "-w", *args], check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"iptables {' '.join(args)} in {host}: {result.stderr.strip()}")
