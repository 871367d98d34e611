"""quorumstore.client.calls: an attempt waiting on a leader that stopped answering is
sent to the new leader as soon as the shard map names one."""

from __future__ import annotations

import asyncio
import time

from quorumstore.client.calls import ATTEMPT_TIMEOUT_S, ShardCaller
from quorumstore.client.discovery import Channels, Directory
from quorumstore.client.routing import ShardAssignment, ShardMap
from quorumstore.wire.hashing import HASH_SPACE


def one_shard_map(leader: str) -> ShardMap:
    return ShardMap([ShardAssignment(0, leader, 0, HASH_SPACE - 1)])


def test_an_attempt_on_a_silent_leader_moves_to_the_new_leader_of_the_map() -> None:
    async def scenario() -> tuple[str, float, list[str]]:
        directory = Directory(Channels(), ["old:1"], "default")
        directory._publish(one_shard_map("old:1"))  # the first map, as _follow publishes it
        caller = ShardCaller(directory, Channels(), request_timeout_s=30)
        tried: list[str] = []

        async def attempt(leader: str, timeout_s: float) -> str:
            tried.append(leader)
            if leader == "old:1":
                await asyncio.sleep(timeout_s)  # paused: no answer within the attempt
            return f"answered by {leader}"

        call = asyncio.ensure_future(caller.call(0, attempt, "write batch"))
        await asyncio.sleep(0.05)
        moved_at = time.monotonic()
        directory._publish(one_shard_map("new:1"))  # the coordinator's next map
        answer = await asyncio.wait_for(call, ATTEMPT_TIMEOUT_S / 2)
        return answer, time.monotonic() - moved_at, tried

    answer, took, tried = asyncio.run(scenario())
    assert answer == "answered by new:1"
    assert tried == ["old:1", "new:1"]
    assert took < 1.0
