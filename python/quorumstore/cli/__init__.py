"""The `quorumstore` command: run a standalone server, a local cluster, or ask for status.

    quorumstore standalone --shards 4
    quorumstore cluster --nodes 3 --shards 8 --replication-factor 3 --data-dir ./qs
    quorumstore status --coordinator 127.0.0.1:6651
    quorumstore restore --archive-url s3://bucket/qs --data-dir ./restored --at 2026-05-01T12:00Z
    quorumstore export-delta --archive-url s3://bucket/qs --table ./qs-delta
    quorumstore demo                # the main job, in local Spark (needs the spark extra)

`node` and `coordinator` run the two halves on their own (what `cluster` starts).

Each command is a module of this package with a `HELP` line, `add_arguments` and `run`;
`COMMANDS` lists them in the order of the help. This module builds the parser from them
and turns what a command raises into the exit status. Nothing in the library imports the
command line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Protocol

from quorumstore import __version__
from quorumstore.cli import (
    cluster,
    coordinator,
    demo,
    export_delta,
    node,
    restore,
    standalone,
    status,
    supervisor,
)
from quorumstore.cli.errors import CliError
from quorumstore.coordinator.metadata_store import MetadataError
from quorumstore.node.data_format import DataFormatError
from quorumstore.node.failures import ReplicaFailure
from quorumstore.storage.wal_format import WalError
from quorumstore.wire.auth import SecretError
from quorumstore.wire.tls import TlsError


class Command(Protocol):
    """What a command module provides."""

    HELP: str

    def add_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> None: ...


#: The subcommands, by name.
COMMANDS: dict[str, Command] = {
    "standalone": standalone,
    "cluster": cluster,
    "node": node,
    "coordinator": coordinator,
    "status": status,
    "restore": restore,
    "export-delta": export_delta,
    "demo": demo,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command's flags, with --log-level before or after the command."""
    parser = argparse.ArgumentParser(
        prog="quorumstore", description="A quorum-replicated KV store with Oxia's client protocol."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    levels = ["DEBUG", "INFO", "WARNING", "ERROR"]
    parser.add_argument(
        "--log-level", default=os.environ.get("QUORUMSTORE_LOG_LEVEL", "WARNING"), choices=levels
    )
    # Accepted after the command too (`quorumstore standalone --log-level INFO`); there it
    # has no default, so it overrides the one before the command only when given.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=levels)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP, parents=[common]))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns 2 for a mistake reported in one line, 1 for a failed
    replica, 130 for Ctrl-C."""
    supervisor.follow_parent()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        COMMANDS[args.command].run(args)
    except (CliError, DataFormatError, MetadataError, SecretError, TlsError, WalError) as e:
        print(f"quorumstore: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"quorumstore: error: {e}", file=sys.stderr)
        return 2
    except ReplicaFailure as e:
        print(f"quorumstore: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
