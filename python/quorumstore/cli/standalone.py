"""`quorumstore standalone`: a node and its coordinator in one process, one replica per
shard, with its data in one directory."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from quorumstore import event_loops
from quorumstore.cli import options
from quorumstore.cli.errors import CliError
from quorumstore.cli.restore import restore_on_start
from quorumstore.cli.serving import serve_until_signal
from quorumstore.coordinator.metadata_store import MetadataStore, take_archived
from quorumstore.wire.metadata import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from quorumstore.coordinator.server import CoordinatorServer

HELP = "one process, one replica per shard"

#: The command line's logger: its lines name the command line, not the module.
log = logging.getLogger("quorumstore.cli")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", type=options.positive, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--port",
        type=options.port,
        default=options.DEFAULT_CLIENT_PORT,
        help="client port (Oxia's default: 6648)",
    )
    p.add_argument(
        "--admin-port",
        type=options.port,
        default=0,
        help="coordinator status port (default: any free port)",
    )
    p.add_argument(
        "--internal-port",
        type=options.port,
        default=0,
        help="port of node control and replication, which only this process calls with a "
        "secret it makes at start (default: any free port)",
    )
    options.add_advertise_host_flag(p)
    options.add_tls_flags(p, internal=False)
    options.add_auth_flag(p)
    p.add_argument("--data-dir", default="quorumstore-data", help="default: ./quorumstore-data")
    p.add_argument(
        "--no-fsync",
        action="store_true",
        help="do not fsync the WAL (faster, loses recent writes on power loss)",
    )
    options.add_storage_flags(p)
    options.add_limit_flags(p)
    options.add_archive_flags(p)


def run(args: argparse.Namespace) -> None:
    event_loops.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
    from quorumstore.node.node import Node
    from quorumstore.wire.auth import ClusterSecret

    data_dir = Path(args.data_dir).resolve()
    options.check_layout(data_dir, mine="node", other="node0", other_command="cluster")
    await asyncio.get_running_loop().run_in_executor(
        None, restore_on_start, args.archive_url, data_dir
    )
    # The secret never leaves this process: the node and its coordinator share it in memory.
    secret = ClusterSecret.generate()
    node = Node(options.node_config(args, data_dir / "node", secret))
    address = await node.start()
    coordinator: CoordinatorServer | None = None
    try:
        metadata_url = str(data_dir / "coordinator" / "metadata.pb")
        await asyncio.get_running_loop().run_in_executor(
            None, _adopt_standalone_shards, metadata_url, address, args.archive_url
        )
        coordinator = CoordinatorServer(
            CoordinatorServerConfig(
                nodes=[address],
                metadata_url=metadata_url,
                internal_addresses={address: node.internal_address},
                cluster_secret=secret,
                namespaces={DEFAULT_NAMESPACE: args.shards},
                replication_factor=1,
                admin_host=args.host,
                admin_port=args.admin_port,
                tls=options.tls_config(args),
                archive_url=args.archive_url,
            )
        )
        await coordinator.start()
        shards = await _wait_until_online(coordinator, 30)
        print(f"quorumstore standalone listening on {address}", flush=True)
        print(
            f"  internal port (node control, replication; this process only): {node.internal_address}",
            flush=True,
        )
        print(
            f"  shards: {shards}, data: {data_dir}, status: quorumstore status --coordinator {coordinator.admin_address}",
            flush=True,
        )
        await serve_until_signal(node.wait())
    finally:
        if coordinator is not None:
            await coordinator.stop()
        await node.stop()


def _adopt_standalone_shards(metadata_url: str, address: str, archive_url: str | None) -> None:
    """A standalone server's node is its data directory, not its port: restarted on
    another port (`--port 0` picks a new one each time), it takes over the shards that
    the directory's metadata (or its archived copy, when lost) placed on the old address."""
    from quorumstore.archive.store import ArchiveStore
    from quorumstore.protocol.coordinator import placed_nodes, replace_node

    store = MetadataStore(metadata_url)
    metadata = store.load()
    if metadata is None and archive_url is not None:
        metadata = take_archived(store, ArchiveStore(archive_url))
    if metadata is None:
        return
    placed = placed_nodes(metadata)
    if placed == {address}:
        return
    if len(placed) != 1:
        raise CliError(
            f"{metadata_url} describes a cluster of {len(placed)} nodes ({', '.join(sorted(placed))}), "
            "not a standalone server; run it with `quorumstore cluster` or give standalone another --data-dir"
        )
    (old,) = placed
    store.save(replace_node(metadata, old, address))
    log.info("standalone data from %s now served at %s", old, address)


async def _wait_until_online(coordinator: CoordinatorServer, timeout_s: float) -> int:
    """Waits until every shard has a leader; returns how many shards there are."""
    from quorumstore.protocol.coordinator import ShardState

    assert coordinator.engine is not None, "the coordinator is not started"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = coordinator.engine.metadata
        if all(m.state is ShardState.ONLINE for m in meta.shards.values()):
            return len(meta.shards)
        await asyncio.sleep(0.05)
    raise CliError(f"shards did not all elect a leader within {timeout_s:.0f} s; see the log above")
