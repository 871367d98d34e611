"""The shared notification cache serves every subscriber exactly the batches it would
have built alone from the change log, whatever the subscribers' positions, the cache's
size and the entries' sizes; and subscribers that follow the same entries share one
build of them."""

from __future__ import annotations

import random

import pytest
from test_change_log import Log

from quorumstore.node.oxia import notifications as notifications_module
from quorumstore.node.oxia.notifications import NotificationCache, notification_batches
from quorumstore.storage.memory_kv import MemoryKv
from quorumstore.storage.write_batch import WriteBatchBuilder

SHARD = 3


class Shard(Log):
    """A replica's state machine fed one write batch per entry, in memory."""

    def __init__(self) -> None:
        super().__init__(MemoryKv())

    @property
    def applied(self) -> int:
        return self.head.offset

    def apply_large_entry(self) -> None:
        """Notifications of over 1 MiB of keys: more than one batch."""
        builder = WriteBatchBuilder()
        for i in range(270):
            builder.add_put(f"big/{i:04d}/" + "k" * 4000, b"v")
        self.apply(builder)

    def apply_random_entry(self, rng: random.Random) -> None:
        kind = rng.random()
        if kind < 0.02:
            self.apply_large_entry()
            return
        builder = WriteBatchBuilder()
        if kind < 0.1:  # changes nothing, so the change log has no record of it
            builder.add_delete("absent")
        else:
            for _ in range(rng.randint(1, 40)):
                key = f"key/{rng.randrange(200):03d}"
                if rng.random() < 0.2:
                    builder.add_delete(key)
                else:
                    builder.add_put(key, b"value")
            if rng.random() < 0.1:
                builder.add_delete_range("key/1", "key/2")
        self.apply(builder)


def built_alone(shard: Shard, last: int, applied: int) -> list[bytes]:
    return [
        batch.SerializeToString()
        for offset, timestamp_ms, changes in shard.sm.read_changes(last, applied)
        for batch in notification_batches(SHARD, offset, timestamp_ms, changes)
    ]


@pytest.mark.parametrize("max_bytes", [1 << 20, 3_000, 1])
@pytest.mark.parametrize("seed", range(5))
def test_every_subscriber_gets_what_it_would_have_built_alone(max_bytes: int, seed: int) -> None:
    rng = random.Random(seed)
    shard = Shard()
    cache = NotificationCache(SHARD, max_bytes)
    shard.apply_large_entry()
    subscribers = [-1] * 4
    for _ in range(80):
        for _ in range(rng.choice([0, 1, 1, 2, 5])):
            shard.apply_random_entry(rng)
        i = rng.randrange(len(subscribers))
        if rng.random() < 0.05:  # resumes from an earlier offset, or starts at the present
            subscribers[i] = rng.choice([rng.randint(-1, shard.applied), shard.applied])
        last = subscribers[i]
        # It read the applied offset a moment ago, or now.
        applied = rng.choice([shard.applied, rng.randint(last, shard.applied)])
        served = [b.SerializeToString() for b in cache.batches(shard.sm, last, applied)]
        assert served == built_alone(shard, last, applied), (seed, last, applied)
        subscribers[i] = applied


def test_subscribers_following_the_same_entries_share_one_build() -> None:
    shard = Shard()
    cache = NotificationCache(SHARD)
    for i in range(5):
        builder = WriteBatchBuilder()
        builder.add_put(f"key/{i}", b"value")
        shard.apply(builder)
    first = list(cache.batches(shard.sm, -1, shard.applied))
    second = list(cache.batches(shard.sm, -1, shard.applied))
    assert len(first) == 5
    assert all(a is b for a, b in zip(first, second, strict=True))
    # A subscriber that lagged past what the cache keeps still gets everything.
    small = NotificationCache(SHARD, max_bytes=1)
    list(small.batches(shard.sm, 2, shard.applied))
    lagging = [b.SerializeToString() for b in small.batches(shard.sm, -1, shard.applied)]
    assert lagging == built_alone(shard, -1, shard.applied)


def test_a_large_entry_is_built_per_subscriber_and_never_held() -> None:
    shard = Shard()
    shard.apply_large_entry()
    cache = NotificationCache(SHARD)
    first = list(cache.batches(shard.sm, -1, shard.applied))
    second = list(cache.batches(shard.sm, -1, shard.applied))
    assert len(first) == 2
    assert [b.SerializeToString() for b in first] == [b.SerializeToString() for b in second]
    assert not any(a is b for a, b in zip(first, second, strict=True))


def test_a_subscriber_ahead_of_the_cache_does_not_make_it_read_the_entries_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard = Shard()
    rng = random.Random(0)
    cache = NotificationCache(SHARD)
    for _ in range(50):
        shard.apply_random_entry(rng)
    list(cache.batches(shard.sm, -1, 5))
    for _ in range(50):
        shard.apply_random_entry(rng)
    windows: list[tuple[int, int]] = []
    read_changes = shard.sm.read_changes

    def recorded(start: int, end: int):  # type: ignore[no-untyped-def]
        windows.append((start, end))
        return read_changes(start, end)

    monkeypatch.setattr(shard.sm, "read_changes", recorded)
    resumed_at = shard.applied - 3
    served = [b.SerializeToString() for b in cache.batches(shard.sm, resumed_at, shard.applied)]
    assert windows == [(resumed_at, shard.applied)]
    assert served == built_alone(shard, resumed_at, shard.applied)


def test_an_error_while_extending_leaves_the_cache_consistent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard = Shard()
    for i in range(6):
        builder = WriteBatchBuilder()
        builder.add_put(f"key/{i}", b"value")
        shard.apply(builder)
    cache = NotificationCache(SHARD)
    built = iter(range(100))

    def fails_at_the_fourth(*args):  # type: ignore[no-untyped-def]
        if next(built) == 3:
            raise OSError("the test failed this read")
        return notification_batches(*args)

    monkeypatch.setattr(notifications_module, "notification_batches", fails_at_the_fourth)
    with pytest.raises(OSError):
        list(cache.batches(shard.sm, -1, shard.applied))
    served = [b.SerializeToString() for b in cache.batches(shard.sm, -1, shard.applied)]
    assert served == built_alone(shard, -1, shard.applied)
