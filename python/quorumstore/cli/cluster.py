"""`quorumstore cluster`: a coordinator and N `node` processes on this machine, started
and restarted by the supervisor, with their data and logs in one directory."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from quorumstore.cli import options, supervisor
from quorumstore.cli.errors import CliError
from quorumstore.cli.restore import restore_on_start
from quorumstore.cli.status import fetch_status
from quorumstore.coordinator.cluster_status import all_replicas_serving, format_status
from quorumstore.proto import replication_pb2 as pb
from quorumstore.wire.addresses import host_port
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.tls import TlsConfig

HELP = "a coordinator and N node processes on this machine, each restarted when it stops"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=options.positive, default=3)
    p.add_argument("--shards", type=options.positive, default=1)
    p.add_argument("--replication-factor", type=options.positive, default=3)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--base-port",
        type=options.port,
        default=options.DEFAULT_CLIENT_PORT,
        help="nodes listen on base, base+1, ...; the coordinator after them",
    )
    p.add_argument(
        "--internal-port",
        type=options.port,
        default=0,
        help="nodes' internal ports (node control, replication) are this, this+1, ... "
        "(default: right after the coordinator's port)",
    )
    p.add_argument("--no-fsync", action="store_true")
    options.add_storage_flags(p)
    options.add_limit_flags(p)
    options.add_tls_flags(p, internal=True)
    options.add_auth_flag(p)
    options.add_failure_timeout_flag(p)
    options.add_archive_flags(p)


def run(args: argparse.Namespace) -> None:
    if args.replication_factor > args.nodes:
        raise CliError(
            f"--replication-factor {args.replication_factor} needs at least that many --nodes, got {args.nodes}"
        )
    if args.base_port + args.nodes > 65535:
        raise CliError(
            f"--base-port {args.base_port} leaves no room for {args.nodes} nodes and the "
            f"coordinator (ports up to {args.base_port + args.nodes}); use at most {65535 - args.nodes}"
        )
    internal_base = args.internal_port or args.base_port + args.nodes + 1
    if internal_base + args.nodes - 1 > 65535:
        raise CliError(
            f"the nodes' internal ports would run up to {internal_base + args.nodes - 1}; "
            "give a lower --internal-port or --base-port"
        )
    data_dir = Path(args.data_dir).resolve()
    options.check_layout(data_dir, mine="node0", other="node", other_command="standalone")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot use {data_dir} as the data directory: {e.strerror}") from None
    restore_on_start(args.archive_url, data_dir)
    nodes = [host_port(args.host, args.base_port + i) for i in range(args.nodes)]
    internal = [host_port(args.host, internal_base + i) for i in range(args.nodes)]
    admin = host_port(args.host, args.base_port + args.nodes)
    for i in range(args.nodes):
        _check_port_free(args.host, args.base_port + i, f"node {i}")
        _check_port_free(args.host, internal_base + i, f"node {i}'s internal port")
    _check_port_free(args.host, args.base_port + args.nodes, "the coordinator's status port")
    # A new secret each run, in a file only this user reads: children find it by path,
    # since a command line is visible to every local user.
    secret_file = data_dir / options.CLUSTER_SECRET_FILE
    ClusterSecret.generate().write_file(secret_file)
    secret = ["--cluster-secret-file", str(secret_file)]
    fsync = ["--no-fsync"] if args.no_fsync else []
    fsync += options.storage_flags(args)
    fsync += options.limit_flags(args)
    fsync += options.archive_flags(args)
    commands = [
        (
            ["node", "--host", args.host, "--port", str(args.base_port + i),
             "--internal-port", str(internal_base + i), *secret,
             "--data-dir", str(data_dir / f"node{i}"), *fsync,
             *options.security_flags(args, with_auth=True)],
            data_dir / f"node{i}.log",
        )
        for i in range(args.nodes)
    ]  # fmt: skip
    commands.append(
        (
            ["coordinator", "--nodes", ",".join(nodes), "--internal-addresses", ",".join(internal),
             *secret, "--shards", str(args.shards),
             "--replication-factor", str(args.replication_factor),
             "--metadata", str(data_dir / "coordinator" / "metadata.pb"),
             "--host", args.host, "--admin-port", str(args.base_port + args.nodes),
             "--failure-timeout-ms", str(args.failure_timeout_ms),
             *options.archive_flags(args, nodes=False),
             *options.security_flags(args, with_auth=False)],
            data_dir / "coordinator.log",
        )
    )  # fmt: skip
    children: list[supervisor.Child] = []
    supervisor.stop_on_signals()
    try:
        for argv, log_file in commands:
            children.append(supervisor.Child(argv, log_file))
        status = _wait_for_cluster(admin, children, options.tls_config(args), timeout_s=60)
        shards = len(status.metadata.shards)
        print(
            f"quorumstore cluster: {args.nodes} nodes, {shards} shards, replication factor {args.replication_factor}",
            flush=True,
        )
        if shards != args.shards:
            print(
                f"  (the data directory holds {shards} shards; shard counts are fixed when it is created)",
                flush=True,
            )
        print(f"client address: {nodes[0]}   (all nodes: {', '.join(nodes)})", flush=True)
        print(f"coordinator:    {admin}   (quorumstore status --coordinator {admin})", flush=True)
        print(f"data and logs:  {data_dir}", flush=True)
        print(format_status(status), flush=True)
        print("Ctrl-C stops the cluster.", flush=True)
        supervisor.watch(children)
    except supervisor.Stopped:
        pass
    finally:
        supervisor.stop(children)
        print("cluster stopped", flush=True)


def _check_port_free(host: str, port: int, what: str) -> None:
    from quorumstore.wire.channels import probe_port

    try:
        probe_port(host, port)
    except OSError as e:
        raise CliError(
            f"cannot listen on {host_port(host, port)} for {what}: {e.strerror}; is another cluster "
            "still running there? Stop it or pick another --base-port"
        ) from None


def _wait_for_cluster(
    admin: str, children: list[supervisor.Child], tls: TlsConfig | None, timeout_s: float
) -> pb.ClusterStatus:
    """The cluster's status once every replica serves, so the client address printed
    next works at once."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while time.monotonic() < deadline:
        supervisor.check_started(children)
        try:
            status = fetch_status(admin, timeout=1, tls=tls)
            if all_replicas_serving(status):
                return status
        except CliError as e:
            last_error = str(e)
        time.sleep(0.2)
    raise CliError(
        f"the cluster did not come online within {timeout_s:.0f} s ({last_error or 'shards still electing'})"
    )
