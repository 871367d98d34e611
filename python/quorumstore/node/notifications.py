"""Oxia notifications served from a shard's change log.

Each entry that changed something becomes a `NotificationBatch`, tagged with the
entry's offset and timestamp, its changes keyed by key as Oxia sends them. A client
that reconnects with the last offset it saw gets exactly the entries after it: the
change log is replicated state, so a new leader serves the same offsets the old one
did, without gaps or repeats.

An entry can change a million keys (a DataFrame write), far more than one message to
a gRPC client may hold (4 MiB by default, the official Oxia clients' limit too). Its
notifications then go in several batches, and all but the last carry the offset
before the entry's: a client whose stream breaks between them resumes before the
entry and receives all of it again (at least once), instead of resuming after it and
missing the rest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.change_log import ChangeEvent
from quorumstore.storage.state_machine import byte_bounded_runs

#: At most this many bytes of keys and range ends go in one batch ...
BATCH_KEY_BYTES = 1 << 20
#: ... and at most this many notifications (each costs ~20 bytes beside its key), so
#: a batch stays well under 4 MiB.
BATCH_NOTIFICATIONS = 32_768


def notification_batches(
    shard: int, offset: int, timestamp_ms: int, changes: pa.RecordBatch
) -> Iterator[pb.NotificationBatch]:
    """The batches of the entry at `offset` whose changes are `changes`."""
    runs = [
        (start, min(start + BATCH_NOTIFICATIONS, stop))
        for first, stop in byte_bounded_runs(
            changes.column("key"), changes.column("range_end"), BATCH_KEY_BYTES
        )
        for start in range(first, stop, BATCH_NOTIFICATIONS)
    ]
    for i, (start, stop) in enumerate(runs):
        yield _batch(
            shard,
            offset if i == len(runs) - 1 else offset - 1,
            timestamp_ms,
            changes.slice(start, stop - start),
        )


def _batch(
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
