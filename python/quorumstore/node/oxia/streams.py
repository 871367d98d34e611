"""Streams of a shard's changes: notifications and sequence updates.

Both follow the shard's leader here: they wake when the shard signals a change
(`ShardHostApi.changes`) and end with a not-leader error once this node stops leading.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator

import grpc

from quorumstore.node.oxia.errors import RequestError
from quorumstore.node.oxia.notifications import NotificationCache, position_batch
from quorumstore.node.oxia.routing import Router, ShardHostApi
from quorumstore.proto import oxia_client_pb2 as pb

#: Notification and sequence-update streams wake when the shard signals a change
#: (`ShardHostApi.changes`), and look anyway after this long without one ...
DEFAULT_STREAM_RECHECK_INTERVAL_S = 1.0
#: ... but no sooner than this after their last look, so that under a stream of small
#: writes each wake-up serves several entries rather than one.
STREAM_MIN_INTERVAL_S = 0.002


class ChangeStreams:
    """The change streams of the shards led here, and their shared notification caches."""

    def __init__(self, router: Router, recheck_interval_s: float) -> None:
        self._router = router
        self._recheck_interval_s = recheck_interval_s
        self._notification_caches: weakref.WeakKeyDictionary[ShardHostApi, NotificationCache] = (
            weakref.WeakKeyDictionary()
        )

    async def sequence_updates(
        self, request: pb.GetSequenceUpdatesRequest
    ) -> AsyncGenerator[pb.GetSequenceUpdatesResponse, None]:
        """The last key assigned under the prefix now (if any), then each newer one.

        Keys assigned in quick succession may be collapsed into the latest, as in Oxia.
        """
        last_sent: str | None = None
        seen_offset: int | None = None
        while True:
            host = self._router.leader_host(request.shard)
            changed = host.changes()
            reader = host.reader()
            offset = reader.applied_position.offset
            if offset != seen_offset:
                seen_offset = offset
                latest = reader.latest_sequence_key(request.key)
                if latest is not None and latest != last_sent:
                    yield pb.GetSequenceUpdatesResponse(highest_sequence_key=latest)
                    last_sent = latest
            await self._next_look(changed)

    async def notifications(
        self, host: ShardHostApi, shard: int, start: int | None
    ) -> AsyncGenerator[pb.NotificationBatch, None]:
        """The batches of each entry after `start` (one, unless the entry is large: see
        `notifications`), from the shard's change log.

        Without an offset the stream starts at the last applied entry, announced by an
        empty batch at that offset (as Oxia does). A resumed stream with nothing new
        yet also starts with an empty batch at its offset (see `position_batch`).
        """
        reader = host.reader()
        if start is None:
            start = reader.applied_position.offset
            yield position_batch(shard, start)
            announced = True
        else:
            kept_after = reader.changes_kept_after()
            if start < kept_after:
                raise RequestError(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"the changes of shard {shard} up to offset {kept_after} are past their "
                    f"retention; resume from offset {kept_after} or later, or subscribe "
                    "without an offset",
                )
            announced = False
        last = start
        while True:
            host = self._router.leader_host(shard)
            changed = host.changes()
            reader = host.reader()
            applied = reader.applied_position.offset
            if applied > last:
                cache = self._notification_caches.get(host)
                if cache is None:
                    cache = self._notification_caches[host] = NotificationCache(shard)
                for batch in cache.batches(reader, last, applied):
                    yield batch
                    announced = True
                last = applied
            if not announced:
                yield position_batch(shard, start)
                announced = True
            await self._next_look(changed)

    async def _next_look(self, changed: asyncio.Event) -> None:
        """Waits until a stream looks at its shard again: `STREAM_MIN_INTERVAL_S` from now
        at the soonest, once `changed` is set or the recheck interval has passed."""
        await asyncio.sleep(STREAM_MIN_INTERVAL_S)
        if not changed.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._recheck_interval_s):
                    await changed.wait()
