"""Deterministic simulation with a client that proposes entries no replica can apply
(issue 49): payloads that are no write batch, keys that are not UTF-8, unknown ops,
damaged bytes, proposed straight to a leader's engine, below every check of the write
paths. The harness's invariants (equal state digests at equal offsets, acknowledged
writes committed, convergence after healing) must hold, and no node may stop."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from harness import SimConfig, Simulation

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.protocol.messages import ShardKey
from quorumstore.protocol.types import LogEntry, Role
from quorumstore.storage.write_batch import SCHEMA, TIMESTAMP_KEY, Op, WriteBatchBuilder

pytestmark = pytest.mark.simulation

SEEDS = int(os.environ.get("QS_SIM_POISON_SEEDS", "60"))


def _batch(rows: list[dict[str, object]], timestamp_ms: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, SCHEMA).replace_schema_metadata(
        {TIMESTAMP_KEY: str(timestamp_ms).encode()}
    )


class PoisonSimulation(Simulation):
    """A simulation whose client writes are, one in three, poison entries."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.poison_ids: set[int] = set()
        self.poison_acked = 0

    def acknowledge(self, shard: ShardKey, entry: LogEntry, write_id: int, term: int) -> None:
        super().acknowledge(shard, entry, write_id, term)
        self.poison_acked += write_id in self.poison_ids

    def _poison(self) -> bytes:
        rng, step = self.rng, self.step_no
        kind = rng.randrange(4)
        if kind == 0:
            return rng.randbytes(rng.randint(0, 40))
        if kind == 1:  # the reproduction of issue 49: a key that is not UTF-8
            batch = _batch([{"op": Op.PUT, "key": "k1", "value": b"v"}] * 2, step)
            key = pa.array([b"k2", b"\xff"], pa.binary()).view(pa.string())
            return ipc_bytes(batch.set_column(1, SCHEMA.field("key"), key))
        if kind == 2:
            rows = [{"op": Op.PUT, "key": "k3", "value": b"p"}, {"op": 77, "key": "k4"}]
            rows.append({"op": Op.CLOSE_SESSION, "key": ""})
            return ipc_bytes(_batch(rows, step))
        builder = WriteBatchBuilder()
        builder.add_put(f"k{rng.randrange(self.config.keys)}", b"m")
        damaged = bytearray(builder.build(step))
        damaged[rng.randrange(len(damaged))] ^= rng.randint(1, 255)
        return bytes(damaged)

    def _client_write(self) -> None:
        if self.rng.random() >= 1 / 3:
            super()._client_write()
            return
        shard = self.rng.choice(sorted(self.history))
        leaders = [
            n
            for n in self.nodes.values()
            if n.alive and shard in n.replicas and n.replicas[shard].role is Role.LEADER
        ]
        if not leaders:
            return
        self.writes += 1
        if self.rng.choice(leaders).propose(shard, self._poison(), self.writes):
            self.poison_ids.add(self.writes)


@pytest.mark.parametrize("replicas", [3, 5])
def test_poison_entries_neither_stop_nor_split_a_shard(replicas: int) -> None:
    acked = 0
    for seed in range(SEEDS):
        sim = PoisonSimulation(SimConfig(seed=5_000_000 + seed, replicas=replicas))
        sim.run()
        acked += sim.poison_acked
    assert acked > 0, "no poison entry was ever committed: the test checks nothing"
