"""Protobuf wire encoding of whole columns: the bytes of one field for every row at once.

A message with a repeated or map field of many thousand items (an entry's notifications,
say) costs a few µs per item when built item by item in Python, and its items are already
Arrow columns. These functions encode such a field with numpy and Arrow kernels instead;
the caller joins the columns row-wise (`pc.binary_join_element_wise`) and hands the
concatenated rows (`binary.concatenated`) to protobuf's C parser.

Only what quorumstore needs: varints (int64 / uint64 / enum fields, two's complement for
negatives as protobuf does) and length-delimited fields, with tags below 16 (one byte).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quorumstore.arrow.binary import lengths

#: Smallest value of each varint size past one byte (7 payload bits per byte).
_VARINT_STEPS = np.array([1 << shift for shift in range(7, 64, 7)], np.uint64)


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of the protobuf varint of each value (int64 or uint64; negatives take 10)."""
    return 1 + _VARINT_STEPS.searchsorted(values.astype(np.uint64, copy=False), side="right")


def varints(values: np.ndarray) -> pa.BinaryArray:
    """The protobuf varint of each value, one row each."""
    unsigned = values.astype(np.uint64)
    sizes = varint_sizes(unsigned)
    offsets = np.zeros(len(unsigned) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    for i in range(int(sizes.max(initial=0))):
        rows = np.flatnonzero(sizes > i)
        payload = (unsigned[rows] >> np.uint64(7 * i)) & np.uint64(0x7F)
        more = (sizes[rows] > i + 1).astype(np.uint64) << np.uint64(7)
        data[offsets[rows] + i] = payload | more
    return pa.Array.from_buffers(
        pa.binary(), len(unsigned), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _tag(field_number: int, wire_type: int) -> pa.Scalar:
    if not 0 < field_number < 16:
        raise ValueError(f"field number {field_number} needs a tag of more than one byte")
    return pa.scalar(bytes([field_number << 3 | wire_type]), pa.binary())


def varint_field(field_number: int, values: np.ndarray) -> pa.BinaryArray:
    """Tag and varint of each value: field `field_number` set to it."""
    return pc.binary_join_element_wise(_tag(field_number, 0), varints(values), b"")


def length_delimited_field(field_number: int, items: pa.Array) -> pa.BinaryArray:
    """Tag, length and bytes of each item (binary or string, no nulls): a string,
    bytes or embedded-message field `field_number` holding it."""
    data = items.cast(pa.binary())
    return pc.binary_join_element_wise(_tag(field_number, 2), varints(lengths(data)), data, b"")
