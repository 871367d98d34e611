"""Deterministic simulation of whole quorumstore clusters (FoundationDB/VOPR style).

One seed drives everything: which message is delivered next (reordering), lost or
duplicated, when nodes tick, fsync, flush their KV, trim their WAL, crash (losing what
was not synced) and restart, when hosts are lost (a node restarts with an empty disk,
one in four seeds), when the coordinator crashes and restarts, partitions, and client
writes. The nodes run the real engine (`ShardReplica`, `Coordinator`) and the
real KV state machine over an in-memory KV with crash semantics. The invariants of
docs/protocol.md are checked after every step; a failure names the seed and the command that
replays it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from quorumstore.protocol.coordinator import (
    ClusterMetadata,
    Coordinator,
    CoordinatorConfig,
    ShardState,
    initial_metadata,
)
from quorumstore.protocol.memory_log import MemoryLog
from quorumstore.protocol.messages import (
    COORDINATOR,
    Message,
    NewTerm,
    NodeStatus,
    Outbound,
    ShardKey,
    SnapshotReceived,
    StatusRequest,
)
from quorumstore.protocol.quorum import majority
from quorumstore.protocol.replica import ReplicaConfig, ShardReplica
from quorumstore.protocol.types import LogEntry, LogPosition, Role
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.snapshot import install_snapshot, iter_snapshot_chunks
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.write_batch import WriteBatchBuilder

NOOP = WriteBatchBuilder().build(0)


class InvariantViolation(AssertionError):
    pass


@dataclass(frozen=True)
class SimConfig:
    seed: int
    replicas: int = 3
    nodes: int | None = None
    shards: int = 1
    steps: int = 400
    heal_rounds: int = 200
    keys: int = 12

    def replay_command(self) -> str:
        return (
            f"python tests/simulation/replay.py --seed {self.seed} --replicas {self.replicas} "
            f"--steps {self.steps}"
        )


@dataclass
class SnapshotMessage:
    """A leader's KV snapshot in flight (the real system streams it over gRPC)."""

    shard: ShardKey
    term: int
    leader: str
    position: LogPosition
    chunks: list[bytes]


# ------------------------------------------------------------------------------- nodes


class SimNode:
    def __init__(self, name: str, sim: Simulation):
        self.name = name
        self.sim = sim
        self.alive = True
        self.logs: dict[ShardKey, MemoryLog] = {}
        self.kvs: dict[ShardKey, MemoryKv] = {}
        self.durable_terms: dict[ShardKey, int] = {}
        #: Each replica's incarnation, made with it and kept on its disk.
        self.incarnations: dict[ShardKey, str] = {}
        self.terms: dict[ShardKey, int] = {}
        self.replicas: dict[ShardKey, ShardReplica] = {}
        self.machines: dict[ShardKey, ShardStateMachine] = {}
        self.after_sync: list[Outbound] = []
        self.staged: dict[ShardKey, SnapshotMessage] = {}
        #: (write id, term it was proposed in) of each write this node leads, by offset.
        self.pending_writes: dict[tuple[ShardKey, int], tuple[int, int]] = {}

    def _replica(self, shard: ShardKey, create: bool) -> ShardReplica | None:
        replica = self.replicas.get(shard)
        if replica is None and create:
            self.logs[shard] = MemoryLog()
            self.kvs[shard] = MemoryKv()
            self.machines[shard] = ShardStateMachine(self.kvs[shard])
            self.incarnations[shard] = self.sim.new_incarnation(self.name)
            replica = self._open(shard)
        return replica

    def _open(self, shard: ShardKey) -> ShardReplica:
        machine = self.machines[shard]
        log = self.logs[shard]
        applied = machine.applied_position
        if applied.offset > log.head.offset:
            log.reset(applied)  # the KV is ahead of the synced log: it only holds committed entries
        elif (
            applied.offset >= log.base.offset
            and applied.offset >= 0
            and log.position_at(applied.offset).checksum != applied.checksum
        ):
            raise InvariantViolation(f"{self.name} {shard}: applied {applied} is not in its log")
        replica = ShardReplica(
            self.name,
            shard,
            log,
            term=self.durable_terms.get(shard, -1),
            commit_offset=applied.offset,
            noop_payload=NOOP,
            config=self.sim.replica_config,
            incarnation=self.incarnations[shard],
        )
        self.terms[shard] = replica.term
        self.replicas[shard] = replica
        return replica

    # --- inputs ------------------------------------------------------------------

    def deliver(self, src: str, msg: Message | SnapshotMessage | StatusRequest) -> None:
        if isinstance(msg, StatusRequest):
            status = tuple(r.status() for _, r in sorted(self.replicas.items()))
            self.sim.send(self.name, src, NodeStatus(self.name, status))
            return
        if isinstance(msg, SnapshotMessage):
            replica = self.replicas.get(msg.shard)
            if replica is None or not replica.can_install_snapshot(msg.term, msg.leader):
                return
            self.staged[msg.shard] = msg
            replica.step(SnapshotReceived(msg.shard, msg.term, msg.leader, msg.position))
            self.process(msg.shard)
            self.staged.pop(msg.shard, None)
            return
        replica = self._replica(msg.shard, create=isinstance(msg, NewTerm))
        if replica is None:
            return
        replica.step(msg)
        self.process(msg.shard)

    def tick(self) -> None:
        for shard, replica in sorted(self.replicas.items()):
            replica.tick()
            self.process(shard)

    def sync(self) -> None:
        for shard, log in sorted(self.logs.items()):
            log.sync()
        self.durable_terms.update(self.terms)
        pending, self.after_sync = self.after_sync, []
        for out in pending:
            self.sim.send(self.name, out.to, out.message)
        for shard, replica in sorted(self.replicas.items()):
            replica.persisted(self.logs[shard].head.offset)
            self.process(shard)

    def flush_and_trim(self, trim: bool) -> None:
        for shard, kv in sorted(self.kvs.items()):
            kv.flush()
            if trim and shard in self.replicas:
                applied = self.machines[shard].applied_position.offset
                upto = min(applied, self.replicas[shard].commit_offset)
                if upto > self.logs[shard].base.offset:
                    self.logs[shard].trim_before(upto + 1)

    def propose(self, shard: ShardKey, payload: bytes, write_id: int) -> bool:
        replica = self.replicas.get(shard)
        if replica is None or replica.role is not Role.LEADER:
            return False
        offset = replica.propose(payload)
        self.pending_writes[(shard, offset)] = (write_id, replica.term)
        self.process(shard)
        return True

    def crash(self) -> None:
        self.alive = False
        self.replicas.clear()
        self.after_sync.clear()
        self.staged.clear()
        self.pending_writes.clear()
        self.terms = dict(self.durable_terms)
        for log in self.logs.values():
            log.crash()
        for kv in self.kvs.values():
            kv.crash()

    def lose_disk(self) -> None:
        """The host is lost: the node restarts elsewhere (`restart`) with an empty disk."""
        self.crash()
        lost = (
            self.logs,
            self.kvs,
            self.machines,
            self.durable_terms,
            self.terms,
            self.incarnations,
        )
        for state in lost:
            state.clear()

    def restart(self) -> None:
        self.alive = True
        for shard in sorted(self.logs):
            self.machines[shard] = ShardStateMachine(self.kvs[shard])
            self._open(shard)

    # --- the driver loop ---------------------------------------------------------

    def refuse_writes_of_lost_terms(self, shard: ShardKey, replica: ShardReplica) -> None:
        """Once deposed, the writes this node proposed are refused as not-leader (as
        ShardHost does), never answered by another leader's entries at their offsets."""
        leading = replica.term if replica.role is Role.LEADER else None
        for key, (_, term) in list(self.pending_writes.items()):
            if key[0] == shard and term != leading:
                del self.pending_writes[key]

    def process(self, shard: ShardKey) -> None:
        replica = self.replicas[shard]
        log = self.logs[shard]
        self.refuse_writes_of_lost_terms(shard, replica)
        ready = replica.ready()
        if ready.term is not None:
            self.terms[shard] = ready.term
        if ready.truncate_after is not None:
            log.truncate_after(ready.truncate_after)
        if ready.install_snapshot is not None:
            staged = self.staged[shard]
            assert staged.position == ready.install_snapshot
            kv = MemoryKv()
            install_snapshot(kv, staged.chunks)
            self.kvs[shard] = kv
            self.machines[shard] = ShardStateMachine(kv)
            log.reset(ready.install_snapshot)
        if ready.entries:
            log.append(ready.entries)
        for out in ready.send_now:
            self.sim.send(self.name, out.to, out.message)
        self.after_sync.extend(ready.send_after_sync)
        self._apply(shard, ready.commit_offset)
        for request in ready.snapshots:
            machine = self.machines[shard]
            view = self.kvs[shard].snapshot()
            chunks = list(iter_snapshot_chunks(view, machine.applied_position))
            view.close()
            msg = SnapshotMessage(shard, request.term, self.name, machine.applied_position, chunks)
            self.sim.send(self.name, request.follower, msg)

    def _apply(self, shard: ShardKey, commit_offset: int) -> None:
        machine = self.machines[shard]
        log = self.logs[shard]
        upto = min(commit_offset, log.head.offset)
        applied = machine.applied_position.offset
        if upto <= applied:
            return
        entries = [log.entry(o) for o in range(applied + 1, upto + 1)]
        machine.apply(entries)
        for e in entries:
            pending = self.pending_writes.pop((shard, e.offset), None)
            if pending is not None:
                self.sim.acknowledge(shard, e, *pending)


# ------------------------------------------------------------------------- coordinator


class SimCoordinator:
    def __init__(
        self,
        sim: Simulation,
        nodes: list[str],
        metadata: ClusterMetadata,
        config: CoordinatorConfig,
    ):
        self.sim = sim
        self.nodes = nodes
        self.config = config
        self.durable = metadata
        self.alive = True
        self.coordinator = Coordinator(nodes, metadata, config)

    def deliver(self, msg: Message) -> None:
        self.coordinator.step(msg)
        self.process()

    def tick(self) -> None:
        self.coordinator.tick()
        self.process()

    def process(self) -> None:
        ready = self.coordinator.ready()
        if ready.metadata is not None:
            self.durable = ready.metadata
        for out in ready.messages:
            self.sim.send(COORDINATOR, out.to, out.message)

    def crash(self) -> None:
        self.alive = False

    def restart(self) -> None:
        self.alive = True
        self.coordinator = Coordinator(self.nodes, self.durable, self.config)


# -------------------------------------------------------------------------- simulation


@dataclass
class ShardHistory:
    """What the checker knows of one shard: the committed chain and reference digests."""

    committed: list[LogEntry] = field(default_factory=list)
    reference: ShardStateMachine = field(default_factory=lambda: ShardStateMachine(MemoryKv()))
    digests: list[int] = field(default_factory=list)
    leaders: dict[int, str] = field(default_factory=dict)
    acked: dict[int, int] = field(default_factory=dict)

    def digest_at(self, offset: int) -> int:
        while len(self.digests) <= offset:
            self.reference.apply([self.committed[len(self.digests)]])
            self.digests.append(self.reference.state_digest())
        return self.digests[offset]


class Simulation:
    def __init__(self, config: SimConfig, *, trace: Callable[[str], None] | None = None):
        self.config = config
        self.rng = random.Random(config.seed)
        self.trace = trace
        # Batch sizes vary by seed: small batches open interleavings that big ones hide.
        # One seed in four also has a byte window of about three write batches (~2 KB
        # each), so pushes stop on bytes as well; chosen without the rng, so that every
        # other seed replays the schedule it always had.
        self.replica_config = ReplicaConfig(
            max_append_entries=self.rng.choice((1, 2, 4, 8)),
            max_inflight_entries=32,
            max_inflight_bytes=6_000
            if config.seed % 4 == 2
            else ReplicaConfig().max_inflight_bytes,
            retransmit_ticks=3,
        )
        names = [f"n{i}" for i in range(config.nodes or config.replicas)]
        self.nodes = {name: SimNode(name, self) for name in names}
        coordinator_config = CoordinatorConfig(replication_factor=config.replicas, max_lag=20)
        metadata = initial_metadata(names, {"default": config.shards}, config.replicas)
        self.coordinator = SimCoordinator(self, names, metadata, coordinator_config)
        self.network: list[tuple[str, str, object]] = []
        self.partitioned: set[frozenset[str]] = set()
        self.history = {key: ShardHistory() for key in metadata.shards}
        self.step_no = 0
        self.writes = 0
        self.incarnations_made = 0
        # One seed in four loses hosts; chosen without the rng, like the byte window above.
        self.disk_losses = config.seed % 4 == 3
        self._leader_commits: dict[tuple[str, ShardKey], tuple[int, int]] = {}
        self._digest_checked: dict[tuple[str, ShardKey], tuple[int, LogPosition]] = {}
        self.faults = True

    # --- plumbing ----------------------------------------------------------------

    def log(self, text: str) -> None:
        if self.trace is not None:
            self.trace(f"[{self.step_no:5d}] {text}")

    def send(self, src: str, dst: str, msg: object) -> None:
        self.network.append((src, dst, msg))

    def new_incarnation(self, node: str) -> str:
        self.incarnations_made += 1
        return f"{node}#{self.incarnations_made}"

    def acknowledge(self, shard: ShardKey, entry: LogEntry, write_id: int, term: int) -> None:
        if entry.term != term:
            self.fail(
                f"write {write_id}, proposed in term {term} at {shard[1]}/{entry.offset}, was "
                f"acknowledged with another entry there (term {entry.term})"
            )
        history = self.history[shard]
        history.acked[entry.offset] = entry.checksum
        self.log(f"ack write {write_id} at {shard[1]}/{entry.offset}")
        if (
            entry.offset < len(history.committed)
            and history.committed[entry.offset].checksum != entry.checksum
        ):
            self.fail(
                f"acknowledged write at offset {entry.offset} differs from the committed entry"
            )

    def fail(self, message: str) -> None:
        raise InvariantViolation(
            f"seed {self.config.seed}, step {self.step_no}: {message}\n  replay: {self.config.replay_command()}"
        )

    def _reachable(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.partitioned

    def _deliver(self, index: int) -> None:
        src, dst, msg = self.network.pop(index)
        if not self._reachable(src, dst):
            return
        if dst == COORDINATOR:
            if self.coordinator.alive:
                self.coordinator.deliver(msg)  # type: ignore[arg-type]
            return
        node = self.nodes[dst]
        if node.alive:
            self.log(f"{src}->{dst} {type(msg).__name__}")
            node.deliver(src, msg)  # type: ignore[arg-type]

    # --- one step ----------------------------------------------------------------

    def step(self) -> None:
        self.step_no += 1
        rng = self.rng
        names = list(self.nodes)
        alive = [n for n in names if self.nodes[n].alive]
        dead = [n for n in names if not self.nodes[n].alive]
        actions: list[tuple[float, Callable[[], None]]] = []
        if self.network:
            # Delivery keeps pace with the backlog so message delay stays bounded.
            weight = 30 + 2 * len(self.network)
            actions.append(
                (
                    weight,
                    lambda: self._deliver(
                        0 if rng.random() < 0.6 else rng.randrange(len(self.network))
                    ),
                )
            )
            if self.faults:
                actions.append((1.5, lambda: self.network.pop(rng.randrange(len(self.network)))))
                actions.append(
                    (
                        1.5,
                        lambda: self.network.append(self.network[rng.randrange(len(self.network))]),
                    )
                )
        if alive:
            actions.append((10, lambda: self.nodes[rng.choice(alive)].tick()))
            actions.append((12, lambda: self.nodes[rng.choice(alive)].sync()))
            actions.append(
                (3, lambda: self.nodes[rng.choice(alive)].flush_and_trim(rng.random() < 0.3))
            )
            if self.faults:
                actions.append((10, self._client_write))
        if self.coordinator.alive:
            actions.append((5, self.coordinator.tick))
        if self.faults:
            if alive:
                actions.append((1.5, lambda: self._crash(rng.choice(alive))))
            if self.disk_losses:
                actions.append((1.5, self._lose_disks))
            if self.coordinator.alive:
                actions.append((0.4, self._crash_coordinator))
                actions.append((0.8, self._reelect))
            actions.append((0.8, self._partition))
        if dead:
            actions.append((2, lambda: self._restart(rng.choice(dead))))
        if not self.coordinator.alive:
            actions.append((2, self._restart_coordinator))
        if self.partitioned:
            actions.append((1, self._heal))
        total = sum(w for w, _ in actions)
        pick = rng.random() * total
        for weight, action in actions:
            pick -= weight
            if pick <= 0:
                action()
                break
        self.check()

    def _client_write(self) -> None:
        shard = self.rng.choice(sorted(self.history))
        leaders = [
            n
            for n in self.nodes.values()
            if n.alive and shard in n.replicas and n.replicas[shard].role is Role.LEADER
        ]
        if not leaders:
            return
        node = self.rng.choice(leaders)
        self.writes += 1
        builder = WriteBatchBuilder()
        for _ in range(self.rng.randint(1, 3)):
            key = f"k{self.rng.randrange(self.config.keys)}"
            if self.rng.random() < 0.15:
                builder.add_delete(key)
            else:
                builder.add_put(key, f"w{self.writes}".encode())
        if self.rng.random() < 0.05:
            builder.add_delete_range("k1", "k5")
        node.propose(shard, builder.build(self.step_no), self.writes)
        self.log(f"client write {self.writes} to {node.name}")

    def _crash(self, name: str) -> None:
        self.log(f"CRASH {name}")
        self.nodes[name].crash()

    def _lose_disks(self) -> None:
        """One host or two are lost, if every shard keeps a majority of replicas whose data
        the coordinator counts on: without one, committed entries may be lost, and the
        shard must stay offline (test_a_shard_that_lost_most_disks_elects_no_leader)."""
        lost = self.rng.sample(sorted(self.nodes), 1 if self.rng.random() < 0.7 else 2)
        if self.counted_majority_survives(lost):
            self.lose_disks(lost)

    def counted_majority_survives(self, lost: list[str]) -> bool:
        """Whether every shard keeps, beside `lost`, a majority of members whose replica is
        the incarnation the coordinator counts on."""
        for key, meta in self.coordinator.durable.shards.items():
            intact = [
                name
                for name in meta.ensemble
                if name not in lost
                and self.nodes[name].incarnations.get(key, "") == meta.incarnations.get(name)
            ]
            if len(intact) < majority(len(meta.ensemble)):
                return False
        return True

    def lose_disks(self, lost: list[str]) -> None:
        """The hosts of `lost` die; each node comes back (`_restart`) with an empty disk.
        What they sent or were sent is lost with their connections."""
        self.log(f"LOSE DISK {' '.join(lost)}")
        for name in lost:
            self.nodes[name].lose_disk()
        self.network = [
            (src, dst, msg) for src, dst, msg in self.network if src not in lost and dst not in lost
        ]

    def _restart(self, name: str) -> None:
        self.log(f"RESTART {name}")
        self.nodes[name].restart()

    def _crash_coordinator(self) -> None:
        self.log("CRASH coordinator")
        self.coordinator.crash()

    def _restart_coordinator(self) -> None:
        self.log("RESTART coordinator")
        self.coordinator.restart()

    def _reelect(self) -> None:
        """The coordinator re-elects a shard's leader (a false failure suspicion)."""
        shard = self.rng.choice(sorted(self.history))
        self.log(f"REELECT {shard}")
        self.coordinator.coordinator.start_election(shard, "simulated false failure suspicion")
        self.coordinator.process()

    def _partition(self) -> None:
        names = list(self.nodes) + [COORDINATOR]
        a, b = self.rng.sample(names, 2)
        self.log(f"PARTITION {a} | {b}")
        self.partitioned.add(frozenset((a, b)))

    def _heal(self) -> None:
        self.log("HEAL")
        self.partitioned.clear()

    # --- invariants --------------------------------------------------------------

    def check(self) -> None:
        for node in self.nodes.values():
            if not node.alive:
                continue
            for shard, replica in node.replicas.items():
                self._check_replica(node, shard, replica)

    def _check_replica(self, node: SimNode, shard: ShardKey, replica: ShardReplica) -> None:
        history = self.history[shard]
        log = node.logs[shard]
        committed = history.committed
        # Invariants 1 and 2: the committed prefix of every replica is one chain.
        upto = min(replica.commit_offset, log.head.offset)
        if upto >= 0:
            if upto < len(committed):
                if (
                    upto >= log.base.offset
                    and log.position_at(upto).checksum != committed[upto].checksum
                ):
                    self.fail(
                        f"{node.name}: committed entry at {upto} differs from the committed history"
                    )
            else:
                start = len(committed)
                if (
                    start - 1 >= log.base.offset
                    and start > 0
                    and log.position_at(start - 1).checksum != committed[start - 1].checksum
                ):
                    self.fail(f"{node.name}: committed prefix before {start} differs from history")
                if start > log.base.offset:
                    for offset in range(start, upto + 1):
                        committed.append(log.entry(offset))
                    for offset, checksum in history.acked.items():
                        if offset < len(committed) and committed[offset].checksum != checksum:
                            self.fail(
                                f"acknowledged write at {offset} was replaced in the committed history"
                            )
        # Replication and the commit rule: a leader moves its commit offset only onto its own term.
        if replica.role is Role.LEADER:
            seen = self._leader_commits.get((node.name, shard))
            if (
                seen is not None
                and seen[0] == replica.term
                and replica.commit_offset > seen[1]
                and log.position_at(replica.commit_offset).term != replica.term
            ):
                self.fail(
                    f"leader {node.name} of term {replica.term} committed offset "
                    f"{replica.commit_offset}, an entry of an earlier term, by counting replicas"
                )
            self._leader_commits[(node.name, shard)] = (replica.term, replica.commit_offset)
        # Invariant 3: one leader per term; invariant 4: it holds every committed entry.
        if replica.role is Role.LEADER:
            known = history.leaders.get(replica.term)
            if known is not None and known != node.name:
                self.fail(f"two leaders in term {replica.term} of {shard}: {known} and {node.name}")
            if known is None:
                history.leaders[replica.term] = node.name
                last = len(committed) - 1
                if last >= 0 and (
                    log.head.offset < last
                    or (
                        last >= log.base.offset
                        and log.position_at(last).checksum != committed[last].checksum
                    )
                ):
                    self.fail(
                        f"new leader {node.name} in term {replica.term} lacks committed entry {last}"
                    )
        # Invariant 5: a follower's matched prefix is the leader's log.
        if (
            replica.role is Role.FOLLOWER
            and replica.matched_offset >= 0
            and replica.leader in self.nodes
        ):
            leader = self.nodes[replica.leader]
            lrep = leader.replicas.get(shard) if leader.alive else None
            if lrep is not None and lrep.role is Role.LEADER and lrep.term == replica.term:
                m = replica.matched_offset
                llog = leader.logs[shard]
                if (
                    max(llog.base.offset, log.base.offset) <= m <= llog.head.offset
                    and llog.position_at(m).checksum != log.position_at(m).checksum
                ):
                    self.fail(
                        f"follower {node.name} matched {m} but differs from leader {leader.name}"
                    )
        # Invariant 6: the KV is the application of the committed prefix, once per offset.
        machine = node.machines[shard]
        applied = machine.applied_position
        if self._digest_checked.get((node.name, shard)) == (id(machine), applied):
            return
        self._digest_checked[(node.name, shard)] = (id(machine), applied)
        if applied.offset >= 0:
            if applied.offset >= len(committed):
                self.fail(
                    f"{node.name} applied offset {applied.offset} beyond the committed history"
                )
            if committed[applied.offset].checksum != applied.checksum:
                self.fail(
                    f"{node.name} applied an entry at {applied.offset} that is not the committed one"
                )
            if node.machines[shard].state_digest() != history.digest_at(applied.offset):
                self.fail(
                    f"{node.name} KV differs from a replay of the committed log up to {applied.offset}"
                )

    # --- running -----------------------------------------------------------------

    def run(self) -> SimResult:
        for _ in range(self.config.steps):
            self.step()
        self._heal_all()
        return SimResult(
            self.config.seed,
            self.step_no,
            self.writes,
            {k: len(h.committed) for k, h in self.history.items()},
        )

    def _heal_all(self) -> None:
        """Ends faults, restarts everything and checks that the cluster converges."""
        self.faults = False
        self.partitioned.clear()
        for node in self.nodes.values():
            if not node.alive:
                node.restart()
        if not self.coordinator.alive:
            self.coordinator.restart()
        final: dict[ShardKey, tuple[str, int, int]] = {}
        for _ in range(self.config.heal_rounds):
            self._heal_round()
            for shard in self.history:
                if not self._final_write_alive(shard, final.get(shard)):
                    proposed = self._try_final_write(shard)
                    if proposed is not None:
                        final[shard] = proposed
            if len(final) == len(self.history) and all(
                self._converged(s, o) for s, (_, _, o) in final.items()
            ):
                return
        self.fail(
            f"the cluster did not converge within {self.config.heal_rounds} rounds after healing:\n{self._describe()}"
        )

    def settle(self, rounds: int, *, writes: bool = False) -> None:
        """Fault-free rounds (`_heal_round`), each with a write to every shard's leader if
        `writes`."""
        for _ in range(rounds):
            self._heal_round()
            if writes:
                for shard in self.history:
                    self._try_final_write(shard)

    def _heal_round(self) -> None:
        """A fault-free round: deliver everything in flight in order, sync, tick everyone."""
        for _ in range(20_000):
            if not self.network:
                break
            self.step_no += 1
            self._deliver(0)
            self.check()
        for node in self.nodes.values():
            node.sync()
            node.tick()
        self.coordinator.tick()
        self.check()

    def _final_write_alive(self, shard: ShardKey, proposed: tuple[str, int, int] | None) -> bool:
        """Whether the final write may still commit (its leader still leads its term)."""
        if proposed is None:
            return False
        name, term, offset = proposed
        if offset in self.history[shard].acked:
            return True
        replica = self.nodes[name].replicas.get(shard)
        return replica is not None and replica.role is Role.LEADER and replica.term == term

    def _try_final_write(self, shard: ShardKey) -> tuple[str, int, int] | None:
        meta = self.coordinator.coordinator.shard(shard)
        if meta.state is not ShardState.ONLINE or meta.leader is None:
            return None
        node = self.nodes[meta.leader]
        replica = node.replicas.get(shard)
        if replica is None or replica.role is not Role.LEADER or replica.term != meta.term:
            return None
        self.writes += 1
        offset = replica.head.offset + 1
        node.propose(shard, WriteBatchBuilder().build(self.step_no), self.writes)
        return (node.name, replica.term, offset)

    def _converged(self, shard: ShardKey, offset: int) -> bool:
        if offset not in self.history[shard].acked:
            return False
        counted = self.coordinator.coordinator.shard(shard).incarnations
        for node in self.nodes.values():
            if shard not in node.replicas or node.machines[shard].applied_position.offset < offset:
                return False
            if counted.get(node.name) != node.incarnations[shard]:
                return False  # a replica that lost its disk counts again once caught up
        return True

    def _describe(self) -> str:
        parts = []
        for shard in self.history:
            meta = self.coordinator.coordinator.shard(shard)
            parts.append(f"{shard}: {meta.state.value} term {meta.term} leader {meta.leader}")
            for node in self.nodes.values():
                r = node.replicas.get(shard)
                if r is not None:
                    parts.append(
                        f"  {node.name}: {r.role.value} t{r.term} head {r.head.offset} commit {r.commit_offset} "
                        f"applied {node.machines[shard].applied_position.offset} "
                        f"incarnation {r.incarnation} (counted: {meta.incarnations.get(node.name)})"
                    )
        return "\n".join(parts)


@dataclass(frozen=True)
class SimResult:
    seed: int
    steps: int
    writes: int
    committed: dict[ShardKey, int]


def run_seed(config: SimConfig, trace: Callable[[str], None] | None = None) -> SimResult:
    return Simulation(config, trace=trace).run()
