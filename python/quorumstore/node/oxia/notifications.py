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

Every subscriber of a shard follows the same entries, so `NotificationCache` builds
each recent entry's batches once for all of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow import binary
from quorumstore.arrow.protobuf_columns import length_delimited_field, varint_field
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.change_log import ChangeEvent
from quorumstore.storage.reads import ShardReader, byte_bounded_runs

_NOTIFICATIONS = pb.NotificationBatch.NOTIFICATIONS_FIELD_NUMBER
_MAP_KEY, _MAP_VALUE = 1, 2  # a map's entries are messages of key = 1, value = 2
_TYPE = pb.Notification.TYPE_FIELD_NUMBER
_VERSION_ID = pb.Notification.VERSION_ID_FIELD_NUMBER
_KEY_RANGE_LAST = pb.Notification.KEY_RANGE_LAST_FIELD_NUMBER

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
    """The batch, its notifications encoded column by column (`protobuf_columns`): built
    one by one in Python they cost ~4 µs each, ~100 ms for a 25,000-key entry, all of it
    on the node's event loop."""
    events = changes.column("event").to_numpy(zero_copy_only=False)
    versioned = (events == ChangeEvent.KEY_CREATED) | (events == ChangeEvent.KEY_MODIFIED)
    ranged = events == ChangeEvent.KEY_RANGE_DELETED
    nothing = pa.scalar(b"", pa.binary())
    version_ids = changes.column("version_id").fill_null(0).to_numpy(zero_copy_only=False)
    notification = pc.binary_join_element_wise(
        # Type is an enum with implicit presence: its default (KEY_CREATED) is not sent.
        pc.if_else(events != ChangeEvent.KEY_CREATED, varint_field(_TYPE, events), nothing),
        pc.if_else(versioned, varint_field(_VERSION_ID, version_ids), nothing),
        pc.if_else(
            ranged,
            length_delimited_field(_KEY_RANGE_LAST, changes.column("range_end").fill_null("")),
            nothing,
        ),
        nothing,
    )
    map_entry = pc.binary_join_element_wise(
        length_delimited_field(_MAP_KEY, changes.column("key")),
        length_delimited_field(_MAP_VALUE, notification),
        nothing,
    )
    header = pb.NotificationBatch(shard=shard, offset=offset, timestamp=timestamp_ms)
    return pb.NotificationBatch.FromString(
        header.SerializeToString()
        + binary.concatenated(length_delimited_field(_NOTIFICATIONS, map_entry))
    )


#: The cache of one shard keeps its latest entries' batches up to this many bytes ...
CACHE_BYTES = 4 << 20
#: ... and at most this many entries.
CACHE_ENTRIES = 4096


class NotificationCache:
    """The notification batches of a shard's latest entries, built once for every
    subscriber that follows them.

    Building an entry's batches (reading its change-log record, encoding each
    notification) costs far more than sending them, so subscribers share them rather
    than each building its own (`bench/notifications_bench.py` measures the cost).

    The cache holds every entry with changes in (`_after`, `_through`], oldest first,
    up to `max_bytes` of batches. A subscriber behind `_after` reads from the change
    log as before until it reaches the cache; one past `_through` starts it afresh.
    An entry whose notifications need more than one batch (a bulk write) is kept as
    its offset alone and read again for each subscriber, a batch at a time, so that
    the cache never holds it whole. Committed entries never change, so what is cached
    stays true for as long as the shard replica it was read from.
    """

    def __init__(self, shard: int, max_bytes: int = CACHE_BYTES) -> None:
        self._shard = shard
        self._max_bytes = max_bytes
        #: (offset, its batches or None for a large entry, their size in bytes)
        self._entries: deque[tuple[int, tuple[pb.NotificationBatch, ...] | None, int]] = deque()
        self._bytes = 0
        self._after = self._through = -1

    def batches(
        self, reader: ShardReader, last: int, applied: int
    ) -> Iterator[pb.NotificationBatch]:
        """The batches of the entries in (`last`, `applied`], in order."""
        while last < applied:
            if last > self._through:
                self._entries.clear()
                self._bytes = 0
                self._after = self._through = last
            if last >= self._after and applied > self._through:
                self._extend(reader, applied)  # may move `_after` past `last`
            if last >= self._after:
                yield from self._kept(reader, last, applied)
                return
            stop = min(applied, self._after)
            yield from self._read(reader, last, stop)
            last = stop

    def _kept(self, reader: ShardReader, last: int, applied: int) -> Iterator[pb.NotificationBatch]:
        """The batches of the kept entries in (`last`, `applied`]; a large entry's read again."""
        for offset, batches in self._entries_in(last, applied):
            if batches is None:
                yield from self._read(reader, offset - 1, offset)
            else:
                yield from batches

    def _entries_in(
        self, last: int, applied: int
    ) -> list[tuple[int, tuple[pb.NotificationBatch, ...] | None]]:
        """The kept entries in (`last`, `applied`], found from the newest end: a
        subscriber that keeps up needs only the last few. Chosen before any is yielded,
        as other subscribers change the cache meanwhile."""
        chosen = []
        for offset, batches, _ in reversed(self._entries):
            if offset <= last:
                break
            if offset <= applied:
                chosen.append((offset, batches))
        chosen.reverse()
        return chosen

    def _read(self, reader: ShardReader, last: int, stop: int) -> Iterator[pb.NotificationBatch]:
        for offset, timestamp_ms, changes in reader.read_changes(last, stop):
            yield from notification_batches(self._shard, offset, timestamp_ms, changes)

    def _extend(self, reader: ShardReader, applied: int) -> None:
        # `_through` follows each entry kept, so that an error part way (a failed read)
        # leaves the cache consistent: the next extension starts after the last one kept.
        for offset, timestamp_ms, changes in reader.read_changes(self._through, applied):
            kept: tuple[pb.NotificationBatch, ...] | None = None
            if changes.num_rows <= BATCH_NOTIFICATIONS:
                batches = tuple(notification_batches(self._shard, offset, timestamp_ms, changes))
                if len(batches) == 1:
                    kept = batches
            size = 0 if kept is None else kept[0].ByteSize()
            self._entries.append((offset, kept, size))
            self._bytes += size
            self._through = offset
        self._through = applied
        while self._bytes > self._max_bytes or len(self._entries) > CACHE_ENTRIES:
            offset, _, size = self._entries.popleft()
            self._bytes -= size
            self._after = offset


def position_batch(shard: int, offset: int) -> pb.NotificationBatch:
    """An empty batch that tells a new subscriber where its stream starts.

    Oxia's server sends one when a client subscribes without an offset; quorumstore
    also sends one on a resumed stream with nothing new yet, because the official
    Python client waits for a first batch on every shard before it delivers anything.
    """
    return pb.NotificationBatch(shard=shard, offset=offset)
