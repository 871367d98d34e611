"""quorumstore's own client: typed, batching, exactly-once, following leader changes.

`AsyncClient` is the asyncio client; `Client` is its blocking face for code
without an event loop. Both speak Oxia's client protocol to any quorumstore node.
See docs/client.md for a guide with examples.
"""

from quorumstore.client.arrow import INDEX_SCAN_SCHEMA, SCAN_SCHEMA, PutManyData
from quorumstore.client.async_client import AsyncClient
from quorumstore.client.errors import (
    ClientClosed,
    InvalidRequest,
    KeyNotFound,
    NamespaceNotFound,
    NotSupported,
    PermissionDenied,
    QuorumStoreError,
    ServiceUnavailable,
    SessionDoesNotExist,
    Unauthenticated,
    UnexpectedVersionId,
)
from quorumstore.client.notifications import Notification, NotificationType, Subscription
from quorumstore.client.sequences import SequenceSubscription
from quorumstore.client.sync_client import Client, Notifications, SequenceUpdates
from quorumstore.client.types import (
    EXPECTED_RECORD_DOES_NOT_EXIST,
    ComparisonType,
    PutResult,
    Record,
    Version,
)
from quorumstore.wire.tls import TlsConfig

__all__ = [
    "EXPECTED_RECORD_DOES_NOT_EXIST",
    "INDEX_SCAN_SCHEMA",
    "SCAN_SCHEMA",
    "AsyncClient",
    "Client",
    "ClientClosed",
    "ComparisonType",
    "InvalidRequest",
    "KeyNotFound",
    "NamespaceNotFound",
    "NotSupported",
    "Notification",
    "NotificationType",
    "Notifications",
    "PermissionDenied",
    "PutManyData",
    "PutResult",
    "QuorumStoreError",
    "Record",
    "SequenceSubscription",
    "SequenceUpdates",
    "ServiceUnavailable",
    "SessionDoesNotExist",
    "Subscription",
    "TlsConfig",
    "Unauthenticated",
    "UnexpectedVersionId",
    "Version",
]
