"""Notification batches encoded column by column equal the ones protobuf builds item by
item, for any mix of events, keys and versions; and the varints underneath equal
protobuf's own for every size class, negatives included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumstore.arrow.protobuf_columns import varints
from quorumstore.node.oxia.notifications import notification_batches
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.change_log import CHANGES_SCHEMA, ChangeEvent
from quorumstore.storage.write_batch import Op

INT64 = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(INT64 | st.sampled_from([0, 127, 128, 2**14 - 1, 2**14, 2**63 - 1, -1])))
def test_varints_are_protobufs(values: list[int]) -> None:
    encoded = varints(np.array(values, np.int64)).to_pylist()
    # A Notification's version_id is an optional int64 (sent even when 0): tag, varint.
    assert encoded == [pb.Notification(version_id=v).SerializeToString()[1:] for v in values]


_CHANGE = st.tuples(
    st.text(max_size=12),  # keys: empty, unicode, NUL and '/' included
    st.sampled_from(list(ChangeEvent)),
    st.integers(0, 2**63 - 1),
    st.text(max_size=12),
)


def _expected(shard: int, offset: int, timestamp_ms: int, changes: list) -> pb.NotificationBatch:
    """What protobuf builds item by item: the encoding before column encoding existed."""
    batch = pb.NotificationBatch(shard=shard, offset=offset, timestamp=timestamp_ms)
    for key, event, version_id, range_end in changes:
        notification = batch.notifications[key]
        notification.Clear()  # a later change of the same key replaces an earlier one
        notification.type = event
        if event in (ChangeEvent.KEY_CREATED, ChangeEvent.KEY_MODIFIED):
            notification.version_id = version_id
        elif event == ChangeEvent.KEY_RANGE_DELETED:
            notification.key_range_last = range_end
    return batch


@settings(max_examples=300)
@given(
    st.lists(_CHANGE, min_size=1, max_size=40),
    st.integers(0, 2**31),
    st.integers(-1, 2**40),
    st.integers(0, 2**62),
)
def test_notification_batches_equal_protobufs_built_item_by_item(
    changes: list, shard: int, offset: int, timestamp_ms: int
) -> None:
    n = len(changes)
    events = [event for _, event, _, _ in changes]
    columns = {
        "key": [key for key, _, _, _ in changes],
        "operation": [Op.PUT.value] * n,
        "value": [None] * n,
        # Deletes carry no version and only range deletes a range end, as in the change log.
        "version_id": [
            v if e in (ChangeEvent.KEY_CREATED, ChangeEvent.KEY_MODIFIED) else None
            for _, e, v, _ in changes
        ],
        "modifications_count": [None] * n,
        "created_ms": [None] * n,
        "modified_ms": [None] * n,
        "range_end": [r if e == ChangeEvent.KEY_RANGE_DELETED else None for _, e, _, r in changes],
        "event": [e.value for e in events],
    }
    batch = pa.RecordBatch.from_pydict(columns, schema=CHANGES_SCHEMA)
    (encoded,) = notification_batches(shard, offset, timestamp_ms, batch)
    assert encoded == _expected(shard, offset, timestamp_ms, changes)
    assert encoded.SerializeToString(deterministic=True) == _expected(
        shard, offset, timestamp_ms, changes
    ).SerializeToString(deterministic=True)
