"""Typed value codecs (``valueFormat json`` and ``arrow``): rows/s to encode and decode.

A DataFrame write encodes each row's value columns into one stored value, and a read
decodes them back; both run in Spark's Python workers for every row. This measures the
codecs alone, on N rows, best of R runs, beside a peer that is the plain way to read
the same values. Each format runs on a flat value (three columns), on one with an
array column too, empty in a third of the rows (arrow copies those rows out one by one;
see `arrow_values.encode`), and on a typed one (timestamp, decimal, binary):

- json: pyarrow's JSON reader over the same bytes, one object per line (the columnar
  parse decoding starts from);
- arrow: the same values each read as its own IPC stream, one `open_stream` per value
  (what quorumstore's decoder did before it joined values into one stream).

Usage: python bench/value_formats_bench.py [--rows N] [--repeats R]
"""

from __future__ import annotations

import argparse
import decimal
import functools
import io
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.json as pa_json

from quorumstore.spark.datasource_values import ValueCodec, parse_schema

FLAT = "name STRING, age INT, score DOUBLE"
NESTED = FLAT + ", tags ARRAY<STRING>"
TYPED = "at TIMESTAMP, price DECIMAL(10,2), blob BINARY"


def best_rate(rows: int, repeats: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return rows / best


def peer_decode(
    fmt: str, codec: ValueCodec, values: pa.Array, batch: pa.RecordBatch
) -> Callable[[], object]:
    """The peer's decode of the same rows (see the module docstring)."""
    if fmt == "json":
        text = b"\n".join(values.to_pylist())
        options = pa_json.ParseOptions(explicit_schema=codec.arrow)

        def read_json() -> object:
            return pa_json.read_json(io.BytesIO(text), parse_options=options)

        return read_json
    streams = values.to_pylist()

    def read_stream() -> object:
        return pa.concat_tables([pa.ipc.open_stream(v).read_all() for v in streams])

    return read_stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = args.rows
    print(
        f"value codecs: {n:,} rows, best of {args.repeats}; flat: {FLAT}; "
        f"nested: + tags ARRAY<STRING>; typed: {TYPED}"
    )
    print(
        f"{'':15}{'encode rows/s':>16}{'decode rows/s':>16}{'peer decode rows/s':>22}{'decode/peer':>13}"
    )
    columns = {
        "name": [f"user {i}" for i in range(n)],
        "age": list(range(n)),
        "score": [i * 0.25 for i in range(n)],
        "tags": [["a", "b"][: i % 3] for i in range(n)],
        "at": pa.array(range(0, n * 1_000_037, 1_000_037), pa.int64()).cast(
            pa.timestamp("us", "UTC")
        ),
        "price": [decimal.Decimal(i) / 100 for i in range(n)],
        "blob": [i.to_bytes(8, "little")[: i % 9] for i in range(n)],
    }
    for fmt, shape, ddl in [
        ("json", "flat", FLAT),
        ("json", "nested", NESTED),
        ("json", "typed", TYPED),
        ("arrow", "flat", FLAT),
        ("arrow", "nested", NESTED),
        ("arrow", "typed", TYPED),
    ]:
        codec = ValueCodec(fmt, parse_schema(ddl))
        batch = pa.RecordBatch.from_pydict(
            {name: columns[name] for name in codec.arrow.names}, schema=codec.arrow
        )
        values = codec.encode(batch)
        decoded = pa.Table.from_arrays(codec.decode(values), schema=codec.arrow)
        assert decoded.equals(pa.Table.from_batches([batch])), f"{fmt} does not round-trip"
        encode = best_rate(n, args.repeats, functools.partial(codec.encode, batch))
        decode = best_rate(n, args.repeats, functools.partial(codec.decode, values))
        peer = best_rate(n, args.repeats, peer_decode(fmt, codec, values, batch))
        label = f"{fmt} {shape}"
        print(f"{label:15}{encode:>16,.0f}{decode:>16,.0f}{peer:>22,.0f}{decode / peer:>12.2f}x")


if __name__ == "__main__":
    main()
