"""Views of a binary or string Arrow array's buffers, for numpy work over all its rows.

Arrow kernels slice arrays without copying, so each view starts at the array's offset.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def offsets(items: pa.Array) -> np.ndarray:
    """The len(items) + 1 int32 offsets of a (possibly sliced) binary or string array,
    viewed in place."""
    return np.frombuffer(items.buffers()[1], np.int32, len(items) + 1, items.offset * 4)


def lengths(items: pa.Array) -> np.ndarray:
    """The byte size of every item."""
    return np.diff(offsets(items))


def data(items: pa.Array) -> pa.Buffer:
    """All items' bytes back to back, as a view of the array's data buffer."""
    ends = offsets(items)
    if ends[0] == ends[-1]:
        return pa.py_buffer(b"")
    return items.buffers()[2].slice(int(ends[0]), int(ends[-1] - ends[0]))


def concatenated(items: pa.Array) -> bytes:
    """All items' bytes back to back, copied."""
    return data(items).to_pybytes()
