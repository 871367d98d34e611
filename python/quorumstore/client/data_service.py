"""A small synchronous client of quorumstore's data service (`quorumstore.data.v1`).

Internal: the Spark data source uses it on the driver and in tasks; tests and the
benchmark use it to load data. It routes by key hash as `AsyncClient` does (the
same `routing.ShardMap`), finds each shard's leader and followers in the routing
table (`ListShards`), and retries what is safe to retry on another replica or a bit
later (`retry.classify`'s transient failures, with `retry.Backoff`'s waits): reads
before their first row arrives, change reads from the last row received, and writes
that carry an exactly-once serial. It blocks, unlike `AsyncClient`: Spark tasks and
the driver call it from plain threads.

A node that is paused, or cut off from the rest of the cluster while this client still
reaches it, may hold a call for as long as the fault lasts. So each call is watched:
one on a shard's leader that runs longer than `LEADER_CHECK_S` has the other nodes
asked for the shard's leader, and is given up once they name one elected in a later
term; one that any replica may serve, once it has had no answer for
`REPLICA_ANSWER_S`, is given up when, at two checks in a row, its node does not list
the shards in time while another node does, or lists the shard in an earlier term
than another node does. A call given up is cancelled (its channel is closed). One given up
on a leader is tried again at once at the successor the check found; any other is retried
like a transient failure, after the routing table is read from every node again, each
shard's entry taken from the node that knows the latest term (nodes a fault held lately
are asked but not waited for).

Example::

    with DataClient("127.0.0.1:6648") as client:
        rows = pa.table({"key": ["a", "b"], "value": [b"1", b"2"]})
        for shard, part in client.route(rows).items():
            client.write(shard, part, origin=ClientSerial("loader-1", 0))
        for batch, commit_offset in client.scan(0):
            ...
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow.ipc import ipc_batches, ipc_bytes
from quorumstore.client.retry import Backoff, Transient, classify
from quorumstore.client.routing import ShardAssignment, ShardMap
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.proto import quorumstore_data_pb2_grpc as pb_grpc
from quorumstore.wire.channels import CLIENT_CHANNEL_OPTIONS
from quorumstore.wire.metadata import DEFAULT_NAMESPACE, ClientSerial
from quorumstore.wire.schemas import ROWS_SCHEMA
from quorumstore.wire.tls import TlsConfig, TokenSource, open_channel

#: How long a call keeps retrying (elections, leader changes) before it gives up.
log = logging.getLogger(__name__)

DEFAULT_RETRY_S = 60.0
#: Deadline of one unary call.
_CALL_TIMEOUT_S = 120.0
#: `retry.Backoff` between rounds of attempts: from 50 ms, doubling up to 1 s.
_BACKOFF_S = (0.05, 1.0)
#: How long a call on a shard's leader runs before the other nodes are asked whether a
#: newer leader was elected, and how often again (see `discovery.LEADER_CHECK_S`).
LEADER_CHECK_S = 0.3
LEADER_RECHECK_S = 0.1
#: How long a call that any replica may serve waits for an answer before its node is
#: checked (and may be left for another replica).
REPLICA_ANSWER_S = 0.3
#: How long a check waits for a node to list the shards, and for the others once one
#: has: a node that answers much later than its peers counts as silent.
_CHECK_ANSWER_S = 0.2
_CHECK_GRACE_S = 0.1
#: How long a node that held a call, or left one unanswered while others answered, stays
#: suspect for every client of the process (a Spark task's or query's client lives for
#: one call): asked last among replicas, and not waited for beyond the others.
SUSPECT_S = 10.0
#: How long a follower's copy of staged rows is waited for at least, after the leader
#: took them.
STAGE_COPY_GRACE_S = 0.2
#: A call that takes longer is logged with the nodes it asked: a fault held it past the
#: failover its watch gives.
SLOW_CALL_S = 1.0
#: Node -> when a call on it was last given up or left unanswered.
_suspects: dict[str, float] = {}


def _suspected(address: str, now: float) -> bool:
    """Whether a call on `address` was given up or left unanswered within `SUSPECT_S`."""
    return now - _suspects.get(address, -SUSPECT_S) < SUSPECT_S


def _suspect_unfinished(calls: Iterable[tuple[str, grpc.Future]]) -> None:
    """Marks the nodes whose call has not ended, once other nodes answered theirs: a
    fault may hold them, and the next client of the process need not wait for them."""
    now = time.monotonic()
    for address, future in calls:
        if not future.done():
            _suspects[address] = now


_T = TypeVar("_T")
_K = TypeVar("_K")


class _ChunkStream(Protocol):
    """A server-streaming call: an iterator of its responses that `cancel()` ends."""

    def __iter__(self) -> Iterator[pb.ArrowChunk]: ...

    def __next__(self) -> pb.ArrowChunk: ...

    def cancel(self) -> bool: ...


class DataClientError(RuntimeError):
    """A data service call failed for good; the message says which and why."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Shard:
    shard: int
    min_hash: int
    max_hash: int
    leader: str
    followers: tuple[str, ...]
    #: The term the leader was elected in, as the node that listed it knew.
    term: int = -1


@dataclass(frozen=True)
class WriteResult:
    #: The entry's offset (-1 for a duplicate detected before it was proposed).
    offset: int
    duplicate: bool
    rows: int


@dataclass(frozen=True)
class Offsets:
    commit_offset: int
    #: Changes after this offset are kept (-1: none expired).
    changes_kept_after: int


def _shard(info: pb.ShardInfo) -> Shard:
    return Shard(
        info.shard,
        info.min_hash_inclusive,
        info.max_hash_inclusive,
        info.leader,
        tuple(info.followers),
        info.term,
    )


def _describe(error: grpc.RpcError) -> str:
    return f"{error.code().name}: {error.details()}"


def _retryable(error: grpc.RpcError) -> bool:
    """Whether the call may succeed on another replica or a bit later: a transient
    failure (`retry.classify`), except a data call that ran out of its own deadline,
    which was slow rather than refused and would be as slow again."""
    return error.code() != grpc.StatusCode.DEADLINE_EXCEEDED and isinstance(
        classify(error), Transient
    )


def _first_answers(
    calls: dict[_K, grpc.Future], grace_s: float = 0.1, unawaited: Collection[_K] = ()
) -> tuple[dict[_K, Any], dict[_K, grpc.RpcError]]:
    """The answers and failures of calls to several nodes at once, taken in the order
    they come, until every call ended or `grace_s` after the first answer: a node that
    a fault holds never answers, and its call is not waited for. The `unawaited` calls
    (to nodes a fault held lately) are not waited for even that long once the others
    ended."""
    done: queue.SimpleQueue[tuple[_K, grpc.Future]] = queue.SimpleQueue()
    for address, future in calls.items():
        future.add_done_callback(lambda f, a=address: done.put((a, f)))
    answers: dict[_K, Any] = {}
    failures: dict[_K, grpc.RpcError] = {}
    awaited = set(calls) - set(unawaited)
    grace_ends: float | None = None
    while len(answers) + len(failures) < len(calls) and (
        grace_ends is None or not awaited <= answers.keys() | failures.keys()
    ):
        wait = None if grace_ends is None else max(grace_ends - time.monotonic(), 0.0)
        try:
            address, future = done.get(timeout=wait)
        except queue.Empty:
            break
        try:
            answers[address] = future.result()
        except grpc.RpcError as e:
            failures[address] = e
            continue
        if grace_ends is None:
            grace_ends = time.monotonic() + grace_s
    return answers, failures


def _answers_of_nodes(
    calls: dict[_K, grpc.Future], node_of: Callable[[_K], str]
) -> tuple[dict[_K, Any], dict[_K, grpc.RpcError]]:
    """`_first_answers` of calls to nodes (`node_of(key)`), kept with the process's
    suspects: a suspect node is not waited for beyond the others, and a node whose call
    has not ended once another answered becomes one."""
    now = time.monotonic()
    answers, failures = _first_answers(
        calls, unawaited=[k for k in calls if _suspected(node_of(k), now)]
    )
    if answers:
        _suspect_unfinished((node_of(k), future) for k, future in calls.items())
    return answers, failures


class DataClient:
    """Routing table, channels and per-shard calls of one namespace.

    `address` is one node or a comma-separated list of nodes; any node serves the
    routing table. `tls` secures the channels; `token` is presented on every call (a
    cluster with an auth config needs one). Not thread-safe: use one client per thread.
    """

    def __init__(
        self,
        address: str,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        retry_s: float = DEFAULT_RETRY_S,
        tls: TlsConfig | None = None,
        token: TokenSource | None = None,
    ) -> None:
        self.bootstrap = [a.strip() for a in address.split(",") if a.strip()]
        if not self.bootstrap:
            raise ValueError(f"no address in {address!r}")
        self.namespace = namespace
        self.retry_s = retry_s
        self._tls = tls
        self._token = token
        self._channels: dict[str, grpc.Channel] = {}
        self._shards: list[Shard] | None = None
        #: Routing by key hash over `_shards`; built when first needed after a refresh.
        self._map: ShardMap | None = None
        #: Nodes whose channel a watch closed to give up a call held by a fault.
        self._abandoned: set[str] = set()
        #: Shard -> the leader elected after the one a watch gave a call up on.
        self._successors: dict[int, Shard] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def _stub(self, address: str) -> pb_grpc.QuorumstoreDataStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_channel(address, CLIENT_CHANNEL_OPTIONS, self._tls, self._token)
            self._channels[address] = channel
        return pb_grpc.QuorumstoreDataStub(channel)

    # -------------------------------------------------------------- routing

    def shards(self, *, refresh: bool = False, timeout_s: float | None = None) -> list[Shard]:
        """The namespace's shards, by shard id; asks the nodes again when `refresh`."""
        if self._shards is None or refresh:
            self._shards = self._retrying(
                "list the shards", lambda: self._list_shards(), timeout_s or self.retry_s
            )
            self._map = None
        return self._shards

    def _routing(self) -> ShardMap:
        shards = self.shards()
        if self._map is None:
            try:
                self._map = ShardMap(
                    ShardAssignment(s.shard, s.leader, s.min_hash, s.max_hash) for s in shards
                )
            except ValueError as e:
                raise DataClientError(f"cannot route the keys of {self.namespace!r}: {e}") from None
        return self._map

    def _nodes(self) -> list[str]:
        """Every node known: the bootstrap addresses, then the shards' replicas."""
        known = {a for s in self._shards or () for a in (s.leader, *s.followers) if a}
        return [*self.bootstrap, *sorted(known - set(self.bootstrap))]

    def _list_shards(self) -> list[Shard]:
        """The routing table, asked of every node at once: each shard as the node that
        knows its latest term lists it (a deposed leader cut off from the cluster still
        lists itself)."""
        request = pb.ListShardsRequest(namespace=self.namespace)
        answers, failures = _answers_of_nodes(
            {a: self._stub(a).ListShards.future(request, timeout=5.0) for a in self._nodes()},
            str,
        )
        for address, e in failures.items():
            if not isinstance(classify(e), Transient):
                raise DataClientError(f"{address}: {_describe(e)}", e.code()) from None
        if not answers:
            raise _Retry("; ".join(f"{a}: {_describe(e)}" for a, e in failures.items()))
        latest: dict[int, pb.ShardInfo] = {}
        for answer in answers.values():
            for info in answer.shards:
                if info.shard not in latest or info.term > latest[info.shard].term:
                    latest[info.shard] = info
        return [_shard(s) for _, s in sorted(latest.items())]

    def _held(
        self, shard: Shard, address: str, on_leader: bool, channels: dict[str, grpc.Channel]
    ) -> bool:
        """Whether a fault holds a call to `address` on `shard`, as the nodes' routing
        tables tell (`channels`: the watch's own, by address, opened here as needed). A
        call on the leader is held once another node lists a leader of a later term. A
        call any replica may serve is held once `address` does not list the shards in
        time (paused, unreachable) or lists it in an earlier term than another node
        (cut off from the cluster's news); a replica that answers and keeps up is only
        slow (a large first answer), and is waited for."""
        request = pb.ListShardsRequest(namespace=self.namespace)
        futures: dict[str, grpc.Future] = {}
        for node in self._nodes():
            if node != address or not on_leader:
                if node not in channels:
                    channels[node] = open_channel(
                        node, CLIENT_CHANNEL_OPTIONS, self._tls, self._token
                    )
                stub = pb_grpc.QuorumstoreDataStub(channels[node])
                futures[node] = stub.ListShards.future(request, timeout=_CHECK_ANSWER_S)
        answers, _ = _first_answers(futures, _CHECK_GRACE_S)
        for future in futures.values():
            future.cancel()
        listed: dict[str, pb.ShardInfo] = {}
        for node, answer in answers.items():
            for info in answer.shards:
                if info.shard == shard.shard:
                    listed[node] = info
        if on_leader:
            successors = [
                info
                for info in listed.values()
                if info.term > shard.term and info.leader and info.leader != address
            ]
            if successors:  # the retry goes there without asking every node again
                self._successors[shard.shard] = _shard(max(successors, key=lambda i: i.term))
            return bool(successors)
        if address not in listed:
            return bool(listed)  # silent while another node answers (alone: only busy)
        own_term = listed.pop(address).term
        return any(info.term > own_term for info in listed.values())

    @contextlib.contextmanager
    def _watched(self, shard_id: int, address: str, on_leader: bool) -> Iterator[None]:
        """Gives up the call made inside on `address` (closes its channel) once a fault
        holds it (`_held`): see the module docstring."""
        channel, shard = self._channels[address], self.shard(shard_id)
        done = threading.Event()

        def watch() -> None:
            own: dict[str, grpc.Channel] = {}
            held = 0  # checks in a row that found the call held
            try:
                wait = LEADER_CHECK_S if on_leader else REPLICA_ANSWER_S
                while not done.wait(wait):
                    wait = LEADER_RECHECK_S
                    held = held + 1 if self._held(shard, address, on_leader, own) else 0
                    # A leader's successor is news enough; a silent replica may be busy,
                    # so it must stay silent for two checks.
                    if held >= (1 if on_leader else 2):
                        _suspects[address] = time.monotonic()
                        self._abandoned.add(address)
                        channel.close()
                        return
            finally:
                for other in own.values():
                    other.close()

        watcher = threading.Thread(target=watch, name=f"quorumstore-watch-{address}", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()

    def _forget_abandoned(self, address: str) -> bool:
        """Whether a watch gave up the call on `address`; if so, drops its closed channel."""
        if address not in self._abandoned:
            return False
        self._abandoned.discard(address)
        self._channels.pop(address, None)
        return True

    def shard(self, shard_id: int) -> Shard:
        for s in self.shards():
            if s.shard == shard_id:
                return s
        raise DataClientError(f"namespace {self.namespace!r} has no shard {shard_id}")

    def shard_of(self, key: str) -> int:
        return self._routing().shard_for(key)

    def route(self, rows: pa.Table | pa.RecordBatch) -> dict[int, pa.Table]:
        """`rows` (with a string `key` column) split by shard; shards without rows are left out."""
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        if table.num_rows == 0:
            return {}
        shard_ids = self._routing().shards_for(table.column("key").to_pylist())
        return {
            int(shard): table.take(pa.array(np.flatnonzero(shard_ids == shard)))
            for shard in np.unique(shard_ids)
        }

    def each_shard(
        self, shard_ids: Sequence[int], call: Callable[[DataClient, int], _T]
    ) -> dict[int, _T | DataClientError]:
        """`call(client, shard_id)` for every shard at once, each on a client of its own
        (clients are not thread-safe) that starts from this one's routing table: a fault
        that holds one shard's leader delays that shard's call, not every call after it.
        The leaders they found elected meanwhile are this client's too afterwards.
        Returns each shard's result, or the DataClientError its call raised."""
        shards = self.shards()
        learned: list[list[Shard]] = []

        def run(shard_id: int) -> _T | DataClientError:
            with DataClient(
                ",".join(self.bootstrap),
                self.namespace,
                retry_s=self.retry_s,
                tls=self._tls,
                token=self._token,
            ) as client:
                client._shards = shards
                try:
                    return call(client, shard_id)
                except DataClientError as e:
                    return e
                finally:
                    learned.append(client.shards())

        if len(shard_ids) <= 1:
            results = {shard_id: run(shard_id) for shard_id in shard_ids}
        else:
            with ThreadPoolExecutor(len(shard_ids), thread_name_prefix="quorumstore-shard") as pool:
                results = dict(zip(shard_ids, pool.map(run, shard_ids)))
        for table in learned:
            self._adopt(table)
        return results

    def _adopt(self, table: list[Shard]) -> None:
        """Takes each shard's entry from `table` where it names a later term."""
        own = {s.shard: s for s in self.shards()}
        newer = [s for s in table if s.shard in own and s.term > own[s.shard].term]
        if newer:
            own.update((s.shard, s) for s in newer)
            self._shards = [own[k] for k in sorted(own)]
            self._map = None

    # -------------------------------------------------------------- retries

    def _retrying(self, what: str, call: Callable[[], _T], retry_s: float | None = None) -> _T:
        deadline = time.monotonic() + (self.retry_s if retry_s is None else retry_s)
        backoff = Backoff(*_BACKOFF_S)
        while True:
            moved = False
            try:
                return call()
            except _Retry as e:
                last, moved = str(e), isinstance(e, _LeaderMoved)
            except grpc.RpcError as e:
                if not _retryable(e):
                    raise DataClientError(f"cannot {what}: {_describe(e)}", e.code()) from None
                last = _describe(e)
            if time.monotonic() + backoff.limit > deadline:
                raise DataClientError(
                    f"cannot {what} (gave up after retrying): {last}", grpc.StatusCode.UNAVAILABLE
                )
            if not moved:
                time.sleep(backoff.next_delay())

    def _replicas(self, shard_id: int, prefer_follower: bool) -> list[str]:
        """Nodes to ask, in order of preference."""
        s = self.shard(shard_id)
        followers = [f for f in s.followers if f]
        random.shuffle(followers)
        leader = [s.leader] if s.leader else []
        ordered = followers + leader if prefer_follower else leader + followers
        now = time.monotonic()
        return sorted(ordered, key=lambda a: _suspected(a, now))

    def _on_shard(
        self,
        shard_id: int,
        what: str,
        call: Callable[[pb_grpc.QuorumstoreDataStub], _T],
        *,
        followers: bool = False,
        prefer_follower: bool = False,
        retry: bool = True,
    ) -> _T:
        """`call` on the shard's leader (or any replica when `followers`), refreshing the
        routing table and retrying on retryable errors when `retry`."""
        first = True
        started = time.monotonic()
        tried: list[str] = []

        def attempt() -> _T:
            nonlocal first
            if (successor := self._successors.pop(shard_id, None)) is not None:
                self._adopt([successor])
            elif not first:
                self.shards(refresh=True)
            first = False
            replicas = (
                self._replicas(shard_id, prefer_follower)
                if followers
                else [self.shard(shard_id).leader]
            )
            errors = []
            for address in [a for a in replicas if a]:
                stub = self._stub(address)
                tried.append(f"{address} at {time.monotonic() - started:.2f} s")
                try:
                    with self._watched(shard_id, address, on_leader=not followers):
                        return call(stub)
                except grpc.RpcError as e:
                    if self._forget_abandoned(address):
                        errors.append(f"{address}: gave up a call a fault held")
                        continue
                    if not retry or not _retryable(e):
                        raise
                    errors.append(f"{address}: {_describe(e)}")
            reason = "; ".join(errors) or f"shard {shard_id} has no leader right now"
            if shard_id in self._successors:
                raise _LeaderMoved(reason)
            raise _Retry(reason)

        try:
            return self._attempted(shard_id, what, attempt, retry)
        finally:
            if time.monotonic() - started > SLOW_CALL_S:
                log.warning(
                    "%s on shard %d took %.2f s; asked %s",
                    what,
                    shard_id,
                    time.monotonic() - started,
                    ", ".join(tried) or "no node",
                )

    def _attempted(self, shard_id: int, what: str, attempt: Callable[[], _T], retry: bool) -> _T:
        if not retry:
            try:
                return attempt()
            except grpc.RpcError as e:
                raise DataClientError(
                    f"cannot {what} on shard {shard_id}: {_describe(e)}", e.code()
                ) from None
            except _Retry as e:
                raise DataClientError(
                    f"cannot {what} on shard {shard_id}: {e}", grpc.StatusCode.UNAVAILABLE
                ) from None
        return self._retrying(f"{what} on shard {shard_id}", attempt)

    # -------------------------------------------------------------- reads

    def split_ranges(
        self,
        shard_id: int,
        ranges: Sequence[tuple[str, str]],
        max_rows: int,
        *,
        allow_follower: bool = False,
    ) -> list[tuple[str, str]]:
        request = pb.SplitRangesRequest(
            namespace=self.namespace,
            shard=shard_id,
            ranges=[pb.KeyRange(min_inclusive=a, max_exclusive=b) for a, b in ranges],
            max_rows=max_rows,
            allow_follower=allow_follower,
        )
        response = self._on_shard(
            shard_id,
            "split key ranges",
            lambda stub: stub.SplitRanges(request, timeout=_CALL_TIMEOUT_S),
            followers=allow_follower,
            prefer_follower=allow_follower,
        )
        return [(r.min_inclusive, r.max_exclusive) for r in response.ranges]

    def scan(
        self,
        shard_id: int,
        ranges: Sequence[tuple[str, str]] = (),
        keys: Sequence[str] = (),
        *,
        allow_follower: bool = False,
        batch_rows: int = 0,
    ) -> Iterator[tuple[pa.RecordBatch, int]]:
        """(record batch, commit offset) chunks of one snapshot of the shard.

        Failures before the first chunk are retried; later ones raise (the rows read
        so far came from a snapshot that cannot be resumed).
        """
        request = pb.ScanRequest(
            namespace=self.namespace,
            shard=shard_id,
            ranges=[pb.KeyRange(min_inclusive=a, max_exclusive=b) for a, b in ranges],
            keys=list(keys),
            allow_follower=allow_follower,
            batch_rows=batch_rows,
        )

        def open_stream(
            stub: pb_grpc.QuorumstoreDataStub,
        ) -> tuple[_ChunkStream, pb.ArrowChunk]:
            stream = stub.ScanArrow(request)
            return stream, next(stream)

        chunk: pb.ArrowChunk | None
        stream, chunk = self._on_shard(
            shard_id, "scan", open_stream, followers=allow_follower, prefer_follower=allow_follower
        )
        try:
            while chunk is not None:
                for batch in ipc_batches(chunk.ipc):
                    yield batch, chunk.commit_offset
                chunk = next(stream, None)
        except grpc.RpcError as e:
            raise DataClientError(
                f"scan of shard {shard_id} failed midway: {_describe(e)}", e.code()
            ) from None
        finally:
            stream.cancel()

    def offsets(self, shard_id: int, *, allow_follower: bool = False) -> Offsets:
        request = pb.GetOffsetsRequest(
            namespace=self.namespace, shard=shard_id, allow_follower=allow_follower
        )
        response = self._on_shard(
            shard_id,
            "read offsets",
            lambda stub: stub.GetOffsets(request, timeout=_CALL_TIMEOUT_S),
            followers=allow_follower,
        )
        return Offsets(response.commit_offset, response.changes_kept_after)

    def latest_offsets(self, shard_ids: Sequence[int]) -> dict[int, Offsets]:
        """Each shard's offsets as the first of its replicas to answer give them
        (followers too, which may be a little behind): every replica of every shard is
        asked at once, each shard takes the highest commit offset among the answers,
        and a node a fault holds is not waited for beyond a short grace. A shard none
        of whose replicas answered in time is asked again as `offsets` asks."""
        calls = {}
        for shard_id in shard_ids:
            shard = self.shard(shard_id)
            request = pb.GetOffsetsRequest(
                namespace=self.namespace, shard=shard_id, allow_follower=True
            )
            for address in {a for a in (shard.leader, *shard.followers) if a}:
                stub = self._stub(address)
                calls[shard_id, address] = stub.GetOffsets.future(request, timeout=_CALL_TIMEOUT_S)
        answers, _ = _answers_of_nodes(calls, lambda key: key[1])
        for future in calls.values():
            future.cancel()
        latest: dict[int, Offsets] = {}
        for (shard_id, _), response in answers.items():
            if shard_id not in latest or response.commit_offset > latest[shard_id].commit_offset:
                latest[shard_id] = Offsets(response.commit_offset, response.changes_kept_after)
        for shard_id in shard_ids:
            if shard_id not in latest:
                latest[shard_id] = self.offsets(shard_id, allow_follower=True)
        return latest

    def changes(
        self, shard_id: int, start_exclusive: int, end_inclusive: int, *, max_rows: int = 0
    ) -> Iterator[pa.RecordBatch]:
        """The change rows of entries in (start, end], in offset order, each exactly once.

        Any replica that has applied `end` serves them; a failed stream resumes after
        the last row it delivered (inside an entry split over chunks, too), on whichever
        replica answers.
        """
        position = start_exclusive
        # Rows delivered of the entry after `position` (a split entry's first chunks).
        delivered = 0
        stalled_since: float | None = None
        while position < end_inclusive:
            request = pb.ReadChangesRequest(
                namespace=self.namespace,
                shard=shard_id,
                start_offset_exclusive=position,
                end_offset_inclusive=end_inclusive,
                max_rows=max_rows,
                skip_rows=delivered,
            )

            def open_stream(
                stub: pb_grpc.QuorumstoreDataStub, request: pb.ReadChangesRequest = request
            ) -> tuple[_ChunkStream, pb.ArrowChunk | None]:
                stream = stub.ReadChanges(request)
                return stream, next(stream, None)

            stream, chunk = self._on_shard(shard_id, "read changes", open_stream, followers=True)
            resumed_at = position
            try:
                while chunk is not None:
                    batches = ipc_batches(chunk.ipc)
                    yield from batches
                    if chunk.commit_offset != position:
                        position, delivered = chunk.commit_offset, 0
                    delivered += sum(
                        pc.sum(pc.greater(b.column("offset"), position)).as_py() or 0
                        for b in batches
                    )
                    chunk = next(stream, None)
                return
            except grpc.RpcError as e:
                now = time.monotonic()
                stalled_since = (
                    stalled_since if position == resumed_at and stalled_since is not None else now
                )
                if not _retryable(e) or now - stalled_since > self.retry_s:
                    raise DataClientError(
                        f"cannot read changes of shard {shard_id}: {_describe(e)}", e.code()
                    ) from None
            finally:
                stream.cancel()

    # -------------------------------------------------------------- writes

    def write(
        self,
        shard_id: int,
        rows: pa.Table | pa.RecordBatch,
        *,
        origin: ClientSerial | None = None,
        replace: tuple[str, str] | None = None,
        unique_keys: bool = False,
    ) -> WriteResult:
        """Rows (key string, value binary) as ONE entry on the shard's leader.

        With `origin` the write is exactly-once and retried across leader changes;
        without it, a failure is not retried (its outcome may be unknown).
        """
        request = self._write_request(shard_id, origin, replace, unique_keys)
        request.ipc = ipc_bytes(rows.select(ROWS_SCHEMA.names))
        return self._send_write(shard_id, request, retry=origin is not None)

    def publish(
        self,
        shard_id: int,
        write_id: str,
        parts: Iterable[tuple[str, int, int]],
        *,
        origin: ClientSerial,
        replace: tuple[str, str] | None = None,
        unique_keys: bool = False,
        validate_only: bool = False,
    ) -> WriteResult:
        """Publishes staged (part, chunks, rows) as ONE entry, exactly once per `origin`.

        With `validate_only` the leader checks that it would succeed and writes nothing.
        """
        request = self._write_request(shard_id, origin, replace, unique_keys)
        request.validate_only = validate_only
        request.staged.CopyFrom(
            pb.StagedRows(
                write_id=write_id,
                parts=[pb.StagedPart(part=p, chunks=c, rows=r) for p, c, r in parts],
            )
        )
        return self._send_write(shard_id, request, retry=True)

    def _write_request(
        self,
        shard_id: int,
        origin: ClientSerial | None,
        replace: tuple[str, str] | None,
        unique_keys: bool,
    ) -> pb.WriteArrowRequest:
        request = pb.WriteArrowRequest(
            namespace=self.namespace, shard=shard_id, unique_keys=unique_keys
        )
        if origin is not None:
            request.client_id, request.serial, request.has_serial = (
                origin.client_id,
                origin.serial,
                True,
            )
        if replace is not None:
            request.replace = True
            request.replace_min_inclusive, request.replace_max_exclusive = replace
        return request

    def _send_write(
        self, shard_id: int, request: pb.WriteArrowRequest, *, retry: bool
    ) -> WriteResult:
        response = self._on_shard(
            shard_id,
            "write",
            lambda stub: stub.WriteArrow(request, timeout=_CALL_TIMEOUT_S),
            retry=retry,
        )
        return WriteResult(response.offset, response.duplicate, response.rows)

    def stage(
        self, shard_id: int, write_id: str, part: str, chunk: int, rows: pa.Table | pa.RecordBatch
    ) -> int:
        """Keeps rows on the shard's replicas under (write id, part, chunk); returns their
        count. The leader must take them; the followers get copies at the same time, so
        that a leader elected before the publish has them too. A follower's copy is
        waited for as long again as the leader took, at least `STAGE_COPY_GRACE_S` unless
        a fault held a call on that node lately; one that a fault holds is left behind
        (a publish on that node would be refused)."""
        request = pb.StageArrowRequest(
            namespace=self.namespace,
            shard=shard_id,
            write_id=write_id,
            part=part,
            chunk=chunk,
            ipc=ipc_bytes(rows.select(ROWS_SCHEMA.names)),
        )
        started = time.monotonic()
        copies = {
            address: self._stub(address).StageArrow.future(request, timeout=_CALL_TIMEOUT_S)
            for address in self.shard(shard_id).followers
            if address
        }
        try:
            response = self._on_shard(
                shard_id,
                "stage rows",
                lambda stub: stub.StageArrow(request, timeout=_CALL_TIMEOUT_S),
            )
            waited = time.monotonic() - started
            now = time.monotonic()
            for address, copy in copies.items():
                # A node a fault held a call on lately gets no grace beyond the leader's time.
                grace = waited if _suspected(address, now) else max(waited, STAGE_COPY_GRACE_S)
                try:
                    copy.result(timeout=max(now + grace - time.monotonic(), 0.0))
                except grpc.FutureTimeoutError:
                    _suspects[address] = time.monotonic()  # left behind: not waited for again
                    continue
                except grpc.RpcError:
                    continue
                _suspects.pop(address, None)  # it answers again
        finally:
            for copy in copies.values():
                copy.cancel()
        return response.rows

    def discard(self, write_id: str, *, wait_s: float = 0.1) -> list[str]:
        """Drops what is staged under `write_id` on every node at once; returns the nodes
        that did not answer within `wait_s` of the first answer (they drop it after their
        staging TTL). After a publish, which dropped what it published, a node that a
        fault holds is not waited for; after a failure, give more time."""
        nodes = {a for s in self.shards(refresh=True) for a in (s.leader, *s.followers) if a}
        request = pb.DiscardStagedRequest(write_id=write_id)
        calls = {a: self._stub(a).DiscardStaged.future(request, timeout=10.0) for a in nodes}
        answers, _ = _first_answers(calls, wait_s)
        if answers:
            _suspect_unfinished(calls.items())
        return sorted(nodes - set(answers))


class _Retry(Exception):
    """Nothing answered usefully this round; `_retrying` tries again after a back-off."""


class _LeaderMoved(_Retry):
    """A call was given up on a leader whose successor is known: tried again at once."""
