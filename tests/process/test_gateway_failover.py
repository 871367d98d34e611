"""The official Oxia client in gateway mode rides out a paused shard leader.

Its node relays each call to the shard's leader (node/oxia/relay.py); the client sets
no deadline and never retries. When the leader is paused (SIGSTOP), the relayed call
must not wait on it for the whole pause: the coordinator elects a new leader within
its failure timeout (500 ms), the relaying node learns it, and a read is retried
there, while a write without exactly-once metadata fails at once with UNAVAILABLE
(its outcome unknown), which the application retries.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import oxia
import pytest

from cluster_harness import LocalCluster

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

MakeCluster = Callable[..., LocalCluster]

#: Failure timeout (0.5 s) + relay timeout (1.5 s) + 1 s, rounded up generously.
BOUND_S = 5.0
#: Longer than BOUND_S, so that a call that waits for the paused leader misses the bound.
PAUSE_S = 8.0


def retried(call: Any) -> tuple[Any, float, int]:
    """(result, seconds until it succeeded, failed attempts): the application's retry of
    UNAVAILABLE, which the official client leaves to it."""
    started, failures = time.monotonic(), 0
    while True:
        try:
            return call(), time.monotonic() - started, failures
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            failures += 1
            time.sleep(0.05)


def test_calls_through_a_gateway_complete_soon_after_the_leader_is_paused(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(nodes=3, shards=3, replication_factor=3)
    shard = 0
    leader = cluster.leader_of(shard)
    assert leader is not None
    gateway = next(node for node in cluster.nodes if node != leader)
    keys = (f"/k{i}" for i in itertools.count())
    before, during = itertools.islice((k for k in keys if cluster.shard_of(k) == shard), 2)
    client: oxia.Client = cluster.open_client(gateway)
    pool = ThreadPoolExecutor(2)
    try:
        client.put(before, b"before")  # the gateway's relay channel to the leader is open
        paused_at = cluster.pause(leader)
        try:
            put = pool.submit(retried, lambda: client.put(during, b"during"))
            get = pool.submit(retried, lambda: client.get(before))
            try:
                _, put_s, put_failures = put.result(PAUSE_S)
                (_, value, _), get_s, get_failures = get.result(PAUSE_S)
            except TimeoutError:
                pytest.fail(f"calls on shard {shard} waited on its paused leader > {PAUSE_S} s")
        finally:
            cluster.resume(leader)
        print(
            f"\nleader {leader} of shard {shard} paused; through {gateway}: put done after "
            f"{put_s:.2f} s ({put_failures} UNAVAILABLE), get after {get_s:.2f} s "
            f"({get_failures} UNAVAILABLE); paused {time.monotonic() - paused_at:.1f} s"
        )
        assert value == b"before"
        assert put_s < BOUND_S and get_s < BOUND_S
        cluster.wait_following(leader, shard)
        # Applied once: a failed attempt reached no leader that applied it.
        _, value, version = client.get(during)
        assert value == b"during" and version.modifications_count() == 0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        client.close()
