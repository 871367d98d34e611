"""Options of the `quorumstore` data source, checked on the driver before any task runs.

Spark hands options over as a case-insensitive dict of strings. `SourceOptions.parse`
accepts exactly the options of one use (batch read, batch write, stream read, stream
write), converts them and explains what is wrong in one `QuorumstoreOptionError`;
`connect` then reaches the cluster once, so a wrong address fails the query up front.

Example::

    opts = SourceOptions.parse({"address": "127.0.0.1:6648"}, Use.READ)
    with connect(opts) as client:
        client.shards()
"""

from __future__ import annotations

import difflib
import enum
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from pyspark.errors import PySparkValueError

from quorumstore.client.data_service import DataClient, DataClientError
from quorumstore.spark.datasource_values import FORMATS, TYPED_FORMATS, SchemaError, ValueCodec
from quorumstore.wire.keys import compare_keys
from quorumstore.wire.metadata import DEFAULT_NAMESPACE
from quorumstore.wire.tls import TlsConfig, TlsError


class QuorumstoreOptionError(PySparkValueError):
    """A quorumstore data source option, schema or address is wrong.

    `getCondition()` names the problem: QUORUMSTORE_UNKNOWN_OPTION,
    QUORUMSTORE_INVALID_OPTION, QUORUMSTORE_MISSING_OPTION, QUORUMSTORE_INVALID_SCHEMA,
    QUORUMSTORE_MISSING_COLUMN or QUORUMSTORE_UNREACHABLE; in a writing task, rows Spark
    cannot check before they exist: QUORUMSTORE_NULL_KEY or QUORUMSTORE_NULL_VALUE.
    """

    def __init__(self, condition: str, message: str) -> None:
        super().__init__(message=message, errorClass=condition, messageParameters={})


class Use(enum.Enum):
    READ = "spark.read"
    WRITE = "DataFrame.write"
    STREAM_READ = "spark.readStream"
    STREAM_WRITE = "DataFrame.writeStream"
    #: `DataSource.schema()`, which Spark calls for batch and stream reads alike.
    ANY_READ = "spark.read or spark.readStream"


_COMMON = {
    "address",
    "namespace",
    "valueFormat",
    "retryTimeout",
    "connectTimeout",
    "tlsTrustedCaFile",
    "token",
}
_ALLOWED: dict[Use, set[str]] = {
    Use.READ: _COMMON
    | {"valueSchema", "keyStart", "keyEnd", "keyPrefix", "readFrom", "maxRowsPerPartition"},
    Use.WRITE: _COMMON | {"valueColumns", "chunkRows"},
    Use.STREAM_READ: _COMMON
    | {"valueSchema", "startingOffsets", "keyPrefix", "keyStart", "keyEnd"},
    # Spark passes the sink's checkpoint location on as an option.
    Use.STREAM_WRITE: _COMMON | {"valueColumns", "chunkRows", "checkpointLocation"},
}
_ALLOWED[Use.ANY_READ] = _ALLOWED[Use.READ] | _ALLOWED[Use.STREAM_READ]
#: host:port, the host a name, an IPv4 address or a bracketed IPv6 one.
_ADDRESS = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^\s,:\[\]]+):\d{1,5}")
DEFAULT_MAX_ROWS_PER_PARTITION = 1_000_000
DEFAULT_CHUNK_ROWS = 65536


def _why_unknown(name: str, use: Use, allowed: Mapping[str, str]) -> str:
    """Names the option as the user wrote it (Spark hands the names over lower-cased):
    an option of another use, or the allowed option it is closest to."""
    elsewhere = [
        (option, other)
        for other in (Use.READ, Use.WRITE, Use.STREAM_READ, Use.STREAM_WRITE)
        for option in _ALLOWED[other] - {"checkpointLocation"}
        if option.lower() == name.lower()
    ]
    here = f'{use.value}.format("quorumstore")'
    if elsewhere:
        uses = " and ".join(other.value for _, other in elsewhere)
        return f"option {elsewhere[0][0]!r} applies to {uses}, not to {here}"
    close = difflib.get_close_matches(name.lower(), list(allowed), n=1)
    hint = f" (did you mean {allowed[close[0]]}?)" if close else ""
    return f"unknown option {name!r}{hint} for {here}"


def _error(condition: str, message: str) -> QuorumstoreOptionError:
    return QuorumstoreOptionError(condition, message)


def _positive(
    options: Mapping[str, str], name: str, default: float, kind: type[int | float]
) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if not (value > 0 and math.isfinite(value)):  # a NaN timeout would never expire
        raise _error(
            "QUORUMSTORE_INVALID_OPTION",
            f"option {name} must be a positive {'finite number' if kind is float else 'int'}, "
            f"got {raw!r}",
        )
    return value


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one use of the data source (see `docs/dataframes.md`)."""

    use: Use
    address: str
    namespace: str = DEFAULT_NAMESPACE
    value_format: str = "binary"
    value_schema: str | None = None
    value_columns: tuple[str, ...] | None = None
    key_start: str = ""
    key_end: str = ""
    key_prefix: str = ""
    read_from: str = "leader"
    max_rows_per_partition: int = DEFAULT_MAX_ROWS_PER_PARTITION
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    starting_offsets: str = "latest"
    retry_timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    #: PEM CA file the nodes' certificates are checked against (the nodes serve TLS).
    tls_trusted_ca_file: str | None = None
    #: Bearer token presented on every call (the cluster has an auth config).
    token: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str], use: Use) -> SourceOptions:
        allowed = {name.lower(): name for name in _ALLOWED[use]}
        given: dict[str, str] = {}
        for name, value in options.items():
            canonical = allowed.get(name.lower())
            if canonical is None:
                raise _error(
                    "QUORUMSTORE_UNKNOWN_OPTION",
                    f"{_why_unknown(name, use, allowed)}; "
                    f"the options are {sorted(_ALLOWED[use] - {'checkpointLocation'})}",
                )
            given[canonical] = value
        address = given.get("address", "")
        if not address:
            raise _error(
                "QUORUMSTORE_MISSING_OPTION",
                "option address (host:port of a quorumstore node) is required, or register the "
                "data source with quorumstore.spark.datasource.register(spark, address=...)",
            )
        nodes = [a.strip() for a in address.split(",")]
        if not all(_ADDRESS.fullmatch(a) for a in nodes):
            raise _error(
                "QUORUMSTORE_INVALID_OPTION",
                f"option address must be host:port[,host:port...], got {address!r}",
            )
        value_format = given.get("valueFormat", "binary").lower()
        if value_format not in FORMATS:
            raise _error(
                "QUORUMSTORE_INVALID_OPTION",
                f"option valueFormat must be one of {list(FORMATS)}, got {given['valueFormat']!r}",
            )
        read_from = given.get("readFrom", "leader").lower()
        if read_from not in ("leader", "follower"):
            raise _error(
                "QUORUMSTORE_INVALID_OPTION",
                f"option readFrom must be 'leader' or 'follower', got {given['readFrom']!r}",
            )
        value_columns = None
        if "valueColumns" in given:
            value_columns = tuple(c.strip() for c in given["valueColumns"].split(",") if c.strip())
            if not value_columns:
                raise _error("QUORUMSTORE_INVALID_OPTION", "option valueColumns names no column")
            if value_format not in TYPED_FORMATS and len(value_columns) != 1:
                raise _error(
                    "QUORUMSTORE_INVALID_OPTION",
                    f"valueFormat {value_format!r} stores one column; valueColumns names {len(value_columns)} "
                    "(use valueFormat json or arrow to store several)",
                )
        starting = given.get("startingOffsets", "latest")
        if starting.lower() in ("latest", "earliest"):
            starting = starting.lower()
        else:
            _parse_offsets(starting, "option startingOffsets")
        parsed = cls(
            use=use,
            address=",".join(nodes),
            namespace=given.get("namespace", DEFAULT_NAMESPACE),
            value_format=value_format,
            value_schema=given.get("valueSchema"),
            value_columns=value_columns,
            key_start=given.get("keyStart", ""),
            key_end=given.get("keyEnd", ""),
            key_prefix=given.get("keyPrefix", ""),
            read_from=read_from,
            max_rows_per_partition=int(
                _positive(given, "maxRowsPerPartition", DEFAULT_MAX_ROWS_PER_PARTITION, int)
            ),
            chunk_rows=int(_positive(given, "chunkRows", DEFAULT_CHUNK_ROWS, int)),
            starting_offsets=starting,
            retry_timeout_s=_positive(given, "retryTimeout", 60.0, float),
            connect_timeout_s=_positive(given, "connectTimeout", 10.0, float),
            tls_trusted_ca_file=given.get("tlsTrustedCaFile"),
            token=given.get("token"),
        )
        if parsed.key_end and compare_keys(parsed.key_start, parsed.key_end) > 0:
            raise _error(
                "QUORUMSTORE_INVALID_OPTION",
                f"keyStart {parsed.key_start!r} sorts after keyEnd {parsed.key_end!r} in hierarchical key order",
            )
        if use in (Use.READ, Use.STREAM_READ, Use.ANY_READ):
            parsed.read_codec()  # a bad valueSchema fails here, on the driver
        return parsed

    def read_codec(self) -> ValueCodec:
        try:
            return ValueCodec.for_read(self.value_format, self.value_schema)
        except SchemaError as e:
            raise _error("QUORUMSTORE_INVALID_SCHEMA", f"option valueSchema: {e}") from None

    def client(self) -> DataClient:
        tls = None
        if self.tls_trusted_ca_file is not None:
            try:
                tls = TlsConfig.from_files(None, None, Path(self.tls_trusted_ca_file))
            except TlsError as e:
                raise _error(
                    "QUORUMSTORE_INVALID_OPTION", f"option tlsTrustedCaFile: {e}"
                ) from None
        return DataClient(
            self.address, self.namespace, retry_s=self.retry_timeout_s, tls=tls, token=self.token
        )


def _parse_offsets(text: str, what: str) -> dict[str, int]:
    try:
        offsets = json.loads(text)
    except json.JSONDecodeError:
        offsets = None
    if not isinstance(offsets, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= -1
        for k, v in offsets.items()
    ):
        raise _error(
            "QUORUMSTORE_INVALID_OPTION",
            f"{what} must be 'latest', 'earliest' or JSON like {{\"default/0\": 41, \"default/1\": -1}} "
            f"(offsets of -1 or more: the offset after which to start), got {text!r}",
        )
    return offsets


def parse_offsets(text: str) -> dict[str, int]:
    """startingOffsets JSON: {"<namespace>/<shard>": offset after which to start}."""
    return _parse_offsets(text, "option startingOffsets")


def connect(options: SourceOptions) -> DataClient:
    """A client whose routing table was fetched once; QUORUMSTORE_UNREACHABLE if it cannot be."""
    client = options.client()
    try:
        client.shards(timeout_s=options.connect_timeout_s)
    except DataClientError as e:
        client.close()
        if e.code == grpc.StatusCode.NOT_FOUND:  # reached, and it says what it has
            raise _error(
                "QUORUMSTORE_INVALID_OPTION",
                f"option namespace: quorumstore at {options.address} has no namespace "
                f"{options.namespace!r}: {e}",
            ) from None
        raise _error(
            "QUORUMSTORE_UNREACHABLE",
            f"cannot reach quorumstore at {options.address} (namespace {options.namespace!r}) "
            f"within {options.connect_timeout_s:g} s: {e}",
        ) from None
    return client
