package io.quorumstore.spark.state

/** Plain values of the Oxia client protocol, free of any protobuf or gRPC type. */

/** One shard of a namespace: who leads it and which 32-bit hashes it owns (unsigned). */
final case class ShardAssignment(shard: Long, leader: String, minHash: Long, maxHash: Long)

/** A put; `expectedVersionId` -1 means "must not exist". */
final case class PutOp(
    key: String,
    value: Array[Byte],
    partitionKey: String,
    expectedVersionId: Option[Long] = None)

/** Deletes every key in [startInclusive, endExclusive) (hierarchical order). */
final case class DeleteRangeOp(startInclusive: String, endExclusive: String)

final case class PutResult(status: Int, versionId: Long)

final case class WriteResult(puts: IndexedSeq[PutResult], deleteRanges: IndexedSeq[Int])

/** A stored record as returned by Read and RangeScan. */
final case class Record(key: String, value: Array[Byte], versionId: Long)

/** Oxia's per-operation `Status`. */
object OxiaStatus {
  val Ok = 0
  val KeyNotFound = 1
  val UnexpectedVersionId = 2

  def name(code: Int): String = code match {
    case Ok => "OK"
    case KeyNotFound => "KEY_NOT_FOUND"
    case UnexpectedVersionId => "UNEXPECTED_VERSION_ID"
    case other => s"status $other"
  }
}

/**
 * A failed RPC. `code` is the gRPC status code (Oxia's own codes such as 106, "node is not
 * leader", arrive as UNKNOWN with the number in the description); `leaderHint` is the
 * server's `leader-hint` trailer when it sent one.
 */
final class WireException(
    val code: String,
    val description: String,
    val leaderHint: Option[String],
    cause: Throwable)
  extends RuntimeException(s"$code: $description", cause) {

  /** The cluster has no such namespace: NOT_FOUND, or Oxia's UNKNOWN with this text. */
  def namespaceNotFound: Boolean =
    code == "NOT_FOUND" || String.valueOf(description).startsWith("oxia: namespace not found")

  /** The cluster refused the call's credentials or their principal: no retry helps. */
  def refusedCredentials: Boolean = code == "UNAUTHENTICATED" || code == "PERMISSION_DENIED"

  /** Whether retrying (after refreshing shard assignments) may succeed. */
  def retryable: Boolean = code match {
    case "UNAVAILABLE" | "DEADLINE_EXCEEDED" | "ABORTED" | "RESOURCE_EXHAUSTED" | "CANCELLED" =>
      true
    case "UNKNOWN" | "FAILED_PRECONDITION" =>
      val text = String.valueOf(description).toLowerCase(java.util.Locale.ROOT)
      text.contains("not leader") || text.contains("code 106")
    case _ => false
  }
}
