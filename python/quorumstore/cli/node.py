"""`quorumstore node`: one storage node, as `cluster` starts it or as a machine of a
cluster spread over several runs it."""

from __future__ import annotations

import argparse
from pathlib import Path

from quorumstore import event_loops
from quorumstore.cli import options
from quorumstore.cli.serving import serve_until_signal

HELP = "one storage node"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=options.port, default=options.DEFAULT_CLIENT_PORT)
    p.add_argument(
        "--internal-port",
        type=options.port,
        default=options.DEFAULT_INTERNAL_PORT,
        help="port of node control and replication, which only the cluster's members call "
        f"(default {options.DEFAULT_INTERNAL_PORT}; the coordinator's --internal-addresses names it)",
    )
    options.add_secret_file_flag(p)
    options.add_tls_flags(p, internal=True)
    options.add_auth_flag(p)
    options.add_advertise_host_flag(p)
    p.add_argument("--no-fsync", action="store_true")
    options.add_storage_flags(p)
    options.add_limit_flags(p)
    options.add_archive_flags(p)


def run(args: argparse.Namespace) -> None:
    event_loops.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    from quorumstore.node.node import Node

    config = options.node_config(args, Path(args.data_dir).resolve(), options.cluster_secret(args))
    node = Node(config)
    address = await node.start()
    print(
        f"quorumstore node listening on {address} (internal port at {node.internal_address})",
        flush=True,
    )
    try:
        await serve_until_signal(node.wait())
    finally:
        await node.stop()
