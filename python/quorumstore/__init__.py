"""quorumstore: a Spark-native, quorum-replicated key-value state store."""

__version__ = "0.1.0"

from quorumstore.client import Client, AsyncClient
