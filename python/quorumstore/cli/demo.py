"""`quorumstore demo`: the main job, from the installed package alone (see
quorumstore.spark.demo); it needs the `spark` extra and a JDK."""

from __future__ import annotations

import argparse
from pathlib import Path

from quorumstore.cli.errors import CliError

HELP = "run the main job: a cluster, a streaming query and a DataFrame read in local Spark"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-port", type=int, default=6648, help="node i listens on base+i")
    p.add_argument(
        "--work-dir",
        type=Path,
        help="data, checkpoints and input (default: a new temporary directory)",
    )


def run(args: argparse.Namespace) -> None:
    try:
        # Imported here: pyspark is an optional extra, and loads slowly.
        from quorumstore.spark import demo
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] in {"pyspark", "pandas"}:
            raise CliError(
                f"the demo runs on Spark and {e.name} is missing: pip install 'quorumstore[spark]'"
            ) from None
        raise
    demo.run(args.base_port, args.work_dir)
