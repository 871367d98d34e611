"""Questions about nested Arrow types, shared by the value formats."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa


def holds(t: pa.DataType, kind: Callable[[pa.DataType], bool]) -> bool:
    """Whether `t`, or a type nested in it (list elements, map keys and items, struct
    fields), is of `kind` (a `pyarrow.types.is_*` predicate)."""
    if kind(t):
        return True
    if pa.types.is_list(t):
        return holds(t.value_type, kind)
    if pa.types.is_map(t):
        return holds(t.key_type, kind) or holds(t.item_type, kind)
    if pa.types.is_struct(t):
        return any(holds(f.type, kind) for f in t)
    return False
