"""gRPC floor: what one Python gRPC exchange costs on this machine, with no quorumstore code.

    python bench/grpc_floor_bench.py [--calls 3000]

An in-process grpc.aio server echoes 100-byte messages, and one client times, one call
after another: a unary call, the same with the two metadata entries quorumstore's client
sends on every write (`qs-client-id`, `qs-serial`), and a round trip on one long-lived
bidirectional stream (how replication's Appends and Acks travel). It prints wall time and
CPU time (client and server together) per exchange. These set the floor under every
replicated write: a client's batch is one unary call, and each follower adds a stream
round trip, so they tell how much of `replication_bench.py`'s latency is gRPC itself.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from grpc import aio

PAYLOAD = b"x" * 100
WARM_UP_CALLS = 200


async def _echo(request: bytes, context: aio.ServicerContext) -> bytes:
    return request


async def _echo_stream(
    requests: AsyncIterator[bytes], context: aio.ServicerContext
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


async def _timed(calls: int, exchange: Callable[[int], Awaitable[object]]) -> tuple[float, float]:
    """(wall µs, CPU µs) per exchange, over `calls` sequential ones."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(calls):
        await exchange(i)
    return (
        (time.perf_counter() - wall) / calls * 1e6,
        (time.process_time() - cpu) / calls * 1e6,
    )


async def run(calls: int) -> dict[str, tuple[float, float]]:
    server = aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "floor.Echo",
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(_echo),
                    "Stream": grpc.stream_stream_rpc_method_handler(_echo_stream),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary("/floor.Echo/Unary")
            for _ in range(WARM_UP_CALLS):
                await unary(PAYLOAD)
            results = {
                "unary call": await _timed(calls, lambda i: unary(PAYLOAD)),
                "unary call + 2 metadata entries": await _timed(
                    calls,
                    lambda i: unary(
                        PAYLOAD, metadata=(("qs-client-id", "bench"), ("qs-serial", str(i)))
                    ),
                ),
            }
            stream = channel.stream_stream("/floor.Echo/Stream")()

            async def round_trip(i: int) -> object:
                await stream.write(PAYLOAD)
                return await stream.read()

            results["bidirectional stream round trip"] = await _timed(calls, round_trip)
            await stream.done_writing()
            return results
    finally:
        await server.stop(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="exchanges timed per kind")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error(f"--calls must be positive, got {args.calls}")
    results = asyncio.run(run(args.calls))
    print(
        f"grpc.aio {grpc.__version__}, in-process server and client, 100-byte messages, "
        f"{args.calls} sequential exchanges each"
    )
    print(f"  {'exchange':<34}{'wall per exchange':>20}{'CPU per exchange':>20}")
    for name, (wall_us, cpu_us) in results.items():
        print(f"  {name:<34}{wall_us:>17,.0f} µs{cpu_us:>17,.0f} µs")
    ratio = results["unary call"][1] / results["bidirectional stream round trip"][1]
    print(f"a unary call costs {ratio:.1f}x the CPU of a round trip on an open stream")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
