"""quorumstore: a Spark-native, quorum-replicated key-value state store."""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

# Before anything imports grpc, which reads this once. With gRPC's fork handlers on
# (grpcio's default on Linux), a child forked while gRPC is in use can abort before it
# execs: grpcio 1.81 and later restart their epoll poller in the child, which then fails
# on a closed descriptor (grpc/grpc#43055): 75 of 300 children forked while a client
# wrote did (tests/process/test_forked_children.py). PySpark launches its JVM that way,
# so a SparkSession created after a client could fail with JAVA_GATEWAY_EXITED. gRPC
# Python supports gRPC in a forked child only when this is true, which a user may still
# set before importing quorumstore. Imported after grpc, it is too late, and says so.
if "GRPC_ENABLE_FORK_SUPPORT" not in os.environ and "grpc" in sys.modules:
    warnings.warn(
        "grpc was imported before quorumstore, so gRPC's fork handlers stay on: a process "
        "forked after a client ran (PySpark's JVM launch) can abort, seen as "
        "JAVA_GATEWAY_EXITED. Import quorumstore first, or set GRPC_ENABLE_FORK_SUPPORT "
        "in the environment (false, or true to keep the handlers and this risk)",
        RuntimeWarning,
        stacklevel=2,
    )
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
__all__ = ["AsyncClient", "Client"]

if TYPE_CHECKING:
    from quorumstore.client import AsyncClient, Client


def __getattr__(name: str) -> Any:
    # The clients (and pyarrow under them) load on first use, so that commands that do
    # not need them (`quorumstore status`, `--help`) start at once.
    if name in __all__:
        from quorumstore import client

        return getattr(client, name)
    raise AttributeError(f"module 'quorumstore' has no attribute {name!r}")
