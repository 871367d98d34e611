"""The ``quorumstore`` format, found by PySpark's data source lookup without an import.

PySpark registers the ``DefaultSource`` of every top-level ``pyspark_*`` module it finds
in its Python environment, so ``spark.read.format("quorumstore")`` (and ``df.write``,
``readStream``, ``writeStream``) works in any session of a machine where quorumstore is
installed. `quorumstore.spark.datasource.register` still sets session-wide defaults and
turns on filter pushdown.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from quorumstore.spark.datasource import QuorumstoreDataSource

__all__ = ["DefaultSource"]


class ScanWithoutPushdown(DataSourceReader):
    """A quorumstore scan that takes no filters.

    Spark refuses a reader that implements ``pushFilters`` while
    ``spark.sql.python.filterPushdown.enabled`` is false, its default, and a data source
    cannot read the session's settings; so the registered-by-lookup source scans
    without pushdown, and Spark filters the rows. `register` enables the setting and
    registers the scan that pushes key filters."""

    def __init__(self, scan: DataSourceReader) -> None:
        self._scan = scan

    def partitions(self) -> Sequence[InputPartition]:
        return self._scan.partitions()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return iter(self._scan.read(partition))


class DefaultSource(QuorumstoreDataSource):
    """The ``quorumstore`` data source as PySpark's lookup registers it."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return ScanWithoutPushdown(super().reader(schema))
