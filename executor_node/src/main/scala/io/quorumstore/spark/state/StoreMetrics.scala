package io.quorumstore.spark.state

import org.apache.spark.sql.execution.streaming.state.{StateStoreCustomMetric, StateStoreCustomSizeMetric, StateStoreCustomSumMetric, StateStoreCustomTimingMetric}

/** Custom metrics every quorumstore state store reports (summed over partitions by Spark). */
object StoreMetrics {
  val CommitLatency = StateStoreCustomTimingMetric("quorumstoreCommitLatencyMs",
    "quorumstore: time to commit the batch's changes as one replicated write")
  val CommitKeys = StateStoreCustomSumMetric("quorumstoreCommitKeys",
    "quorumstore: keys put or removed by the commit")
  val CommitBytes = StateStoreCustomSizeMetric("quorumstoreCommitBytes",
    "quorumstore: bytes of keys and values shipped by the commit")
  val LoadTime = StateStoreCustomTimingMetric("quorumstoreLoadTimeMs",
    "quorumstore: time to load the version from the replicated store (0 on a local hit)")
  val StoreLoads = StateStoreCustomSumMetric("quorumstoreStoreLoads",
    "quorumstore: versions loaded from the replicated store instead of the local copy")
  val LocalDiskBytes = StateStoreCustomSizeMetric("quorumstoreLocalDiskBytes",
    "quorumstore: bytes of the local copy in files under the local dir")

  val All: Seq[StateStoreCustomMetric] =
    Seq(CommitLatency, CommitKeys, CommitBytes, LoadTime, StoreLoads, LocalDiskBytes)
}
