"""quorumstore's client: ephemeral records, sequence keys and secondary indexes.

One `quorumstore standalone` with three shards serves the module; each test works
under a key prefix of its own. Expected results come from the test's own model of
what it wrote (hierarchical order from `compare_keys`), not from the client.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from cluster_harness import STANDALONE_SHARDS, poll_until
from quorumstore import AsyncClient, Client
from quorumstore.client import (
    INDEX_SCAN_SCHEMA,
    ComparisonType,
    InvalidRequest,
    KeyNotFound,
    PutResult,
)
from quorumstore.client.sessions import SESSION_CLOSE_TIMEOUT_S
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto.oxia_client_pb2_grpc import OxiaClientStub
from quorumstore.testing import standalone_server
from quorumstore.wire.keys import compare_keys

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

SHARDS = STANDALONE_SHARDS  # the `address` fixture's server
SESSION_TIMEOUT_MS = 2_000

hierarchical_key = functools.cmp_to_key(compare_keys)


def keys_on_every_shard(client: Client, prefix: str, per_shard: int = 2) -> list[str]:
    """Keys under `prefix`, `per_shard` of them routed to each shard."""
    by_shard: dict[int, list[str]] = {shard: [] for shard in range(SHARDS)}
    for i in range(10_000):
        key = f"{prefix}/k{i}"
        shard_keys = by_shard[client.shard_for(key)]
        if len(shard_keys) < per_shard:
            shard_keys.append(key)
        if all(len(keys) == per_shard for keys in by_shard.values()):
            return [key for keys in by_shard.values() for key in keys]
    raise AssertionError("10,000 keys did not cover every shard")


def exists(client: Client, key: str, partition_key: str | None = None) -> bool:
    try:
        client.get(key, partition_key=partition_key)
    except KeyNotFound:
        return False
    return True


# ------------------------------------------------------------------ ephemeral records


def test_ephemeral_records_live_while_keep_alives_flow_and_go_when_the_client_closes(
    address: str, prefix: str
) -> None:
    with Client(address) as observer:
        keys = keys_on_every_shard(observer, prefix)
        owner = Client(address, session_timeout_ms=SESSION_TIMEOUT_MS, client_identifier="owner-1")
        versions = [owner.put(key, b"mine", ephemeral=True) for key in keys]
        owner.put(f"{prefix}/durable", b"stays")
        assert all(v.is_ephemeral and v.client_identity == "owner-1" for v in versions)
        # One session per shard, shared by the shard's ephemeral puts.
        by_shard = {(observer.shard_for(k), v.session_id) for k, v in zip(keys, versions)}
        assert len(by_shard) == SHARDS

        time.sleep(2.5 * SESSION_TIMEOUT_MS / 1000)  # keep-alives hold the sessions open
        for key, version in zip(keys, versions):
            _, value, seen = observer.get(key)
            assert value == b"mine" and seen.session_id == version.session_id

        owner.close()  # closes the sessions: their records are deleted with them
        assert not any(exists(observer, key) for key in keys)
        assert observer.get(f"{prefix}/durable").value == b"stays"


_DOOMED_OWNER = """
import sys, time
from quorumstore import Client
client = Client(sys.argv[1], session_timeout_ms=int(sys.argv[3]))
client.put(sys.argv[2], b"orphan", ephemeral=True)
print("ready", flush=True)
time.sleep(600)
"""


def test_ephemeral_record_of_a_killed_client_vanishes_after_its_session_timeout(
    address: str, prefix: str
) -> None:
    key = f"{prefix}/orphan"
    owner = subprocess.Popen(
        [sys.executable, "-c", _DOOMED_OWNER, address, key, str(SESSION_TIMEOUT_MS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        with Client(address) as observer:
            owner.kill()  # kill -9: no close, no more keep-alives
            owner.wait(10)
            assert observer.get(key).value == b"orphan"
            killed = time.monotonic()
            poll_until(lambda: not exists(observer, key), 20, "the session's expiry")
            waited = time.monotonic() - killed
            # Its last keep-alive was at most a tenth of the timeout before the kill.
            assert waited > 0.8 * SESSION_TIMEOUT_MS / 1000, waited
    finally:
        owner.kill()
        owner.wait(10)


def end_session_behind_the_clients_back(address: str, shard: int, session_id: int) -> None:
    """What the shard does when a session expires."""
    with grpc.insecure_channel(address) as channel:
        OxiaClientStub(channel).CloseSession(
            pb.CloseSessionRequest(shard=shard, session_id=session_id), timeout=10
        )


def test_an_ephemeral_put_that_meets_a_lost_session_is_put_again_under_a_new_one(
    address: str, prefix: str
) -> None:
    first_key, second_key = f"{prefix}/a", f"{prefix}/b"
    # A long timeout: no keep-alive (every 6 s) notices the loss before the put does.
    with Client(address, session_timeout_ms=60_000) as owner:
        first = owner.put(first_key, b"1", ephemeral=True)
        assert first.session_id is not None
        end_session_behind_the_clients_back(address, owner.shard_for(first_key), first.session_id)
        assert not exists(owner, first_key)

        # Same shard (partition key): the put fails on the lost session, then succeeds.
        second = owner.put(second_key, b"2", ephemeral=True, partition_key=first_key)
        assert second.session_id is not None and second.session_id != first.session_id
        assert owner.get(second_key, partition_key=first_key).version == second


def test_a_keep_alive_that_finds_its_session_gone_reports_it_and_the_next_put_opens_another(
    address: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"{prefix}/k"
    caplog.set_level(logging.WARNING, logger="quorumstore.client.sessions")
    with Client(address, session_timeout_ms=SESSION_TIMEOUT_MS) as owner:
        first = owner.put(key, b"1", ephemeral=True)
        assert first.session_id is not None
        end_session_behind_the_clients_back(address, owner.shard_for(key), first.session_id)
        poll_until(lambda: f"session {first.session_id} of shard" in caplog.text, 10, "the report")
        assert "its ephemeral records were deleted" in caplog.text
        second = owner.put(key, b"2", ephemeral=True)
        assert second.session_id != first.session_id
        time.sleep(1.5 * SESSION_TIMEOUT_MS / 1000)  # the new session is kept alive
        assert owner.get(key).version == second


# ------------------------------------------------------------------ sequence keys


def test_sequence_keys_are_assigned_in_order_and_updates_follow_the_highest(
    address: str, prefix: str
) -> None:
    seq, partition = f"{prefix}/seq", f"{prefix}-p"

    async def concurrent_puts() -> list[PutResult]:
        async with AsyncClient(address) as client:
            return await asyncio.gather(
                *(client.put_sequence(seq, f"v{i}", partition_key=partition) for i in range(50))
            )

    results = asyncio.run(concurrent_puts())
    assigned = sorted(r.key for r in results)
    assert assigned == [f"{seq}-{n:020d}" for n in range(1, 51)]

    with Client(address) as client:
        # The value each put stored is under the key it was told.
        for result in results[:5]:
            found = client.get(result.key, partition_key=partition)
            assert found.version.version_id == result.version.version_id
        two = client.put_sequence(seq, b"x", partition_key=partition, sequence_keys_deltas=[5])
        assert two.key == f"{seq}-{55:020d}"
        multi = f"{prefix}/multi"
        keys = [
            client.put_sequence(multi, b"m", partition_key=partition, sequence_keys_deltas=deltas)
            for deltas in ([1, 10], [1, 0], [2, 3])
        ]
        assert [k.key for k in keys] == [
            f"{multi}-{1:020d}-{10:020d}",
            f"{multi}-{2:020d}-{10:020d}",
            f"{multi}-{4:020d}-{13:020d}",
        ]

        with client.sequence_updates(seq, partition_key=partition) as updates:
            assert next(updates) == two.key  # the current highest first
            last = [client.put_sequence(seq, b"y", partition_key=partition) for _ in range(5)][-1]
            seen = []
            while not seen or seen[-1] != last.key:
                seen.append(next(updates))
            assert seen == sorted(set(seen)) and len(seen) <= 5  # increasing, newest last


# ------------------------------------------------------------------ secondary indexes


def test_secondary_indexes_find_records_across_shards(address: str, prefix: str) -> None:
    colors = ["red", "green", "blue", "teal/dark"]  # "teal/dark" sorts after the others
    records = {f"{prefix}/r{i:02d}": (colors[i % 4], f"{i:03d}") for i in range(40)}
    index = f"color-{prefix[2:]}"  # index names are per namespace: one of this test's own
    rank = f"rank-{prefix[2:]}"
    with Client(address) as client:
        for key, (color, number) in records.items():
            client.put(key, number, secondary_indexes={index: color, rank: [number, f"n/{number}"]})
        assert len({client.shard_for(k) for k in records}) == SHARDS  # 40 keys: ~1e-7 to fail

        def keys_of(color: str) -> list[str]:
            return sorted((k for k, (c, _) in records.items() if c == color), key=hierarchical_key)

        assert client.list("blue", "red", use_index=index) == sorted(
            keys_of("blue") + keys_of("green"), key=hierarchical_key
        )
        in_order = [
            (r.key, r.value) for r in client.range_scan("", "", use_index=index)
        ]  # by secondary key, then primary key
        ordered_colors = sorted(colors, key=hierarchical_key)
        assert in_order == [(k, records[k][1].encode()) for c in ordered_colors for k in keys_of(c)]
        # The bulk scan through the index: one Arrow table in the same order, every
        # shard's rows from one snapshot, with the secondary key each was found by.
        table = client.scan("", "", use_index=index)
        assert table.schema == INDEX_SCAN_SCHEMA
        assert list(zip(table["key"].to_pylist(), table["value"].to_pylist())) == in_order
        assert table["secondary_key"].to_pylist() == [c for c in ordered_colors for _ in keys_of(c)]
        # Secondary keys ["006", "009") of the rank index.
        assert client.scan("006", "009", use_index=rank)["key"].to_pylist() == [
            f"{prefix}/r{i:02d}" for i in (6, 7, 8)
        ]
        assert client.scan("a", "b", use_index=index).num_rows == 0
        # Several secondary keys per index: each is an entry of its own.
        assert client.list("005", "007", use_index=rank) == [f"{prefix}/r05", f"{prefix}/r06"]
        assert client.list("n/", "n/~", use_index=rank) == sorted(records, key=hierarchical_key)

        assert client.get("green", use_index=index).key == keys_of("green")[0]
        assert (
            client.get("a", use_index=index, comparison=ComparisonType.CEILING).key
            == (keys_of("blue")[0])
        )
        assert (
            client.get("green", use_index=index, comparison=ComparisonType.HIGHER).key
            == (keys_of("red")[0])
        )
        assert (
            client.get("green", use_index=index, comparison=ComparisonType.LOWER).key
            == (keys_of("blue")[-1])
        )
        assert (
            client.get("zebra", use_index=index, comparison=ComparisonType.FLOOR).key
            == (
                keys_of("red")[-1]  # "teal/dark" is deeper, so it sorts after "zebra"
            )
        )
        with pytest.raises(KeyNotFound):
            client.get("purple", use_index=index)

        # A put replaces the record's entries; a delete removes them.
        moved = keys_of("red")[0]
        client.put(moved, b"now blue", secondary_indexes={index: "blue"})
        client.delete(keys_of("green")[0])
        assert moved in client.list("blue", "blue~", use_index=index)
        assert moved not in client.list("red", "red~", use_index=index)
        assert len(client.list("green", "green~", use_index=index)) == len(keys_of("green")) - 1


# ------------------------------------------------------------------ bad input


def test_bad_sessions_sequences_and_indexes_fail_clearly_before_anything_is_sent(
    address: str, prefix: str
) -> None:
    for timeout_ms in (1_999, 300_001):
        with pytest.raises(ValueError, match="session_timeout_ms"):
            Client(address, session_timeout_ms=timeout_ms)
    with pytest.raises(InvalidRequest, match="client_identifier"):
        Client(address, client_identifier="")
    with Client(address) as client:
        key = f"{prefix}/bad"
        with pytest.raises(InvalidRequest, match="empty"):
            client.put_sequence(key, b"v", partition_key="p", sequence_keys_deltas=[])
        with pytest.raises(InvalidRequest, match="first sequence key delta is 0"):
            client.put_sequence(key, b"v", partition_key="p", sequence_keys_deltas=[0, 1])
        with pytest.raises(InvalidRequest, match="must be 0 to"):
            client.put_sequence(key, b"v", partition_key="p", sequence_keys_deltas=[1, -1])
        with pytest.raises(TypeError, match="delta must be an int"):
            client.put_sequence(key, b"v", partition_key="p", sequence_keys_deltas=[True])
        with pytest.raises(TypeError, match="partition_key"):
            client.put_sequence(key, b"v", partition_key=None)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="secondary index name"):
            client.put(key, b"v", secondary_indexes={"": "x"})
        with pytest.raises(InvalidRequest, match="secondary key of index 'i'"):
            client.put(key, b"v", secondary_indexes={"i": ["ok", ""]})
        with pytest.raises(TypeError, match="secondary_indexes must map"):
            client.put(key, b"v", secondary_indexes=[("i", "x")])  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="use_index"):
            client.list("", "", use_index="")
        with pytest.raises(InvalidRequest, match="use_index"):
            client.scan("", "", use_index="")
        with pytest.raises(InvalidRequest, match="prefix_key"):
            client.sequence_updates("", partition_key="p")
        # The server's own checks, for what the client cannot know: a sequence
        # continued with fewer deltas than its keys carry numbers.
        client.put_sequence(key, b"v", partition_key="p", sequence_keys_deltas=[1, 1])
        with pytest.raises(InvalidRequest, match="needs at least 2 deltas"):
            client.put_sequence(key, b"v", partition_key="p")
        assert not exists(client, f"{key}-{2:020d}", partition_key="p")


def test_closing_a_client_whose_cluster_is_gone_does_not_wait_out_the_request_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A script that ends after its cluster went away must not hang in `close` for
    `request_timeout_s` (30 s) retrying session closes nobody can answer: each is tried
    for at most SESSION_CLOSE_TIMEOUT_S, and the log says the records go at expiry."""
    with standalone_server(tmp_path / "gone", shards=SHARDS, fsync=False) as gone:
        client = Client(gone, session_timeout_ms=20_000)
        for key in keys_on_every_shard(client, "/gone/"):
            client.put(key, b"e", ephemeral=True)
    # The server has stopped; every shard holds a session of this client.
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="quorumstore.client.sessions"):
        client.close()
    took = time.monotonic() - started
    assert took < SESSION_CLOSE_TIMEOUT_S + 3, f"close took {took:.1f} s"
    assert caplog.text.count("could not close session") == SHARDS, caplog.text
    assert "deleted when it expires" in caplog.text
