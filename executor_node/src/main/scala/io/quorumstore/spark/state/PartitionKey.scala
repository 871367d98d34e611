package io.quorumstore.spark.state

import java.nio.charset.StandardCharsets.UTF_8
import java.security.MessageDigest

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.streaming.state.StateStoreId

/**
 * The partition key P = "<prefix>/<query id>/<operator>/<partition>/<store name>" shared by
 * every record of one state-store partition, so that all of them live in one shard.
 *
 * The query id is the stable id Spark keeps in the checkpoint's `metadata` file: it survives
 * restarts, is the same for the state data source reading that checkpoint, and changes when
 * a checkpoint is deleted and the query started afresh. Without that file (unreadable from
 * the executor) a digest of the checkpoint location stands in.
 */
object PartitionKey extends Logging {
  private val IdField = "\"id\"\\s*:\\s*\"([^\"]+)\"".r

  def apply(conf: QuorumConf, id: StateStoreId, hadoopConf: Configuration): String = {
    val query = queryId(id.checkpointRootLocation, hadoopConf)
    Seq(conf.prefix, query, id.operatorId.toString, id.partitionId.toString,
      QuorumConf.segment(id.storeName)).mkString("/")
  }

  private def queryId(stateRoot: String, hadoopConf: Configuration): String = {
    // The state root is "<checkpoint>/state"; "<checkpoint>/metadata" is {"id":"<uuid>"}.
    val metadata = new Path(new Path(stateRoot).getParent, "metadata")
    try {
      val fs = metadata.getFileSystem(hadoopConf)
      val in = fs.open(metadata)
      val text = try new String(in.readAllBytes(), UTF_8) finally in.close()
      IdField.findFirstMatchIn(text).map(_.group(1)).getOrElse(
        throw new IllegalStateException(s"no query id in $metadata"))
    } catch {
      case NonFatal(e) =>
        val digest = MessageDigest.getInstance("SHA-256").digest(stateRoot.getBytes(UTF_8))
        val fallback = "ckpt-" + digest.take(12).map("%02x".format(_)).mkString
        logWarning(s"cannot read the query id from $metadata ($e); state of $stateRoot is " +
          s"keyed by $fallback, a digest of the checkpoint location")
        fallback
    }
  }
}
