"""Key filters pushed into a quorumstore scan: which shards and key ranges to read.

Two key orders meet here. Spark compares strings byte-wise (UTF-8), so its filters
`key < 'b'` or `key LIKE 'a%'` speak of that order. quorumstore stores keys in Oxia's
hierarchical order (storage/keys.py), where "b" < "a/x": a Spark range is not one
stored range. So a `KeyFilter`

- prunes what it can exactly in storage terms: keys (=, IN) become point reads on the
  shards their hash routes them to, and a prefix (StartsWith, and the common prefix of
  a lower and an upper bound) becomes at most two hierarchical ranges;
- and evaluates every pushed filter exactly on the rows read (`mask`, Arrow kernels),
  so Spark need not evaluate them again.

Example::

    f = KeyFilter()
    f.push(StringStartsWith(("key",), "user/1"))   # True: handled here
    f.ranges([("", "")])   # [("user/1", "user/2"), ("user/1/", "user/2/")]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from quorumstore.wire.keys import compare_keys

#: A hierarchical key range [min_inclusive, max_exclusive); an empty max is unbounded.
KeyRange = tuple[str, str]

_SURROGATES = range(0xD800, 0xE000)


def _successor(prefix: str) -> str | None:
    """Smallest string above every string that starts with `prefix` (None: there is none).

    UTF-8 byte order is code point order, so this works on code points.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars.pop())
        if code < 0x10FFFF:
            code += 1
            if code in _SURROGATES:
                code = _SURROGATES.stop
            return "".join(chars) + chr(code)
    return None


def prefix_ranges(prefix: str) -> list[KeyRange]:
    """The hierarchical key ranges holding exactly the keys that start with `prefix`.

    For prefix H + r, where H is everything up to and including the last '/', the keys
    are H + x (x without '/', starting with r) and H + x + '/' + anything. In
    hierarchical order each group is one range; they are adjacent when r is empty.
    Checked against `str.startswith` over generated keys in tests/unit/test_data_api.py.
    """
    if not prefix:
        return [("", "")]
    head, slash, rest = prefix.rpartition("/")
    level = head + slash
    if not rest:
        # Every key below `head/`: the first key after them all is "head\0/".
        return [(level, head + "\x00/")]
    succ = _successor(rest)
    if succ is None:
        last_level_end = level + "/"
        deeper_end = head + "\x00/" if slash else ""
        return [(prefix, last_level_end), (prefix + "/", deeper_end)]
    return [(prefix, level + succ), (prefix + "/", level + succ + "/")]


def _max_low(a: str, b: str) -> str:
    return a if compare_keys(a, b) >= 0 else b


def _min_high(a: str, b: str) -> str:
    if not a:
        return b
    if not b:
        return a
    return a if compare_keys(a, b) <= 0 else b


def _nonempty(r: KeyRange) -> bool:
    low, high = r
    return not high or compare_keys(low, high) < 0


def intersect(a: Sequence[KeyRange], b: Sequence[KeyRange]) -> list[KeyRange]:
    """Pairwise intersections of two sets of disjoint hierarchical ranges, in key order."""
    out = []
    for a_low, a_high in a:
        for b_low, b_high in b:
            piece = (_max_low(a_low, b_low), _min_high(a_high, b_high))
            if _nonempty(piece):
                out.append(piece)
    return sorted(out, key=_SortKey)


class _SortKey:
    """Orders ranges by their start in hierarchical key order."""

    def __init__(self, r: KeyRange) -> None:
        self.low = r[0]

    def __lt__(self, other: _SortKey) -> bool:
        return compare_keys(self.low, other.low) < 0


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


@dataclass
class KeyFilter:
    """The conjunction of the key and shard filters pushed into one scan.

    Bounds compare in Spark's (byte-wise) string order. `empty` is set when the
    filters contradict each other: nothing is read at all.
    """

    keys: frozenset[str] | None = None
    lower: tuple[str, bool] | None = None  # (bound, inclusive)
    upper: tuple[str, bool] | None = None
    prefix: str = ""
    shards: frozenset[int] | None = None
    empty: bool = False
    pushed: list[str] = field(default_factory=list)

    def push(self, f: Filter) -> bool:
        """Takes `f` if it constrains key or shard in a way handled here; True if taken."""
        # A negation (Not) names no column itself, only its child filter: Spark keeps it.
        attribute = getattr(f, "attribute", None)
        if attribute == ("shard",):
            return self._push_shard(f)
        if attribute != ("key",):
            return False
        if isinstance(f, IsNotNull):
            pass  # keys are never null
        elif isinstance(f, EqualTo) and isinstance(f.value, str):
            self._restrict_keys([f.value])
        elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            self._restrict_keys(f.value)
        elif isinstance(f, (GreaterThan, GreaterThanOrEqual)) and isinstance(f.value, str):
            bound = (f.value, isinstance(f, GreaterThanOrEqual))
            if self.lower is None or (bound[0], not bound[1]) > (self.lower[0], not self.lower[1]):
                self.lower = bound
        elif isinstance(f, (LessThan, LessThanOrEqual)) and isinstance(f.value, str):
            bound = (f.value, isinstance(f, LessThanOrEqual))
            if self.upper is None or bound < self.upper:
                self.upper = bound
        elif isinstance(f, StringStartsWith) and isinstance(f.value, str):
            self.restrict_prefix(f.value)
        else:
            return False
        self.pushed.append(repr(f))
        return True

    def _push_shard(self, f: Filter) -> bool:
        if isinstance(f, EqualTo) and isinstance(f.value, int):
            values: Iterable[object] = [f.value]
        elif isinstance(f, In) and all(isinstance(v, int) for v in f.value):
            values = f.value
        else:
            return False
        shards = frozenset(int(v) for v in values)  # type: ignore[call-overload]
        self.shards = shards if self.shards is None else self.shards & shards
        self.pushed.append(repr(f))
        return True

    def _restrict_keys(self, values: Iterable[str]) -> None:
        keys = frozenset(values)
        self.keys = keys if self.keys is None else self.keys & keys

    def restrict_prefix(self, prefix: str) -> None:
        if prefix.startswith(self.prefix):
            self.prefix = prefix
        elif not self.prefix.startswith(prefix):
            self.empty = True

    def _bounds_prefix(self) -> str:
        """Every key between the bounds starts with their common prefix."""
        if self.lower is None or self.upper is None:
            return ""
        return _common_prefix(self.lower[0], self.upper[0])

    def ranges(self, base: Sequence[KeyRange]) -> list[KeyRange]:
        """The hierarchical ranges of `base` that can hold matching keys."""
        prefix = self.prefix
        bounds_prefix = self._bounds_prefix()
        if bounds_prefix.startswith(prefix):
            prefix = bounds_prefix
        elif not prefix.startswith(bounds_prefix):
            return []
        if self.empty or self._bounds_empty():
            return []
        return intersect(base, prefix_ranges(prefix))

    def _bounds_empty(self) -> bool:
        if self.lower is None or self.upper is None:
            return False
        (low, low_inc), (high, high_inc) = self.lower, self.upper
        return low > high or (low == high and not (low_inc and high_inc))

    def matches(self, key: str) -> bool:
        """Whether one key passes every pushed key filter (for planning point reads)."""
        if self.empty or (self.keys is not None and key not in self.keys):
            return False
        if not key.startswith(self.prefix):
            return False
        if self.lower is not None and (
            key < self.lower[0] or (key == self.lower[0] and not self.lower[1])
        ):
            return False
        return self.upper is None or not (
            key > self.upper[0] or (key == self.upper[0] and not self.upper[1])
        )

    def mask(self, keys: pa.Array) -> pa.Array | None:
        """Which of `keys` pass every pushed key filter; None when all of them do."""
        if self.empty:
            return pa.array(np.zeros(len(keys), dtype=bool))
        conditions = []
        if self.keys is not None:
            conditions.append(pc.is_in(keys, value_set=pa.array(sorted(self.keys), pa.string())))
        if self.prefix:
            conditions.append(pc.starts_with(keys, self.prefix))
        if self.lower is not None:
            compare = pc.greater_equal if self.lower[1] else pc.greater
            conditions.append(compare(keys, pa.scalar(self.lower[0], pa.string())))
        if self.upper is not None:
            compare = pc.less_equal if self.upper[1] else pc.less
            conditions.append(compare(keys, pa.scalar(self.upper[0], pa.string())))
        if not conditions:
            return None
        result = conditions[0]
        for condition in conditions[1:]:
            result = pc.and_(result, condition)
        return result
