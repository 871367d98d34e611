"""How DataFrame columns become quorumstore values and back (the `valueFormat` option).

- ``binary`` (default): the `value` column as it is stored.
- ``string``: the `value` column as UTF-8 text.
- ``json``: one JSON object per value; reading decodes it into typed columns
  (`valueSchema`, a Spark DDL string such as ``"name STRING, age INT"``), writing
  encodes the value columns of each row as one object, as Spark's ``to_json`` does
  (see `json_values`).
- ``arrow``: one Arrow IPC stream holding a one-row record batch per value; the same
  columns as ``json``, with exact types (see `arrow_values`).

`valueSchema` is parsed here, not by Spark's SQL parser (which is out of reach in the
Python processes that plan a data source), so that a bad schema is reported as such.
It supports the types below, nested in ARRAY<...>, MAP<...> and STRUCT<...>.

Example::

    codec = ValueCodec.for_read("json", "name STRING, age INT")
    codec.fields              # the DataFrame columns that replace `value`
    codec.decode(values)      # BinaryArray -> [StringArray, Int32Array]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from quorumstore.spark import arrow_values, json_values

FORMATS = ("binary", "string", "json", "arrow")
#: Formats whose values hold several typed columns.
TYPED_FORMATS = ("json", "arrow")

_ATOMIC: dict[str, DataType] = {
    "STRING": StringType(),
    "BINARY": BinaryType(),
    "BOOLEAN": BooleanType(),
    "TINYINT": ByteType(),
    "BYTE": ByteType(),
    "SMALLINT": ShortType(),
    "SHORT": ShortType(),
    "INT": IntegerType(),
    "INTEGER": IntegerType(),
    "BIGINT": LongType(),
    "LONG": LongType(),
    "FLOAT": FloatType(),
    "REAL": FloatType(),
    "DOUBLE": DoubleType(),
    "DATE": DateType(),
    "TIMESTAMP": TimestampType(),
    "TIMESTAMP_LTZ": TimestampType(),
    "TIMESTAMP_NTZ": TimestampNTZType(),
}
_TOKEN = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


class SchemaError(ValueError):
    """`valueSchema` is not a schema this module can parse or decode."""


class _Parser:
    """Recursive descent over Spark's DDL for the types in `_ATOMIC` and their nestings."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        at = 0
        while at < len(text):
            if text[at:].strip() == "":
                break
            match = _TOKEN.match(text, at)
            if match is None:
                raise SchemaError(f"unexpected {text[at:].strip()[:20]!r} in {text!r}")
            self.tokens.append(match.group(1))
            at = match.end()
        self.at = 0

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if token is None:
            raise SchemaError(
                f"{self.text!r} ends early" + (f"; expected {expected!r}" if expected else "")
            )
        if expected is not None and token.upper() != expected:
            raise SchemaError(f"expected {expected!r} but found {token!r} in {self.text!r}")
        self.at += 1
        return token

    def _name(self) -> str:
        token = self._take()
        if token.startswith("`"):
            return token[1:-1].replace("``", "`")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
            raise SchemaError(f"expected a column name but found {token!r} in {self.text!r}")
        return token

    def fields(self, closing: str | None) -> list[StructField]:
        out = []
        while True:
            name = self._name()
            if self._peek() == ":":
                self._take(":")
            data_type = self.data_type()
            nullable = True
            if self._peek() is not None and self._peek().upper() == "NOT":  # type: ignore[union-attr]
                self._take("NOT")
                self._take("NULL")
                nullable = False
            out.append(StructField(name, data_type, nullable))
            if self._peek() != ",":
                break
            self._take(",")
        if closing is not None:
            self._take(closing)
        return out

    def data_type(self) -> DataType:
        token = self._take().upper()
        if token in _ATOMIC:
            return _ATOMIC[token]
        if token in ("DECIMAL", "DEC", "NUMERIC"):
            precision, scale = 10, 0
            if self._peek() == "(":
                self._take("(")
                precision = int(self._take())
                if self._peek() == ",":
                    self._take(",")
                    scale = int(self._take())
                self._take(")")
            return DecimalType(precision, scale)
        if token == "ARRAY":
            self._take("<")
            element = self.data_type()
            self._take(">")
            return ArrayType(element)
        if token == "MAP":
            self._take("<")
            key = self.data_type()
            self._take(",")
            value = self.data_type()
            self._take(">")
            return MapType(key, value)
        if token == "STRUCT":
            self._take("<")
            return StructType(self.fields(">"))
        raise SchemaError(f"unknown or unsupported type {token!r} in {self.text!r}")

    def schema(self) -> StructType:
        if not self.tokens:
            raise SchemaError("the schema is empty")
        fields = self.fields(None)
        if self._peek() is not None:
            raise SchemaError(f"unexpected {self._peek()!r} in {self.text!r}")
        names = [f.name.lower() for f in fields]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise SchemaError(f"column(s) {repeated} appear more than once in {self.text!r}")
        return StructType(fields)


def parse_schema(text: str) -> StructType:
    """A Spark DDL schema string (``"a INT, b ARRAY<STRING>"``) as a StructType."""
    return _Parser(text).schema()


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects, exactly, from a Python data source reading `schema`."""
    return to_arrow_schema(schema, timezone="UTC")


class ValueCodec:
    """Encodes value columns into stored values and decodes them back (see the module docstring)."""

    def __init__(self, fmt: str, schema: StructType | None) -> None:
        if fmt not in FORMATS:
            raise SchemaError(f"valueFormat must be one of {list(FORMATS)}, got {fmt!r}")
        self.format = fmt
        if fmt == "binary":
            schema = StructType([StructField("value", BinaryType())])
        elif fmt == "string":
            schema = StructType([StructField("value", StringType())])
        elif schema is None:
            raise SchemaError(f"valueFormat {fmt!r} needs the value columns' schema")
        if fmt == "json":
            bad = json_values.non_string_map_key(schema)
            if bad is not None:
                raise SchemaError(
                    f"valueFormat json stores maps as JSON objects, whose keys are strings, but the "
                    f"value has {bad.simpleString()}: cast the map's keys to string, or use valueFormat arrow"
                )
        self.schema: StructType = schema
        self.arrow = arrow_schema(schema)

    @classmethod
    def for_read(cls, fmt: str, value_schema: str | None) -> ValueCodec:
        if fmt in TYPED_FORMATS:
            if not value_schema:
                raise SchemaError(
                    f"valueFormat {fmt!r} needs the option valueSchema (a DDL string)"
                )
            return cls(fmt, parse_schema(value_schema))
        if value_schema:
            raise SchemaError(f"valueSchema is only for valueFormat json or arrow, not {fmt!r}")
        return cls(fmt, None)

    @property
    def fields(self) -> list[StructField]:
        """The DataFrame columns of a value."""
        return list(self.schema.fields)

    # -------------------------------------------------------------- decoding

    def decode(self, values: pa.Array) -> list[pa.Array]:
        """Stored values (binary; null for a deletion) -> the value columns, row for row."""
        if self.format == "binary":
            return [values]
        if self.format == "string":
            try:
                return [values.cast(pa.string())]
            except pa.ArrowInvalid as e:
                raise ValueError(f"a value is not valid UTF-8 (valueFormat string): {e}") from None
        present = pc.is_valid(values)
        compact = values.filter(present)
        if len(compact) == 0:
            columns = [pa.array([], f.type) for f in self.arrow]
        elif self.format == "json":
            columns = json_values.decode(compact, self.arrow, self.schema.simpleString())
        else:
            columns = arrow_values.decode(compact, self.arrow)
        if len(compact) == len(values):
            return columns
        # Rows with a null value get null columns: take() with a null index yields null.
        index = pc.subtract(pc.cumulative_sum(present.cast(pa.int64())), 1)
        index = pc.if_else(present, index, pa.scalar(None, pa.int64()))
        return [column.take(index) for column in columns]

    # -------------------------------------------------------------- encoding

    def encode(self, columns: pa.RecordBatch) -> pa.Array:
        """The value columns of some rows (`self.schema`'s names) -> stored values (binary)."""
        if self.format == "binary":
            return columns.column(0).cast(pa.binary())
        if self.format == "string":
            return columns.column(0).cast(pa.string()).cast(pa.binary())
        if columns.num_rows == 0:
            return pa.array([], pa.binary())
        if self.format == "json":
            return json_values.encode(columns)
        return arrow_values.encode(columns)


def value_columns(fmt: str, names: Sequence[str], chosen: Sequence[str] | None) -> list[str]:
    """Which input columns a write encodes into the value (besides `key`)."""
    if chosen:
        return list(chosen)
    if fmt in TYPED_FORMATS:
        return [n for n in names if n != "key"]
    return ["value"]
