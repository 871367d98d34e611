"""`quorumstore export-delta`: the state at an archived point (a time, offsets, or the last
archived entries: `restore`'s `--at`) written as a new version of a Delta Lake table."""

from __future__ import annotations

import argparse
from pathlib import Path

from quorumstore.archive.manifest import ArchiveError
from quorumstore.archive.store import ArchiveStore
from quorumstore.cli import restore
from quorumstore.cli.errors import CliError

HELP = "write the state at an archived point as a new version of a Delta Lake table"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--archive-url", required=True, help="the archive's path or fsspec URL")
    p.add_argument(
        "--table",
        required=True,
        help="the Delta table's path or URL: created by the first export, overwritten by "
        "each later one (one Delta version per export)",
    )
    p.add_argument(
        "--at",
        type=restore.restore_point,
        default=(None, {}),
        help="as restore's --at: an ISO 8601 time, or shard=offset,...; default: the last "
        "archived entries",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_storage_option,
        help="an option of deltalake's object store for the table (e.g. AWS_REGION=eu-west-1); "
        "repeat for more",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        help="where to rebuild the shards before writing them, which takes the size of the "
        "whole state (default: the system's temporary directory)",
    )


def _storage_option(value: str) -> tuple[str, str]:
    key, sep, option = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, option


def run(args: argparse.Namespace) -> None:
    try:
        # Imported here: deltalake is in the optional `spark` extra.
        from quorumstore.archive.delta_export import export_delta
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == "deltalake":
            raise CliError(
                "export-delta writes with deltalake, which is missing: "
                "pip install 'quorumstore[spark]'"
            ) from None
        raise
    time_ms, offsets = args.at
    table = args.table if "://" in args.table else str(Path(args.table).resolve())
    try:
        store = ArchiveStore(args.archive_url)
        done = export_delta(
            store,
            table,
            time_ms=time_ms,
            offsets=offsets,
            storage_options=dict(args.storage_option) or None,
            work_dir=args.work_dir,
            progress=_say,
        )
    except ArchiveError as e:
        raise CliError(str(e)) from None
    _say(
        f"wrote {done.rows} records of {len(done.offsets)} shards as version {done.version} "
        f"of the Delta table at {table}"
    )


def _say(line: str) -> None:
    print(f"export-delta: {line}", flush=True)
