"""`quorumstore status`: asks a coordinator's status port for the cluster's status and
prints it as a table; `cluster` asks the same way while it waits for its children."""

from __future__ import annotations

import argparse

import grpc

from quorumstore.cli import options
from quorumstore.cli.errors import CliError
from quorumstore.coordinator.cluster_status import format_status
from quorumstore.proto import replication_pb2 as pb
from quorumstore.proto import replication_pb2_grpc as pb_grpc
from quorumstore.wire.tls import TlsConfig, open_channel

HELP = "per shard: term, leader, offsets, follower lag, eligible set"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--coordinator", type=options.address, required=True, help="the coordinator's host:port"
    )
    options.add_tls_flags(p, internal=False)


def run(args: argparse.Namespace) -> None:
    print(format_status(fetch_status(args.coordinator, tls=options.tls_config(args))))


def fetch_status(
    address: str, timeout: float = 5, tls: TlsConfig | None = None
) -> pb.ClusterStatus:
    """The coordinator's ClusterStatus (over TLS with `tls`); a CliError that says why
    when there is none."""
    with open_channel(address, [], tls) as channel:
        try:
            return pb_grpc.CoordinatorAdminStub(channel).GetClusterStatus(
                pb.Empty(), timeout=timeout
            )
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise CliError(
                    f"{address} answers gRPC but is no coordinator's status port (a node's "
                    "client port?); `quorumstore cluster` and `standalone` print the status port"
                ) from None
            raise CliError(
                f"cannot reach the coordinator at {address}: {e.code().name.lower()} ({e.details()})"
            ) from None
