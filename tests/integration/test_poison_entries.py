"""A committed entry that no replica can apply, proposed below every check of the write
paths (straight to the leader's engine, as a buggy or older leader would have), is
applied as an error result on leader and follower alike, and both go on serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from leader_and_follower import leader_and_follower
from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.storage.results import Status
from quorumstore.storage.write_batch import SCHEMA, TIMESTAMP_KEY, Op, WriteBatchBuilder

pytestmark = pytest.mark.integration

SHARD = ("default", 0)
_NOW = b"1700000000000"


def _not_utf8_key() -> bytes:
    """The reproduction of issue 49: a put whose key is the byte 0xff."""
    batch = pa.RecordBatch.from_pylist([{"op": Op.PUT, "key": "k", "value": b"v"}], SCHEMA)
    key = pa.array([b"\xff"], pa.binary()).view(pa.string())
    batch = batch.set_column(1, SCHEMA.field("key"), key)
    return ipc_bytes(batch.replace_schema_metadata({TIMESTAMP_KEY: _NOW}))


def _put(key: str) -> bytes:
    batch = WriteBatchBuilder()
    batch.add_put(key, b"v")
    return batch.build(int(_NOW))


async def _scenario(data_dir: Path) -> None:
    async with leader_and_follower(data_dir, SHARD) as (leader, follower):
        host = leader.hosts[SHARD]
        poisoned = await asyncio.wait_for(host.write(_not_utf8_key()), 10)
        assert [r.status for r in poisoned.results] == [Status.INVALID_OP]
        assert poisoned.invalid == "op 0 cannot be applied: key is not valid UTF-8"
        garbage = await asyncio.wait_for(host.write(b"no write batch"), 10)
        assert garbage.results == [] and "not an Arrow IPC stream" in (garbage.invalid or "")
        after = await asyncio.wait_for(host.write(_put("/after")), 10)
        assert [r.status for r in after.results] == [Status.OK]
        # The follower applies the same entries to the same state, and lives.
        following = follower.hosts[SHARD].machine
        for _ in range(500):
            if following.applied_position == host.machine.applied_position:
                break
            await asyncio.sleep(0.01)
        assert following.applied_position == host.machine.applied_position
        assert following.applied_position.offset == after.offset
        assert following.state_digest() == host.machine.state_digest()
        assert following.get("/after") is not None


def test_a_committed_entry_no_replica_can_apply_is_an_error_result(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))
