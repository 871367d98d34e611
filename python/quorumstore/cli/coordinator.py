"""`quorumstore coordinator`: the coordinator of a set of nodes, as `cluster` starts it
or as an operator runs it beside nodes on other machines."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from quorumstore import event_loops
from quorumstore.cli import options
from quorumstore.cli.errors import CliError
from quorumstore.cli.serving import serve_until_signal
from quorumstore.wire.metadata import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from quorumstore.coordinator.server import CoordinatorServer

HELP = "the coordinator of a set of nodes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nodes",
        type=lambda v: [options.address(a) for a in v.split(",")],
        required=True,
        help="comma-separated host:port: the nodes' client addresses, which name them",
    )
    p.add_argument(
        "--internal-addresses",
        type=lambda v: [options.address(a) for a in v.split(",")],
        required=True,
        help="comma-separated host:port: each node's internal address (its --internal-port), "
        "in the order of --nodes",
    )
    options.add_secret_file_flag(p)
    options.add_tls_flags(p, internal=True)
    p.add_argument("--shards", type=options.positive, default=1)
    p.add_argument("--replication-factor", type=options.positive, default=3)
    p.add_argument(
        "--metadata", required=True, help="path or fsspec URL of the coordinator's metadata"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--admin-port", type=options.port, default=0)
    options.add_failure_timeout_flag(p)
    options.add_archive_flags(p, nodes=False)


def run(args: argparse.Namespace) -> None:
    event_loops.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig

    if args.replication_factor > len(args.nodes):
        raise CliError(
            f"--replication-factor {args.replication_factor} needs at least that many --nodes, got {len(args.nodes)}"
        )
    if len(args.internal_addresses) != len(args.nodes):
        raise CliError(
            f"--internal-addresses names {len(args.internal_addresses)} addresses for "
            f"{len(args.nodes)} --nodes; give one per node, in the same order"
        )
    try:
        config = CoordinatorServerConfig(
            nodes=args.nodes,
            metadata_url=args.metadata,
            internal_addresses=dict(zip(args.nodes, args.internal_addresses, strict=True)),
            cluster_secret=options.cluster_secret(args),
            internal_tls=options.tls_config(args, "internal-tls"),
            tls=options.tls_config(args),
            namespaces={DEFAULT_NAMESPACE: args.shards},
            replication_factor=args.replication_factor,
            admin_host=args.host,
            admin_port=args.admin_port,
            failure_timeout_ms=args.failure_timeout_ms,
            archive_url=args.archive_url,
        )
    except ValueError as e:
        raise CliError(str(e)) from None
    coordinator = CoordinatorServer(config)
    await coordinator.start()
    print(f"quorumstore coordinator admin on {coordinator.admin_address}", flush=True)
    try:
        await serve_until_signal(_deposed(coordinator))
    finally:
        await coordinator.stop()


async def _deposed(coordinator: CoordinatorServer) -> None:
    """Raises once another coordinator took this one's metadata location."""
    await coordinator.ended.wait()
    raise CliError(str(coordinator.deposed))
