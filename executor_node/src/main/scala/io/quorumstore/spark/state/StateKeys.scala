package io.quorumstore.spark.state

/**
 * Key layout of one state-store partition under its partition key P (every record is put
 * with partition_key = P, so all of them live in P's shard):
 *
 *   P/head                                 latest committed version and checkpoint id
 *   P/delta/<version>/<uid>/<chunk>        changes of one commit; chunk 000000 is the header
 *   P/snapshot/<version>/<uid>/<chunk>     full state at a version; chunk 000000 is the header
 *
 * Oxia orders keys segment by segment with shallower keys first, so every range below is
 * built from keys of the same depth as the keys it bounds.
 */
final class StateKeys(val partitionKey: String) {
  import StateKeys._

  val head: String = s"$partitionKey/head"

  def chunk(kind: String, version: Long, uid: String, index: Int): String =
    f"$partitionKey/$kind/${version}%020d/$uid/$index%06d"

  /** Every chunk of every commit of `kind` with fromVersion <= version < toVersion. */
  def versions(kind: String, fromVersion: Long, toVersion: Long): (String, String) =
    (f"$partitionKey/$kind/${math.max(0L, fromVersion)}%020d//",
      f"$partitionKey/$kind/${math.max(0L, toVersion)}%020d//")

  /** The data chunks (1..) of one commit. */
  def dataChunks(kind: String, version: Long, uid: String): (String, String) =
    (chunk(kind, version, uid, 1), f"$partitionKey/$kind/${version}%020d/$uid/~")

  /** Parses a chunk key of this partition. */
  def parse(key: String): Option[ChunkKey] = {
    if (!key.startsWith(partitionKey + "/")) None
    else key.substring(partitionKey.length + 1).split('/') match {
      case Array(kind, version, uid, index) if (kind == Delta || kind == Snapshot) &&
          version.length == 20 && index.length == 6 =>
        Some(ChunkKey(kind, version.toLong, uid, index.toInt))
      case _ => None
    }
  }
}

final case class ChunkKey(kind: String, version: Long, uid: String, index: Int)

object StateKeys {
  val Delta = "delta"
  val Snapshot = "snapshot"
}
