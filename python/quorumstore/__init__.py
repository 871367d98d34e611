"""quorumstore: a Spark-native, quorum-replicated key-value state store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
