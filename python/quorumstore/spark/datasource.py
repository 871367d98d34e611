"""The `quorumstore` data source: DataFrames over a cluster's committed state.

- ``spark.read.format("quorumstore")``: the records, one input partition per shard
  (large shards split by key range), each read from one snapshot
  (`datasource_read.py`);
- ``df.write.format("quorumstore")``: append or overwrite, published per shard at job
  commit, nothing written twice (`datasource_write.py`);
- ``spark.readStream.format("quorumstore")``: the change feed, offsets = per-shard
  commit offsets (`datasource_stream.py`);
- ``df.writeStream.format("quorumstore")``: a sink writing each micro-batch exactly once.

Options are checked when the query is planned, before any task runs
(`datasource_options.py`; the list is in docs/dataframes.md).

Example::

    from quorumstore.spark.datasource import register
    register(spark, address="127.0.0.1:6648")
    df = spark.read.format("quorumstore").load()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from quorumstore.spark.datasource_options import (
    QuorumstoreOptionError,
    SourceOptions,
    Use,
    connect,
)
from quorumstore.spark.datasource_read import QuorumstoreScan, output_schema
from quorumstore.spark.datasource_stream import QuorumstoreChangeFeed, RefusedStreamReader
from quorumstore.spark.datasource_write import (
    QuorumstoreBatchWriter,
    QuorumstoreStreamWriter,
    RowEncoder,
    check_stream_mode,
)

#: The Spark setting that lets Python data sources take pushed filters.
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


class QuorumstoreDataSource(DataSource):
    """Reads, writes and streams a quorumstore namespace (see the module docstring).

    Register it once per session, then use the format name ``quorumstore``:

    >>> spark.dataSource.register(QuorumstoreDataSource)  # doctest: +SKIP
    >>> spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")  # doctest: +SKIP
    >>> (spark.read.format("quorumstore").option("address", "127.0.0.1:6648").load()
    ...      .where("key = 'user/7'").show())  # doctest: +SKIP

    `register` does both, and can make an address the default.
    """

    #: Options every use starts from (set by `register`); the query's own options win.
    defaults: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def name(cls) -> str:
        return "quorumstore"

    def _options(self, use: Use) -> SourceOptions:
        # Spark's option names arrive lower-cased, as `register` writes the defaults' names.
        return SourceOptions.parse({**self.defaults, **self.options}, use)

    def schema(self) -> StructType:
        options = self._options(Use.ANY_READ)
        connect(options).close()
        return output_schema(options.read_codec())

    def reader(self, schema: StructType) -> DataSourceReader:
        return QuorumstoreScan(self._options(Use.READ), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = self._options(Use.WRITE)
        encoder = RowEncoder(options, schema)
        connect(options).close()
        return QuorumstoreBatchWriter(options, encoder, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            return QuorumstoreChangeFeed(self._options(Use.STREAM_READ), schema)
        except QuorumstoreOptionError as error:
            # PySpark's stream runner calls `reader.stop()` in a `finally` around this
            # call: an error raised here reaches the user chained to its UnboundLocalError.
            # Raised by the reader's first call (still on the driver, before any task),
            # it arrives alone.
            return RefusedStreamReader(error)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        check_stream_mode(overwrite)
        options = self._options(Use.STREAM_WRITE)
        encoder = RowEncoder(options, schema)
        connect(options).close()
        return QuorumstoreStreamWriter(options, encoder)


def register(
    spark: SparkSession,
    address: str | Sequence[str] | None = None,
    namespace: str | None = None,
    *,
    tls_trusted_ca_file: str | None = None,
    token: str | None = None,
) -> type[QuorumstoreDataSource]:
    """Registers the ``quorumstore`` format in `spark` and enables filter pushdown.

    With `address` (one node, several, or a list; e.g. a hosted cluster's
    ``addresses``) and `namespace`, those become the defaults of every
    ``format("quorumstore")`` use in the session, so the options can be left out; so do
    `tls_trusted_ca_file` (the nodes serve TLS) and `token` (the cluster wants one).

    >>> register(spark, address="127.0.0.1:6648")  # doctest: +SKIP
    >>> spark.read.format("quorumstore").load().count()  # doctest: +SKIP
    """
    defaults: dict[str, str] = {}
    if address is not None:
        defaults["address"] = address if isinstance(address, str) else ",".join(address)
    if namespace is not None:
        defaults["namespace"] = namespace
    if tls_trusted_ca_file is not None:
        defaults["tlsTrustedCaFile"] = tls_trusted_ca_file
    if token is not None:
        defaults["token"] = token
    source: type[QuorumstoreDataSource] = QuorumstoreDataSource
    if defaults:
        # A class made here is not importable by name, so Spark's workers get it pickled
        # by value, defaults included.
        source = type(
            "RegisteredQuorumstoreDataSource",
            (QuorumstoreDataSource,),
            {"defaults": defaults, "__module__": __name__},
        )
    spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    spark.dataSource.register(source)
    return source
