"""quorumstore on Spark: host a cluster inside a Spark application.

>>> import quorumstore.spark
>>> cluster = quorumstore.spark.start(spark, nodes=3, shards=8, replication_factor=3)  # doctest: +SKIP
"""

from quorumstore.spark.hosting import ClusterStartError, HostedCluster, HostedClusterStatus, start
from quorumstore.spark.slots import NotEnoughSlotsError

__all__ = [
    "ClusterStartError",
    "HostedCluster",
    "HostedClusterStatus",
    "NotEnoughSlotsError",
    "start",
]
