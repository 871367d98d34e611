"""An outbox counts a shard's messages down only as its stream takes them past the yield,
and says so once per shard when none are left: a leader prepares and a follower applies
on that word (tests/unit/test_acks_in_transit.py runs it over real streams)."""

from __future__ import annotations

import asyncio

from quorumstore.node.outbox import Outbox
from quorumstore.protocol.messages import ShardKey

A: ShardKey = ("default", 0)
B: ShardKey = ("default", 1)


def test_a_shard_is_written_once_its_last_message_is_taken_past_the_yield() -> None:
    async def scenario() -> None:
        written: list[ShardKey] = []
        outbox: Outbox[str] = Outbox(written.append)
        for shard, message in ((A, "a1"), (B, "b1"), (A, "a2")):
            outbox.put(shard, message)
        outbox.close()
        messages = outbox.messages()

        assert await anext(messages) == "a1"  # yielded, not yet written
        assert outbox.unwritten(A) and outbox.unwritten(B)
        assert await anext(messages) == "b1"  # a1 written, a2 still queued
        assert outbox.unwritten(A) and written == []
        assert await anext(messages) == "a2"  # b1 written
        assert written == [B] and not outbox.unwritten(B)
        try:
            await anext(messages)  # a2 written; then the close ends the stream
        except StopAsyncIteration:
            pass
        else:
            raise AssertionError("messages went on after close")
        assert written == [B, A] and not outbox.unwritten(A)

    asyncio.run(scenario())


def test_dropping_an_ended_stream_writes_off_what_it_held_once() -> None:
    async def scenario() -> None:
        written: list[ShardKey] = []
        outbox: Outbox[str] = Outbox(written.append)
        outbox.put(A, "a1")
        outbox.put(A, "a2")
        outbox.put(B, "b1")
        messages = outbox.messages()
        assert await anext(messages) == "a1"

        outbox.drop()
        assert sorted(written) == [A, B]
        assert not outbox.unwritten(A) and not outbox.unwritten(B)

        # The stream is over: gRPC resuming the yielded message ends the messages, and
        # what is put later is lost with the stream, neither counted nor reported.
        outbox.put(A, "a3")
        assert not outbox.unwritten(A)
        try:
            await anext(messages)
        except StopAsyncIteration:
            pass
        else:
            raise AssertionError("a dropped outbox sent a message")
        assert sorted(written) == [A, B]

    asyncio.run(scenario())


def test_dropping_ends_a_stream_that_waits_for_a_message() -> None:
    async def scenario() -> None:
        outbox: Outbox[str] = Outbox(lambda shard: None)
        sent: list[str] = []

        async def stream() -> None:
            async for message in outbox.messages():
                sent.append(message)

        task = asyncio.get_running_loop().create_task(stream())
        await asyncio.sleep(0)  # the stream now waits on the empty outbox
        outbox.drop()
        await asyncio.wait_for(task, 5)
        assert sent == []

    asyncio.run(scenario())
