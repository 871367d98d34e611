"""One shard replica on a storage node: the engine bound to its WAL, KV and network.

The host is the driver of `ShardReplica` (the etcd-raft `Ready` loop): after every
input it takes the `Ready`, applies the storage effects, sends messages, runs the
group commit (one fdatasync for everything appended since the last one: on a worker
thread while the event loop keeps appending, or a follower's on the loop itself, see
`syncs.py`), applies committed entries to the KV and resolves the writes waiting on
them. A follower applies on a later turn, between fsyncs, so that applying never delays
its Acks. Everything here runs on the node's event loop, except the fsyncs that
`syncs.py` hands to threads and the apply of bulk entries (`_APPLY_OFF_LOOP_BYTES`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Concatenate, ParamSpec, Protocol

from quorumstore.node.failures import ReplicaFailure
from quorumstore.node.syncs import SyncRunner
from quorumstore.node.wal_retention import WalRetention, WalTrimmer
from quorumstore.protocol.messages import (
    Message,
    Outbound,
    Ready,
    SendSnapshot,
    ShardKey,
    SnapshotReceived,
)
from quorumstore.protocol.replica import NotLeaderError, ReplicaConfig, ShardReplica
from quorumstore.protocol.types import LogEntry, LogPosition, Role
from quorumstore.storage.reads import ShardReader
from quorumstore.storage.replica_files import TERM_FILE, load_incarnation, save_term
from quorumstore.storage.results import EntryResult
from quorumstore.storage.rocks_kv import KvMemory, RocksKv
from quorumstore.storage.state_machine import ShardStateMachine
from quorumstore.storage.wal import Wal
from quorumstore.storage.wal_sync import SyncTicket
from quorumstore.storage.write_batch import WriteBatchBuilder

log = logging.getLogger(__name__)
_P = ParamSpec("_P")

_NOOP = WriteBatchBuilder().build(0)
#: Committed entries applied per turn of the event loop (see `_apply_committed`).
_APPLY_CHUNK_ENTRIES = 32
_APPLY_CHUNK_BYTES = 64 * 1024 * 1024
#: Committed entries of at least this many bytes in all are applied on a worker thread.
_APPLY_OFF_LOOP_BYTES = 1024 * 1024


def _stops_on_failure(
    method: Callable[Concatenate[ShardHost, _P], None],
) -> Callable[Concatenate[ShardHost, _P], None]:
    """Runs one input or callback of the Ready loop; an error escaping it stops the replica
    (see `ShardHost._fail_stop`) instead of reaching the event loop or the tick."""

    @functools.wraps(method)
    def guarded(self: ShardHost, *args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any error leaves memory and disk unreconciled
            self._fail_stop(error)

    return guarded


class Transport(Protocol):
    """How a shard host reaches other nodes and the coordinator."""

    def send(self, sender: ShardHost, out: Outbound) -> None: ...

    def send_snapshot(self, sender: ShardHost, request: SendSnapshot) -> None: ...

    def acks_in_transit(self, shard: ShardKey) -> bool:
        """Whether Acks of `shard` were sent but are not written to their stream yet; the
        transport calls the host's `acks_written` once they are."""
        ...

    def client_address(self, peer: str | None) -> str | None:
        """Where clients reach node `peer` (a member name); None while unknown."""
        ...


class ShardHost:
    def __init__(
        self,
        node: str,
        shard: ShardKey,
        directory: Path,
        transport: Transport,
        io_executor: Executor,
        *,
        apply_executor: Executor | None = None,
        syncs: SyncRunner | None = None,
        on_failure: Callable[[ReplicaFailure], None],
        wal_sync: bool = True,
        replica_config: ReplicaConfig = ReplicaConfig(),
        retention: WalRetention = WalRetention(),
        kv_memory: KvMemory | None = None,
        archive_gate: Callable[[ShardKey, int], Awaitable[bool]] | None = None,
    ):
        self.node = node
        self.shard = shard
        self.namespace, self.shard_id = shard
        self.directory = directory
        self._transport = transport
        self._io = io_executor
        #: Where bulk entries are applied (see `_apply_committed`); default: `io_executor`.
        self._apply_executor = apply_executor or io_executor
        #: Where the WAL's fsyncs run; default: a runner of this shard's own on `io_executor`.
        self._syncs = syncs or SyncRunner(io_executor)
        self._on_failure = on_failure
        #: With archive-sync: whether a committed entry reached the archive (docs/archive.md).
        self._archive_gate = archive_gate
        directory.mkdir(parents=True, exist_ok=True)
        self.incarnation = load_incarnation(directory)
        for leftover in directory.glob("snapshot-staging*"):  # streams cut by a crash
            shutil.rmtree(leftover, ignore_errors=True)
        self._staging_sequence = 0
        self.wal = Wal.open(directory / "wal", sync=wal_sync, segment_bytes=retention.segment_bytes)
        self._trimmer = WalTrimmer(self.wal, retention, f"{node} {shard}")
        self._kv_memory = kv_memory
        self.kv = RocksKv(directory / "kv", kv_memory)
        self.machine = ShardStateMachine(self.kv)
        self._term_file = directory / TERM_FILE
        self._recover_log()
        applied = self.machine.applied_position
        self.replica = ShardReplica(
            node,
            shard,
            self.wal,
            term=self._load_term(),
            commit_offset=applied.offset,
            noop_payload=_NOOP,
            config=replica_config,
            incarnation=self.incarnation,
        )
        #: Writes proposed while leading in `_pending_term`, by offset.
        self._pending: dict[int, asyncio.Future[EntryResult]] = {}
        self._pending_term = -1
        #: The read barrier whose entry is not proposed yet (see `read_barrier`).
        self._next_barrier: asyncio.Task[EntryResult] | None = None
        self._after_sync: list[Outbound] = []
        self._want_sync = False
        self._sync_in_flight = False
        self._processing_scheduled = False
        self._follower_apply_scheduled = False
        self._synced_since_apply = False
        self._acks_written_since_apply = False
        #: Held by the worker thread while it applies (see `_apply_committed`).
        self._apply_lock = threading.Lock()
        self._apply_in_flight = False
        self._closed = False
        self._staged_snapshot: tuple[LogPosition, Path] | None = None
        #: Set at the next change a client stream waits for, then dropped; made when a
        #: stream first asks for it, so that applies with no stream waiting make none.
        self._changed: asyncio.Event | None = None
        self._signalled_role = (self.replica.role, self.replica.term)

    # ------------------------------------------------------------------ recovery

    def _recover_log(self) -> None:
        """Makes the WAL consistent with the KV after a crash (invariant 6)."""
        applied = self.machine.applied_position
        head, base = self.wal.head, self.wal.base
        if applied.offset > head.offset:
            # The KV holds committed entries the WAL lost (never synced here): restart the
            # log right after them.
            log.info(
                "%s %s: KV applied %s is past the WAL head %s; resetting the WAL",
                self.node,
                self.shard,
                applied,
                head,
            )
            self.wal.reset(applied)
        elif (
            applied.offset >= max(base.offset, 0)
            and self.wal.position_at(applied.offset).checksum != applied.checksum
        ):
            raise RuntimeError(
                f"shard {self.shard} in {self.directory}: the KV applied entry {applied} is not the WAL's "
                "entry at that offset; the data directory is corrupt - remove it so the replica rejoins by snapshot"
            )

    def _load_term(self) -> int:
        try:
            return int(self._term_file.read_text().strip())
        except FileNotFoundError:
            return -1

    def _save_term(self, term: int) -> None:
        save_term(self.directory, term)

    # ------------------------------------------------------------------ inputs

    @_stops_on_failure
    def step(self, msg: Message) -> None:
        if self._closed:
            return
        self.replica.step(msg)
        self._process()

    @_stops_on_failure
    def tick(self) -> None:
        if self._closed:
            return
        self.replica.tick()
        self._process()
        if self.replica.role is not Role.LEADER:
            # At least once a tick, whatever is in flight (see `_follower_apply`).
            self._apply_committed(self.replica.commit_offset)
        self._maybe_trim()

    async def write(self, payload: bytes) -> EntryResult:
        """Replicates one write batch; resolves once it is committed and applied, and with
        archive-sync once it is archived (NotLeaderError if this replica stops leading
        first: the entry is committed, and a retry with its serial finds it)."""
        offset, result = await self._replicate(payload)
        if self._archive_gate is not None and not await self._archive_gate(self.shard, offset):
            raise self._not_leader()
        return result

    async def _replicate(self, payload: bytes) -> tuple[int, EntryResult]:
        if self._closed:
            raise NotLeaderError(self.shard, Role.NOT_MEMBER, self.replica.term, None)
        try:
            offset = self.replica.propose(payload)
        except NotLeaderError:
            raise self._not_leader() from None  # its hint names a client address
        future: asyncio.Future[EntryResult] = asyncio.get_running_loop().create_future()
        self._pending[offset] = future
        self._pending_term = self.replica.term
        self._schedule_processing()
        return offset, await future

    async def read_barrier(self) -> None:
        """Returns once a no-op entry proposed after the call has committed in this
        replica's term and is applied: a read of the KV made then is linearizable (see
        "Reads" in docs/protocol.md). Raises NotLeaderError when this replica does not
        lead, or stops leading before the entry commits.

        Every call made before the entry is proposed (on the next turn of the loop)
        shares it, so concurrent reads cost one replication round together.
        """
        if self._next_barrier is None:
            self._next_barrier = asyncio.ensure_future(self._propose_barrier())
            # Awaited only through shields: its error is not left unretrieved when every
            # read waiting for it is cancelled.
            self._next_barrier.add_done_callback(lambda task: task.cancelled() or task.exception())
        await asyncio.shield(self._next_barrier)

    async def _propose_barrier(self) -> EntryResult:
        self._next_barrier = None  # a read from now on needs an entry proposed after it
        _, result = await self._replicate(_NOOP)  # a read waits for no archive
        return result

    def is_leader(self) -> bool:
        return self.replica.role is Role.LEADER

    def leader_hint(self) -> str | None:
        """The client address of the leader this replica knows, for redirects."""
        return self._transport.client_address(self.replica.leader)

    def _not_leader(self) -> NotLeaderError:
        return NotLeaderError(self.shard, self.replica.role, self.replica.term, self.leader_hint())

    def reader(self) -> ShardReader:
        return self.machine

    def changes(self) -> asyncio.Event:
        """An event set at the next change a notification or sequence stream waits for:
        entries applied, a new role or term, the replica closed. A stream takes it before
        it reads, so a change while it reads or sends still wakes it."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _signal_change(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    # ------------------------------------------------------------------ snapshots (follower)

    def can_install_snapshot(self, term: int, leader: str) -> bool:
        return not self._closed and self.replica.can_install_snapshot(term, leader)

    def staging_directory(self) -> Path:
        """A fresh directory to stage one incoming snapshot stream in.

        One per stream: another snapshot may start while one is still arriving (from a
        leader of a newer term, or after the leader gave a stalled stream up), and a
        shared directory would be deleted under the first stream's RocksDB, failing both
        (DATA_LOSS) again and again.
        """
        self._staging_sequence += 1
        path = self.directory / f"snapshot-staging-{self._staging_sequence}"
        if path.exists():
            shutil.rmtree(path)
        return path

    def install_staged_snapshot(
        self, term: int, leader: str, position: LogPosition, staged_kv: Path
    ) -> LogPosition:
        """Hands a fully received snapshot to the engine; swaps it in if accepted."""
        self._staged_snapshot = (position, staged_kv)
        try:
            self.step(SnapshotReceived(self.shard, term, leader, position))
        finally:
            if self._staged_snapshot is not None:
                shutil.rmtree(staged_kv, ignore_errors=True)
                self._staged_snapshot = None
        if self._closed:
            raise ReplicaFailure(
                f"shard {self.namespace}/{self.shard_id} on node {self.node} stopped while "
                "installing a snapshot"
            )
        return self.wal.head

    def _swap_in_snapshot(self, position: LogPosition) -> None:
        assert self._staged_snapshot is not None and self._staged_snapshot[0] == position
        _, staged = self._staged_snapshot
        with self._apply_lock:  # an apply on the worker thread ends first
            self.kv.close()
        live = self.directory / "kv"
        old = self.directory / "kv-old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(live, old)
        os.replace(staged, live)
        shutil.rmtree(old, ignore_errors=True)
        self.kv = RocksKv(live, self._kv_memory)
        self.machine = ShardStateMachine(self.kv)
        self.wal.reset(position)
        self._staged_snapshot = None

    # ------------------------------------------------------------------ the Ready loop

    def _schedule_processing(self) -> None:
        if not self._processing_scheduled:
            self._processing_scheduled = True
            asyncio.get_running_loop().call_soon(self._process_scheduled)

    @_stops_on_failure
    def _process_scheduled(self) -> None:
        self._processing_scheduled = False
        if not self._closed:
            self._process()

    def _schedule_follower_apply(self) -> None:
        if not self._follower_apply_scheduled:
            self._follower_apply_scheduled = True
            asyncio.get_running_loop().call_soon(self._follower_apply)

    @_stops_on_failure
    def _follower_apply(self) -> None:
        """A follower applies on a later turn of the loop, once its Acks are out.

        Its Acks are what the leader waits for, and an apply (milliseconds for 64 puts
        on a busy node) holds the event loop. Run while an fsync is in flight, it would
        hold the fsync's completion, and so the Ack; run while a sent Ack is not yet
        written to its stream (gRPC writes it on later turns of the loop), it would hold
        the Ack itself: the leader then waited for the follower's apply on every write.
        `_sync_done` and `acks_written` schedule this again. Once per completed fsync
        and once per written batch of Acks it applies even if another is in flight:
        under a steady stream of Appends there always is one, and the follower must not
        fall ever further behind; `tick` applies regardless, so a stalled stream holds
        the apply for at most a tick. The leader, whose clients wait on the apply
        itself, applies at once.
        """
        self._follower_apply_scheduled = False
        if self._closed or (self._sync_in_flight and not self._synced_since_apply):
            return  # `_sync_done` schedules it again
        if self._transport.acks_in_transit(self.shard) and not self._acks_written_since_apply:
            return  # `acks_written` schedules it again
        self._synced_since_apply = False
        self._acks_written_since_apply = False
        self._apply_committed(self.replica.commit_offset)

    @_stops_on_failure
    def appends_written(self) -> None:
        """The transport wrote every Append this replica sent. A leader waiting for the
        Acks of its one unapplied entry prepares that entry's apply meanwhile (see
        `ShardStateMachine.prepare`): the apply, milliseconds for 64 puts, then leaves
        its clients' wait. Not before the Appends are written: it would hold them."""
        if self._closed or self.replica.role is not Role.LEADER or self._apply_in_flight:
            return
        applied = self.machine.applied_position.offset
        if self.wal.head.offset != applied + 1 or self.replica.commit_offset > applied:
            return  # several entries wait (it applies them as they commit), or none
        [entry] = self.wal.read(applied + 1, 1, _APPLY_CHUNK_BYTES)
        if len(entry.payload) < _APPLY_OFF_LOOP_BYTES:
            self.machine.prepare(entry)

    def acks_written(self) -> None:
        """The transport wrote the Acks this replica sent (or dropped them with their
        stream): an apply held back for them may run."""
        if self._closed or self.replica.role is Role.LEADER:
            return
        self._acks_written_since_apply = True
        self._schedule_follower_apply()

    def _process(self) -> None:
        if self._pending and not (
            self.replica.role is Role.LEADER and self.replica.term == self._pending_term
        ):
            # Deposed (by the step that led here): the writes we proposed may be cut from
            # the log, and the entries another leader writes at their offsets must not
            # answer them.
            self._fail_pending()
        ready = self.replica.ready()
        self._apply_storage(ready)
        for out in ready.send_now:
            self._transport.send(self, out)
        if ready.has_storage_work() or ready.send_after_sync:
            self._after_sync.extend(ready.send_after_sync)
            self._want_sync = True
            self._start_sync()
        if self.replica.role is Role.LEADER:
            self._apply_committed(ready.commit_offset)
        else:
            self._schedule_follower_apply()
        for request in ready.snapshots:
            self._transport.send_snapshot(self, request)
        role = (self.replica.role, self.replica.term)
        if role != self._signalled_role:
            self._signalled_role = role
            self._signal_change()

    def _apply_storage(self, ready: Ready) -> None:
        if ready.term is not None:
            self._save_term(ready.term)
        if ready.truncate_after is not None:
            self.wal.truncate_after(ready.truncate_after)
        if ready.install_snapshot is not None:
            self._swap_in_snapshot(ready.install_snapshot)
        if ready.entries:
            self.wal.append(ready.entries)

    def _start_sync(self) -> None:
        if self._sync_in_flight or not self._want_sync or self._closed:
            return
        self._want_sync = False
        self._sync_in_flight = True
        ticket = self.wal.prepare_sync()
        messages, self._after_sync = self._after_sync, []
        self._syncs.run(
            ticket,
            self.replica.role is not Role.LEADER,
            lambda: self._sync_done(ticket, messages),
        )

    @_stops_on_failure
    def _sync_done(self, ticket: SyncTicket, messages: list[Outbound]) -> None:
        self._sync_in_flight = False
        if self._closed:
            return
        self.wal.complete_sync(ticket)
        for out in messages:
            self._transport.send(self, out)
        self.replica.persisted(ticket.head.offset)
        self._synced_since_apply = True
        self._process()
        self._start_sync()

    def _apply_committed(self, commit_offset: int) -> None:
        """Applies the next slice of committed entries; a longer backlog goes on next turn.

        Applying costs milliseconds per entry, so a replica catching up thousands of
        entries (after a restart, say) would otherwise hold the event loop for seconds:
        no health report, Ack or client call would be served meanwhile, and the
        coordinator would take the node for dead (and replace it if it leads).

        A slice of `_APPLY_OFF_LOOP_BYTES` or more (a bulk write's entry: 25,000 keys of
        200 bytes took 80-150 ms to apply, longer on a loaded machine) is applied on a
        worker thread instead. RocksDB's writes and Arrow's kernels release the GIL, and
        Python hands it over every few ms, so the loop goes on serving meanwhile. Smaller
        slices stay on the loop, where they cost less than the thread hop would. One
        slice is applied at a time; the next waits for it.
        """
        if self._apply_in_flight:
            return  # `_applied_off_loop` goes on from where it ends
        upto = min(commit_offset, self.wal.head.offset)
        applied = self.machine.applied_position.offset
        if upto <= applied:
            return
        entries = self.wal.read(
            applied + 1, min(_APPLY_CHUNK_ENTRIES, upto - applied), _APPLY_CHUNK_BYTES
        )
        if sum(len(entry.payload) for entry in entries) < _APPLY_OFF_LOOP_BYTES:
            self._resolve_writes(entries, self.machine.apply(entries))
            if entries and entries[-1].offset < upto:
                self._schedule_processing()
            return
        self._apply_in_flight = True
        machine = self.machine
        future = asyncio.get_running_loop().run_in_executor(
            self._apply_executor, self._apply_on_worker, machine, entries
        )
        future.add_done_callback(lambda done: self._applied_off_loop(done, machine, entries))

    def _apply_on_worker(
        self, machine: ShardStateMachine, entries: Sequence[LogEntry]
    ) -> list[EntryResult | None]:
        with self._apply_lock:
            if self._closed or machine is not self.machine:  # closed or replaced meanwhile
                return []
            return machine.apply(entries)

    @_stops_on_failure
    def _applied_off_loop(
        self,
        done: asyncio.Future[list[EntryResult | None]],
        machine: ShardStateMachine,
        entries: Sequence[LogEntry],
    ) -> None:
        self._apply_in_flight = False
        if not self._closed and machine is self.machine:
            self._resolve_writes(entries, done.result())  # an apply error stops the replica
        elif not done.cancelled() and done.exception() is not None:
            # Closed or replaced by a snapshot meanwhile: nobody waits for the results.
            log.warning(
                "shard %s/%s on node %s: applying entries %d-%d failed after the shard was %s: %r",
                self.namespace,
                self.shard_id,
                self.node,
                entries[0].offset,
                entries[-1].offset,
                "closed" if self._closed else "replaced by a snapshot",
                done.exception(),
            )
        if not self._closed:
            self._apply_committed(self.replica.commit_offset)

    def _resolve_writes(
        self, entries: Sequence[LogEntry], results: list[EntryResult | None]
    ) -> None:
        for entry, result in zip(entries, results):
            future = self._pending.pop(entry.offset, None)
            if future is not None and not future.done() and result is not None:
                future.set_result(result)
        if entries:
            self._signal_change()

    # ------------------------------------------------------------------ WAL retention

    def _maybe_trim(self) -> None:
        """Drops WAL segments the KV has made redundant (see `WalRetention`).

        The KV is flushed first (off the loop) so that what the trimmed entries did
        survives a crash; the trim point is taken before that flush, and never passes
        the synced head, so no segment an fsync in flight still covers is deleted.
        """
        done = min(
            self.machine.applied_position.offset,
            self.replica.commit_offset,
            self.wal.synced_head.offset,
        )
        offset = self._trimmer.start(done)
        if offset is None:
            return
        kv = self.kv
        future = asyncio.get_running_loop().run_in_executor(self._io, kv.flush)
        future.add_done_callback(lambda flushed: self._trim_after_flush(flushed, kv, offset))

    @_stops_on_failure
    def _trim_after_flush(self, flushed: asyncio.Future[None], kv: RocksKv, offset: int) -> None:
        if self._closed or kv is not self.kv:  # closed, or a snapshot replaced the KV meanwhile
            self._trimmer.end(None)
            return
        if flushed.exception() is not None:
            log.warning(
                "%s %s: flushing the KV before a WAL trim failed: %s",
                self.node,
                self.shard,
                flushed.exception(),
            )
            self._trimmer.end(None)
            return
        self._trimmer.end(offset)

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._not_leader())

    # ------------------------------------------------------------------ lifecycle

    def _fail_stop(self, error: Exception) -> None:
        """Stops this replica for good after `error` escaped its processing.

        After a failed write or fsync, memory and disk may disagree (the WAL refuses any
        further use for that reason), so the replica must not go on. Retrying on every
        tick would wedge the shard instead -- a leader that cannot commit is still the
        leader -- and flood the log. The node stops on `on_failure`: the coordinator
        elects other leaders, and a restart recovers this replica from its files.
        """
        if self._closed:
            return
        failure = ReplicaFailure(
            f"shard {self.namespace}/{self.shard_id} on node {self.node} failed "
            f"({type(error).__name__}: {error}); the node stops, and the other replicas of "
            f"its shards, if any, elect new leaders. Fix the cause (a full disk: free space) "
            f"and restart the node: it recovers the shard from {self.directory}"
        )
        log.critical("%s", failure, exc_info=error)
        with contextlib.suppress(Exception):  # the storage is failing: releasing it is enough
            self.close()
        self._on_failure(failure)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fail_pending()
        self._signal_change()
        try:
            self.wal.close()
        finally:
            with self._apply_lock:  # an apply on the worker thread ends first
                self.kv.close()
