"""WriteCoalescer: which concurrent Oxia writes share an entry, and when entries go out."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from quorumstore.node.oxia.write_coalescer import WriteCoalescer
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.results import EntryResult, OpResult, Status


def _put(*keys: str) -> pb.WriteRequest:
    return pb.WriteRequest(shard=0, puts=[pb.PutRequest(key=k, value=b"v") for k in keys])


def _prepared(request: pb.WriteRequest) -> str:
    """Stands for what the leader prepares when it checks a write (its plain puts)."""
    return "+".join(p.key for p in request.puts)


def _write(coalescer: WriteCoalescer[str], request: pb.WriteRequest) -> asyncio.Future[EntryResult]:
    return asyncio.ensure_future(coalescer.write(request, _prepared(request)))


class Replicator:
    """Records each entry (its requests' keys) and completes it when told to."""

    def __init__(self) -> None:
        self.entries: list[list[list[str]]] = []
        self._done: list[asyncio.Event] = []

    async def __call__(
        self, requests: Sequence[pb.WriteRequest], prepared: Sequence[str]
    ) -> EntryResult:
        # What each write was prepared with comes back beside it, in the same order.
        assert list(prepared) == [_prepared(r) for r in requests]
        self.entries.append([[p.key for p in r.puts] for r in requests])
        done = asyncio.Event()
        self._done.append(done)
        await done.wait()
        ops = sum(len(r.puts) for r in requests)
        return EntryResult(len(self.entries) - 1, [OpResult(Status.OK)] * ops)

    def complete(self, index: int) -> None:
        self._done[index].set()


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_lone_write_goes_at_once_and_later_ones_share_the_next_entry() -> None:
    async def scenario() -> None:
        replicate = Replicator()
        coalescer = WriteCoalescer(replicate, max_inflight=2, max_ops=100)
        first = _write(coalescer, _put("a"))
        await _turns()
        assert replicate.entries == [[["a"]]]
        # A partial entry is in flight: these wait for it, then go as one entry.
        rest = [_write(coalescer, _put(k)) for k in "bcd"]
        await _turns()
        assert len(replicate.entries) == 1
        replicate.complete(0)
        await _turns()
        assert replicate.entries[1] == [["b"], ["c"], ["d"]]
        assert (await first).offset == 0
        replicate.complete(1)
        results = await asyncio.gather(*rest)
        assert [r.offset for r in results] == [1, 1, 1]
        assert all(len(r.results) == 1 for r in results)  # each caller gets its own slice

    asyncio.run(scenario())


def test_full_entries_overlap_the_partial_one_up_to_max_inflight() -> None:
    async def scenario() -> None:
        replicate = Replicator()
        coalescer = WriteCoalescer(replicate, max_inflight=2, max_ops=4)
        writes = [_write(coalescer, _put("p"))]
        await _turns()
        assert len(replicate.entries) == 1  # partial, in flight
        writes += [_write(coalescer, _put(f"k{i}", f"l{i}")) for i in range(5)]
        await _turns()
        # 4 ops fill an entry: one full entry joins the partial one; the rest waits.
        assert replicate.entries[1] == [["k0", "l0"], ["k1", "l1"]]
        assert len(replicate.entries) == 2
        replicate.complete(1)
        await _turns()
        assert replicate.entries[2] == [["k2", "l2"], ["k3", "l3"]]  # full again
        assert len(replicate.entries) == 3
        replicate.complete(0)
        replicate.complete(2)
        await _turns()
        assert replicate.entries[3] == [["k4", "l4"]]
        replicate.complete(3)
        await asyncio.gather(*writes)

    asyncio.run(scenario())


def test_writes_naming_a_key_already_in_the_entry_go_in_a_later_one_in_order() -> None:
    async def scenario() -> None:
        replicate = Replicator()
        coalescer = WriteCoalescer(replicate, max_inflight=2, max_ops=100)
        writes = [_write(coalescer, _put(k)) for k in ("x", "y", "x", "z")]
        await _turns()
        assert replicate.entries == [[["x"], ["y"]]]  # cut before the second "x": not full
        replicate.complete(0)
        await _turns()
        assert replicate.entries[1] == [["x"], ["z"]]
        replicate.complete(1)
        await asyncio.gather(*writes)

    asyncio.run(scenario())
