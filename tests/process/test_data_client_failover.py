"""The DataClient (the Spark data source's client) rides out a paused shard leader.

A call held by the paused leader is watched: once another node lists a leader elected
in a later term, the call is given up and sent there straight away, without reading
the routing table from every node again (one of which, the paused one, would not
answer). An exactly-once write so retried is applied once.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from cluster_harness import LocalCluster
from quorumstore.client.data_service import DataClient
from quorumstore.wire.metadata import ClientSerial

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

MakeCluster = Callable[..., LocalCluster]

#: Failure timeout (0.5 s) + election + the watch's checks, rounded up generously.
BOUND_S = 5.0
#: Longer than BOUND_S, so that a call that waits for the paused leader misses the bound.
PAUSE_S = 8.0


def _rows(keys: list[str], value: bytes) -> pa.Table:
    return pa.table({"key": keys, "value": [value] * len(keys)})


def test_a_write_held_by_a_paused_leader_goes_to_its_successor(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(nodes=3, shards=1, replication_factor=3)
    leader = cluster.leader_of(0)
    assert leader is not None
    keys = [f"/k{i}" for i in range(10)]
    with DataClient(",".join(cluster.nodes), retry_s=30) as client:
        client.write(0, _rows(keys, b"before"), origin=ClientSerial("failover", 0))
        assert client.shard(0).leader == leader
        term = client.shard(0).term
        listings = itertools.count()
        list_shards = DataClient._list_shards
        monkeypatch.setattr(
            DataClient, "_list_shards", lambda self: (next(listings), list_shards(self))[1]
        )
        cluster.pause(leader)
        try:
            started = time.monotonic()
            with ThreadPoolExecutor(1) as pool:
                write = pool.submit(
                    client.write, 0, _rows(keys, b"during"), origin=ClientSerial("failover", 1)
                )
                try:
                    result = write.result(PAUSE_S)
                except TimeoutError:
                    pytest.fail(f"the write waited on the paused leader {leader} > {PAUSE_S} s")
            took = time.monotonic() - started
            successor = client.shard(0)
        finally:
            cluster.resume(leader)
        print(f"\nleader {leader} paused; the write went to {successor.leader} in {took:.2f} s")
        assert took < BOUND_S
        assert successor.leader != leader and successor.term > term
        assert next(listings) == 0, "the routing table was read again, not the watch's"
        assert not result.duplicate
        again = client.write(0, _rows(keys, b"during"), origin=ClientSerial("failover", 1))
        assert again.duplicate, "the retried serial was applied twice"
        (batch, _), *_ = list(client.scan(0, keys=keys))
        assert batch.column("value").to_pylist() == [b"during"] * len(keys)
