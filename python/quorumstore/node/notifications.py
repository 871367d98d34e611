"""Oxia notifications served from a shard's change log.

Each entry that changed something becomes one `NotificationBatch`, tagged with the
entry's offset and timestamp, its changes keyed by key as Oxia sends them. A client
that reconnects with the last offset it saw gets exactly the entries after it: the
change log is replicated state, so a new leader serves the same offsets the old one
did, without gaps or repeats.
"""

from __future__ import annotations

import pyarrow as pa

from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.change_log import ChangeEvent


def notification_batch(
    shard: int, offset: int, timestamp_ms: int, changes: pa.RecordBatch
) -> pb.NotificationBatch:
    notifications: dict[str, pb.Notification] = {}
    columns = changes.to_pydict()
    for key, event, version_id, range_end in zip(
        columns["key"], columns["event"], columns["version_id"], columns["range_end"]
    ):
        notification = pb.Notification(type=event)
        if event in (ChangeEvent.KEY_CREATED, ChangeEvent.KEY_MODIFIED):
            notification.version_id = version_id
        elif event == ChangeEvent.KEY_RANGE_DELETED:
            notification.key_range_last = range_end or ""
        notifications[key] = notification
    return pb.NotificationBatch(
        shard=shard, offset=offset, timestamp=timestamp_ms, notifications=notifications
    )


def position_batch(shard: int, offset: int) -> pb.NotificationBatch:
    """An empty batch that tells a new subscriber where its stream starts.

    Oxia's server sends one when a client subscribes without an offset; quorumstore
    also sends one on a resumed stream with nothing new yet, because the official
    Python client waits for a first batch on every shard before it delivers anything.
    """
    return pb.NotificationBatch(shard=shard, offset=offset)
