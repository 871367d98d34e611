"""The coordinator as a deterministic state machine (docs/protocol.md, "Leader choice").

Inputs: `step(message)` for node responses and health reports, `tick()`.
Output: `ready()`: metadata to persist (durably, before anything is sent), then messages.

Per shard it fences the ensemble with NewTerm, acts on a majority of responses after a
short grace for the rest, elects the top-ranked eligible responder with BecomeLeader,
adds late responders with AddFollower, and keeps every ensemble member in the current
term from the health reports: a member in an older term gets NewTerm again, a fenced
member of the current term is added to the leader. A failed leader triggers a new
election; a failed follower changes nothing while a quorum remains.

A member whose replica reports another incarnation than the shard counts on lost its
data: it is fenced and caught up like any member, but neither counts toward an
election's majority nor leads until a leader reports it caught up in a term it was
fenced into as that incarnation (docs/protocol.md, "Replicas that lose their disk").
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from quorumstore.protocol.election import Candidate, choose_leader
from quorumstore.protocol.messages import (
    AddFollower,
    BecomeLeader,
    BecomeLeaderResponse,
    Message,
    NewTerm,
    NewTermResponse,
    NodeStatus,
    NodeUnreachable,
    Outbound,
    ShardKey,
    ShardStatus,
    StatusRequest,
)
from quorumstore.protocol.quorum import majority
from quorumstore.protocol.types import NO_OFFSET, NO_TERM, Role

HASH_SPACE = 1 << 32
#: `_last_seen` of a node whose health stream broke: failed at once, not after the timeout.
_UNREACHABLE = -(10**9)

log = logging.getLogger(__name__)


class ShardState(enum.Enum):
    ELECTION = "election"
    ONLINE = "online"
    OFFLINE = "offline"


@dataclass(frozen=True, slots=True)
class ShardMetadata:
    """What the coordinator persists per shard."""

    shard: ShardKey
    ensemble: tuple[str, ...]
    hash_range: tuple[int, int]
    term: int = NO_TERM
    leader: str | None = None
    state: ShardState = ShardState.ELECTION
    eligible: frozenset[str] = frozenset()
    known_commit_offset: int = -1
    #: Member -> the incarnation of its replica whose data the shard counts on; a member
    #: missing here is recorded with the first incarnation it reports.
    incarnations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    version: int
    shards: dict[ShardKey, ShardMetadata]


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    replication_factor: int = 3
    #: A follower more than this many entries behind the commit offset leaves the live set.
    max_lag: int = 10_000
    #: Ticks to wait for the rest of the ensemble once a majority answered NewTerm (for
    #: the members still alive; failed ones are not waited for).
    election_grace_ticks: int = 1
    #: Ticks before an unanswered NewTerm / AddFollower is sent again.
    retry_ticks: int = 3
    #: Ticks without a BecomeLeaderResponse before the election restarts in a new term.
    become_leader_timeout_ticks: int = 10
    #: Ticks without a health report before a node is considered failed.
    node_failure_ticks: int = 5
    #: Ticks between saves of a shard's advancing commit offset. A restarted coordinator
    #: refuses to elect a replica whose log ends before the offset it knows (one that lost
    #: its disk, say), so the saved offset must not lag far behind.
    commit_save_ticks: int = 50


def initial_metadata(
    nodes: list[str], namespaces: dict[str, int], replication_factor: int
) -> ClusterMetadata:
    """Shards of each namespace tile the 32-bit hash space; ensembles rotate over nodes."""
    if replication_factor > len(nodes):
        raise ValueError(
            f"replication factor {replication_factor} needs at least that many nodes, got {len(nodes)}"
        )
    shards: dict[ShardKey, ShardMetadata] = {}
    placement = 0
    for namespace, count in sorted(namespaces.items()):
        if count < 1:
            raise ValueError(f"namespace {namespace!r} needs at least one shard, got {count}")
        for i in range(count):
            low = i * HASH_SPACE // count
            high = (i + 1) * HASH_SPACE // count - 1
            ensemble = tuple(nodes[(placement + k) % len(nodes)] for k in range(replication_factor))
            placement += 1
            shards[(namespace, i)] = ShardMetadata(
                (namespace, i), ensemble, (low, high), eligible=frozenset(ensemble)
            )
    return ClusterMetadata(0, shards)


def placed_nodes(metadata: ClusterMetadata) -> set[str]:
    """Every node some shard's ensemble names."""
    return {node for shard in metadata.shards.values() for node in shard.ensemble}


def replace_node(metadata: ClusterMetadata, old: str, new: str) -> ClusterMetadata:
    """`metadata` with node `old` called `new`: the same replicas, reached at another address."""

    def rename(node: str) -> str:
        return new if node == old else node

    shards = {
        key: replace(
            shard,
            ensemble=tuple(map(rename, shard.ensemble)),
            leader=None if shard.leader is None else rename(shard.leader),
            eligible=frozenset(map(rename, shard.eligible)),
            incarnations={rename(node): inc for node, inc in shard.incarnations.items()},
        )
        for key, shard in metadata.shards.items()
    }
    return ClusterMetadata(metadata.version + 1, shards)


@dataclass(slots=True)
class _Election:
    term: int
    responses: dict[str, NewTermResponse] = field(default_factory=dict)
    ticks_since_majority: int = -1
    candidate: str | None = None
    ticks_since_become_leader: int = 0
    #: The tick the candidate's BecomeLeaderResponse made the shard online; -1 before.
    online_at: int = -1


@dataclass(slots=True)
class _CatchingUp:
    """A member whose replica reports another incarnation than the shard counts on: the
    data the shard counted on is lost, and this replica counts once it holds every entry
    that may have been committed with the lost replica's acks."""

    incarnation: str
    #: A leader's report of this member's acks counts only in a term above this one: up
    #: to it, the leader's view of the member may hold acks of the lost replica.
    after_term: int
    #: (term, offset): in such a term, the offset the member must ack, the leader's head
    #: in its first report of the term. That is at or past the term's first entry, so
    #: past every entry committed with the lost replica's acks (all are in earlier
    #: terms). Taken again in each term: an earlier leader's head may have been cut.
    catch_up: tuple[int, int] | None = None


@dataclass(slots=True)
class CoordinatorReady:
    """Persist `metadata` (if set) durably, then send `messages`."""

    metadata: ClusterMetadata | None = None
    messages: list[Outbound] = field(default_factory=list)
    assignments_changed: bool = False


class Coordinator:
    def __init__(
        self,
        nodes: list[str],
        metadata: ClusterMetadata,
        config: CoordinatorConfig = CoordinatorConfig(),
    ):
        self.nodes = list(nodes)
        self.config = config
        self._meta = dict(metadata.shards)
        self._version = metadata.version
        self._now = 0
        self._last_seen = {node: 0 for node in nodes}
        self._reports: dict[str, dict[ShardKey, ShardStatus]] = {}
        self._elections: dict[ShardKey, _Election] = {}
        self._retry_at: dict[tuple[ShardKey, str], int] = {}
        #: Per shard, the tick from which an advanced commit offset is saved again.
        self._commit_save_due: dict[ShardKey, int] = {}
        #: Shards whose current leader this coordinator has seen leading (elected it, or
        #: had a report of it leading in its term): not so for every shard after a restart.
        self._seen_leading: set[ShardKey] = set()
        #: Members answering with a new incarnation, until they count again.
        self._catching_up: dict[tuple[ShardKey, str], _CatchingUp] = {}
        #: The highest term of a message taken from each member's replica, whichever its
        #: incarnation: the last term a replica that lost its data may have been in.
        self._member_terms: dict[tuple[ShardKey, str], int] = {}
        self._dirty = False
        self._assignments_changed = False
        self._out: list[Outbound] = []

    # ------------------------------------------------------------------ views

    @property
    def metadata(self) -> ClusterMetadata:
        return ClusterMetadata(self._version, dict(self._meta))

    def shard(self, key: ShardKey) -> ShardMetadata:
        return self._meta[key]

    def node_alive(self, node: str) -> bool:
        return self._now - self._last_seen.get(node, _UNREACHABLE) <= self.config.node_failure_ticks

    def _failure(self, node: str) -> str:
        if self._last_seen.get(node, _UNREACHABLE) == _UNREACHABLE:
            return f"{node} is unreachable (its health stream broke)"
        return f"{node} sent no health report in {self.config.node_failure_ticks} ticks"

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        self._now += 1
        for node in self.nodes:
            self._out.append(Outbound(node, StatusRequest()))
        for key in sorted(self._meta):
            self._tick_shard(key)

    def step(self, msg: Message) -> None:
        if isinstance(msg, NewTermResponse):
            self._on_new_term_response(msg)
        elif isinstance(msg, BecomeLeaderResponse):
            self._on_become_leader_response(msg)
        elif isinstance(msg, NodeStatus):
            self._on_node_status(msg)
        elif isinstance(msg, NodeUnreachable) and msg.node in self._last_seen:
            self._last_seen[msg.node] = _UNREACHABLE

    def ready(self) -> CoordinatorReady:
        ready = CoordinatorReady(
            self.metadata if self._dirty else None, self._out, self._assignments_changed
        )
        self._out = []
        self._dirty = False
        self._assignments_changed = False
        return ready

    # ------------------------------------------------------------------ elections

    def _update(self, key: ShardKey, **changes: Any) -> ShardMetadata:
        meta = replace(self._meta[key], **changes)
        self._meta[key] = meta
        self._version += 1
        self._dirty = True
        return meta

    def start_election(
        self, key: ShardKey, cause: str, *, leader_lost: bool = False, above: int = NO_TERM
    ) -> None:
        """Fence the ensemble in a new term. `cause` is logged, as a warning when an online
        leader is displaced: that pauses the shard's writes. `leader_lost`: the leader
        itself says it no longer leads, so unless this coordinator saw it lead (it
        restarted since), nothing serving is displaced and the cause is logged as info:
        that is every shard after a whole cluster restarts. The new term is above both the
        shard's and `above` (a term some member is already in)."""
        meta = self._meta[key]
        term = max(meta.term, above) + 1
        displaced = meta.state is ShardState.ONLINE and (
            key in self._seen_leading or not leader_lost
        )
        level = logging.WARNING if displaced else logging.INFO
        log.log(level, "shard %s/%d: election for term %d: %s", key[0], key[1], term, cause)
        self._seen_leading.discard(key)
        self._update(key, term=term, leader=None, state=ShardState.ELECTION)
        self._assignments_changed = True
        self._elections[key] = _Election(term)
        for node in meta.ensemble:
            self._send_new_term(key, node, term)

    def _send_new_term(self, key: ShardKey, node: str, term: int) -> None:
        self._retry_at[(key, node)] = self._now + self.config.retry_ticks
        self._out.append(Outbound(node, NewTerm(key, term)))

    def _tick_shard(self, key: ShardKey) -> None:
        meta = self._meta[key]
        election = self._elections.get(key)
        if meta.state is ShardState.ONLINE:
            if meta.leader is not None and not self.node_alive(meta.leader):
                self.start_election(key, f"leader {self._failure(meta.leader)}")
            elif (node := self._waiting_for_a_term(key)) is not None:
                self.start_election(
                    key,
                    f"{node} lost its data; the leader's count of its acks may hold acks of the "
                    "lost replica until a new term",
                )
            return
        if election is None or election.term != meta.term:
            self.start_election(
                key, f"no election under way for term {meta.term} (state {meta.state.value})"
            )
            return
        intact = self._counted(key, meta.ensemble)
        if meta.state is ShardState.ELECTION and len(intact) < majority(len(meta.ensemble)):
            self._update(key, state=ShardState.OFFLINE)  # no majority keeps its data
        for node in meta.ensemble:
            if node not in election.responses and self._now >= self._retry_at.get((key, node), 0):
                self._send_new_term(key, node, election.term)
        if election.candidate is not None:
            election.ticks_since_become_leader += 1
            if election.ticks_since_become_leader > self.config.become_leader_timeout_ticks:
                self.start_election(
                    key,
                    f"{election.candidate} did not confirm BecomeLeader in {self.config.become_leader_timeout_ticks} ticks",
                )
            return
        if election.ticks_since_majority >= 0:
            election.ticks_since_majority += 1
            if election.ticks_since_majority > self.config.election_grace_ticks:
                self._try_elect(key, election)

    def _on_new_term_response(self, msg: NewTermResponse) -> None:
        meta = self._meta.get(msg.shard)
        if meta is None or msg.term != meta.term or msg.node not in meta.ensemble:
            return
        self._note_incarnation(msg.shard, msg.node, msg.incarnation, msg.term)
        meta = self._meta[msg.shard]
        if msg.term != meta.term:
            return  # the member's lost data made it restart the election
        election = self._elections.get(msg.shard)
        if meta.state is ShardState.ONLINE and meta.leader is not None:
            # A late responder: the leader adopts it with AddFollower.
            self._add_follower(msg.shard, meta, msg.node, msg)
            return
        if election is None or election.term != msg.term:
            return
        election.responses[msg.node] = msg
        if election.candidate is not None:
            return
        counted = self._counted(msg.shard, election.responses)
        if len(counted) == len(self._counted(msg.shard, meta.ensemble)):
            self._try_elect(msg.shard, election)  # nobody left whose answer counts
        elif len(counted) >= majority(len(meta.ensemble)):
            if not self._awaited(msg.shard, election):
                self._try_elect(msg.shard, election)  # the rest failed: no grace for them
            elif election.ticks_since_majority < 0:
                election.ticks_since_majority = 0

    def _awaited(self, key: ShardKey, election: _Election) -> list[str]:
        """The members whose NewTerm answer is still worth waiting for once a majority
        answered: those that count and are alive. A failed member's answer would only come
        after it recovers, and waiting the grace for it delays every failover."""
        return [
            node
            for node in self._counted(key, self._meta[key].ensemble)
            if node not in election.responses and self.node_alive(node)
        ]

    def _try_elect(self, key: ShardKey, election: _Election) -> None:
        meta = self._meta[key]
        candidates = [
            Candidate(node, election.responses[node].head)
            for node in self._counted(key, election.responses)
        ]
        choice = choose_leader(
            candidates,
            ensemble_size=len(meta.ensemble),
            eligible=meta.eligible,
            known_commit_offset=meta.known_commit_offset,
            leader_load=self._leader_load(),
            catching_up=len(meta.ensemble) - len(self._counted(key, meta.ensemble)),
        )
        if choice.leader is None:
            if meta.state is not ShardState.OFFLINE:
                self._update(key, state=ShardState.OFFLINE)
            return
        election.candidate = choice.leader
        followers = {
            node: r.head for node, r in election.responses.items() if node != choice.leader
        }
        self._out.append(
            Outbound(choice.leader, BecomeLeader(key, election.term, len(meta.ensemble), followers))
        )

    def _leader_load(self) -> dict[str, int]:
        """Shards each node leads or is about to lead."""
        load: dict[str, int] = {}
        for key, meta in self._meta.items():
            election = self._elections.get(key)
            leader = (
                meta.leader if meta.state is ShardState.ONLINE else election and election.candidate
            )
            if leader:
                load[leader] = load.get(leader, 0) + 1
        return load

    def _on_become_leader_response(self, msg: BecomeLeaderResponse) -> None:
        meta = self._meta.get(msg.shard)
        election = self._elections.get(msg.shard)
        if (
            meta is None
            or election is None
            or msg.term != meta.term
            or msg.node != election.candidate
        ):
            return
        if meta.state is ShardState.ONLINE:
            return
        meta = self._update(msg.shard, leader=msg.node, state=ShardState.ONLINE)
        log.info("shard %s/%d: %s leads term %d", msg.shard[0], msg.shard[1], msg.node, msg.term)
        self._seen_leading.add(msg.shard)
        election.online_at = self._now
        self._assignments_changed = True
        for node, response in election.responses.items():
            if (
                node != msg.node
                and response.term == meta.term
                and node not in self._follower_map_of(election)
            ):
                self._add_follower(msg.shard, meta, node, response)

    @staticmethod
    def _follower_map_of(election: _Election) -> set[str]:
        return {n for n in election.responses if n != election.candidate}

    def _add_follower(
        self, key: ShardKey, meta: ShardMetadata, node: str, response: NewTermResponse | ShardStatus
    ) -> None:
        assert meta.leader is not None
        self._retry_at[(key, node)] = self._now + self.config.retry_ticks
        self._out.append(Outbound(meta.leader, AddFollower(key, meta.term, node, response.head)))

    # ------------------------------------------------------------------ health

    def _on_node_status(self, msg: NodeStatus) -> None:
        if msg.node not in self._last_seen:
            return
        self._last_seen[msg.node] = self._now
        reported = {s.shard: s for s in msg.shards}
        self._reports[msg.node] = reported
        for key, meta in self._meta.items():
            if msg.node not in meta.ensemble:
                continue
            status = reported.get(key)
            if status is not None:
                self._note_incarnation(key, msg.node, status.incarnation, status.term)
                meta = self._meta[key]
            if status is not None and status.term > meta.term:
                # A term this coordinator never issued (its metadata is older than the
                # cluster, or a member was sent one by hand): only a term above it moves
                # that member again, so elect in one.
                self.start_election(
                    key,
                    f"{msg.node} is in term {status.term}, beyond the shard's term {meta.term}",
                    above=status.term,
                )
                continue
            if meta.state is not ShardState.ONLINE or meta.leader is None:
                continue
            if msg.node == meta.leader:
                self._on_leader_status(key, meta, status)
            else:
                self._on_member_status(key, meta, msg.node, status)

    def _on_leader_status(
        self, key: ShardKey, meta: ShardMetadata, status: ShardStatus | None
    ) -> None:
        if self._made_before_taking_office(key, status, meta.term):
            return
        if status is None or status.role is not Role.LEADER or status.term != meta.term:
            seen = "no replica" if status is None else f"{status.role.name} in term {status.term}"
            self.start_election(key, f"leader {meta.leader} reports {seen}", leader_lost=True)
            return
        self._seen_leading.add(key)
        self._count_caught_up(key, status)
        meta = self._meta[key]
        in_sync = set(
            self._counted(
                key,
                (
                    f.name
                    for f in status.followers
                    if status.commit_offset - f.acked_offset <= self.config.max_lag
                ),
            )
        )
        eligible = frozenset(in_sync | {meta.leader})
        commit = max(meta.known_commit_offset, status.commit_offset)
        if eligible != meta.eligible:
            self._update(key, eligible=eligible, known_commit_offset=commit)
        elif commit > meta.known_commit_offset and self._now >= self._commit_save_due.get(key, 0):
            self._update(key, known_commit_offset=commit)
            self._commit_save_due[key] = self._now + self.config.commit_save_ticks
        else:
            # Kept in memory until the next save, at most commit_save_ticks away.
            self._meta[key] = replace(meta, known_commit_offset=commit)

    def _made_before_taking_office(
        self, key: ShardKey, status: ShardStatus | None, term: int
    ) -> bool:
        """Whether a new leader's report was made before it handled BecomeLeader.

        Health reports and BecomeLeader answers travel on different gRPC calls and can be
        read out of order. The answer is sent once the leader's no-op entry of `term` is
        durable, so a Fenced report of `term` whose head is older was made before it. A
        leader that restarts reports Fenced with that entry (and is replaced); should it
        have lost the entry (WAL without fsync, machine crash), the grace ends after
        `node_failure_ticks`.
        """
        election = self._elections.get(key)
        return (
            election is not None
            and self._now - election.online_at <= self.config.node_failure_ticks
            and status is not None
            and status.role is Role.FENCED
            and status.term == term
            and status.head.term < term
        )

    def _on_member_status(
        self, key: ShardKey, meta: ShardMetadata, node: str, status: ShardStatus | None
    ) -> None:
        if self._now < self._retry_at.get((key, node), 0):
            return
        term = status.term if status is not None else NO_TERM
        if term < meta.term:
            self._send_new_term(key, node, meta.term)
        elif status is not None and term == meta.term and status.role is Role.FENCED:
            self._add_follower(key, meta, node, status)

    # ------------------------------------------------------------------ incarnations

    def _counted(self, key: ShardKey, nodes: Iterable[str]) -> list[str]:
        """`nodes` without the members that lost their data and have not caught up."""
        return [node for node in nodes if (key, node) not in self._catching_up]

    def _note_incarnation(self, key: ShardKey, node: str, incarnation: str, term: int) -> None:
        """Takes the incarnation a member's replica reported in a message of `term`.

        A member with none recorded is recorded with it; the recorded one counts (and
        ends any catching up: the member's old data is back); another one means the data
        the shard counted on is lost. A replica that reports none ("", a node older than
        incarnations) counts as before.
        """
        member = (key, node)
        meta = self._meta[key]
        recorded = meta.incarnations.get(node)
        if not incarnation:
            pass  # nothing to tell it by: it counts, as every replica did before incarnations
        elif recorded is None:
            self._update(key, incarnations={**meta.incarnations, node: incarnation})
        elif incarnation == recorded:
            if self._catching_up.pop(member, None) is not None:
                log.warning(
                    "shard %s/%d: %s reports incarnation %s again: its data is back",
                    key[0],
                    key[1],
                    node,
                    incarnation,
                )
        elif (catching := self._catching_up.get(member)) is None or (
            catching.incarnation != incarnation
        ):
            self._on_new_incarnation(key, node, incarnation, recorded)
        self._member_terms[member] = max(term, self._member_terms.get(member, NO_TERM))

    def _on_new_incarnation(
        self, key: ShardKey, node: str, incarnation: str, recorded: str
    ) -> None:
        """`node` lost the data the shard counted on: it stops counting toward elections
        and leaves the live replica set until it has caught up (`_count_caught_up`)."""
        meta = self._meta[key]
        # Unknown (this coordinator has taken nothing from the member since it started):
        # the lost replica may have been in the shard's current term.
        after_term = self._member_terms.setdefault((key, node), meta.term)
        self._catching_up[(key, node)] = _CatchingUp(incarnation, after_term)
        if node in meta.eligible:
            self._update(key, eligible=meta.eligible - {node})
        lost = [n for n in meta.ensemble if (key, n) in self._catching_up]
        if len(meta.ensemble) - len(lost) < majority(len(meta.ensemble)):
            log.error(
                "shard %s/%d: %s lost their data (new incarnations): fewer than a majority of "
                "its %d replicas hold the data it counts on, and a leader elected from them "
                "could lack committed entries, so it elects none. A lost disk brought back "
                "counts again",
                key[0],
                key[1],
                ", ".join(lost),
                len(meta.ensemble),
            )
        else:
            log.warning(
                "shard %s/%d: %s lost its data (incarnation %s, not %s): it counts toward "
                "elections again once a leader has caught it up",
                key[0],
                key[1],
                node,
                incarnation,
                recorded,
            )
        election = self._elections.get(key)
        if meta.state is ShardState.ONLINE:
            if meta.leader == node:
                self.start_election(key, f"leader {node} lost its data")
        elif election is not None and election.term == meta.term:
            if election.candidate == node:
                self.start_election(key, f"candidate {node} lost its data")
            else:
                election.responses.pop(node, None)  # an answer about the lost data

    def _count_caught_up(self, key: ShardKey, status: ShardStatus) -> None:
        """Records the incarnation of each catching-up member that the leader's report
        shows caught up: it acked, in a term above any its lost replica was in, at least
        the leader's head in its first report of that term."""
        acked = {f.name: f.acked_offset for f in status.followers}
        for node in self._meta[key].ensemble:
            catching = self._catching_up.get((key, node))
            if catching is None or status.term <= catching.after_term:
                continue
            if catching.catch_up is None or catching.catch_up[0] != status.term:
                catching.catch_up = (status.term, status.head.offset)
            if acked.get(node, NO_OFFSET) < catching.catch_up[1]:
                continue
            del self._catching_up[(key, node)]
            meta = self._meta[key]
            self._update(key, incarnations={**meta.incarnations, node: catching.incarnation})
            log.info(
                "shard %s/%d: %s caught up to offset %d: its incarnation %s counts again",
                key[0],
                key[1],
                node,
                catching.catch_up[1],
                catching.incarnation,
            )

    def _waiting_for_a_term(self, key: ShardKey) -> str | None:
        """A catching-up member whose acks the current term cannot tell from its lost
        replica's, if a counted majority of the ensemble is alive to elect a new term
        (otherwise the shard keeps its leader and the member waits)."""
        meta = self._meta[key]
        waiting = [
            node
            for node in meta.ensemble
            if (catching := self._catching_up.get((key, node))) is not None
            and catching.after_term >= meta.term
        ]
        alive = [node for node in self._counted(key, meta.ensemble) if self.node_alive(node)]
        if waiting and len(alive) >= majority(len(meta.ensemble)):
            return waiting[0]
        return None
