package io.quorumstore.spark.state

import java.io.File

import org.apache.hadoop.conf.Configuration

import org.apache.spark.SparkEnv

/**
 * The provider's settings, read from Spark confs named `spark.quorumstore.*`. Session confs
 * reach executors through the Hadoop conf Spark hands the provider (it carries every SQL
 * conf); confs given at submit time are also found in SparkEnv's conf.
 */
final case class QuorumConf(
    addresses: Seq[String],
    namespace: String,
    prefix: String,
    timeoutMs: Long,
    snapshotInterval: Int,
    chunkBytes: Int,
    maxWriteBytes: Int,
    localDir: File)

object QuorumConf {
  val Address = "spark.quorumstore.address"
  val Namespace = "spark.quorumstore.namespace"
  val Prefix = "spark.quorumstore.stateStore.prefix"
  val TimeoutMs = "spark.quorumstore.timeoutMs"
  val SnapshotInterval = "spark.quorumstore.stateStore.snapshotInterval"
  val ChunkBytes = "spark.quorumstore.stateStore.chunkBytes"
  val MaxWriteBytes = "spark.quorumstore.stateStore.maxWriteBytes"
  val LocalDir = "spark.quorumstore.stateStore.localDir"

  /**
   * Where local copies live unless told: the first of Spark's local directories, found the
   * way Spark finds them (its own lookup is internal): the worker's per-application
   * directories, YARN's container directories, SPARK_LOCAL_DIRS (Kubernetes volumes),
   * spark.local.dir, else java.io.tmpdir.
   */
  private def defaultLocalDir: String = {
    val env = sys.env
    val configured = Option(SparkEnv.get).flatMap(_.conf.getOption("spark.local.dir"))
    val dirs =
      if (env.contains("CONTAINER_ID") && env.contains("LOCAL_DIRS")) env("LOCAL_DIRS").split(",")
      else env.get("SPARK_EXECUTOR_DIRS").map(_.split(File.pathSeparator))
        .orElse(env.get("SPARK_LOCAL_DIRS").map(_.split(",")))
        .orElse(configured.map(_.split(",")))
        .getOrElse(Array.empty[String])
    dirs.map(_.trim).find(_.nonEmpty).getOrElse(System.getProperty("java.io.tmpdir"))
  }

  def from(hadoopConf: Configuration): QuorumConf = {
    def get(key: String, default: String): String =
      Option(hadoopConf).flatMap(c => Option(c.get(key)))
        .orElse(Option(SparkEnv.get).flatMap(_.conf.getOption(key)))
        .map(_.trim).filter(_.nonEmpty).getOrElse(default)

    def positive(key: String, default: Long): Long = {
      val raw = get(key, default.toString)
      val value = try raw.toLong catch {
        case _: NumberFormatException =>
          throw new IllegalArgumentException(s"$key must be a whole number, got '$raw'")
      }
      require(value > 0, s"$key must be positive, got $value")
      value
    }

    val addresses = get(Address, "127.0.0.1:6648").split(",").map(_.trim).filter(_.nonEmpty).toSeq
    addresses.foreach { a =>
      require(a.lastIndexOf(':') > 0 && a.substring(a.lastIndexOf(':') + 1).forall(_.isDigit),
        s"$Address must be host:port (comma-separated for several nodes), got '$a'")
    }
    val prefix = get(Prefix, "statestore").stripSuffix("/")
    require(!prefix.startsWith("/"), s"$Prefix must not start with '/', got '$prefix'")
    val chunkBytes = positive(ChunkBytes, 1L << 20)
    val maxWriteBytes = positive(MaxWriteBytes, 3L << 20)
    require(chunkBytes < maxWriteBytes, s"$ChunkBytes ($chunkBytes) must be below " +
      s"$MaxWriteBytes ($maxWriteBytes)")
    QuorumConf(
      addresses = addresses,
      namespace = get(Namespace, "default"),
      prefix = prefix,
      timeoutMs = positive(TimeoutMs, 60000L),
      snapshotInterval = positive(SnapshotInterval, 10L).toInt,
      chunkBytes = chunkBytes.toInt,
      maxWriteBytes = maxWriteBytes.toInt,
      localDir = new File(get(LocalDir, defaultLocalDir)).getAbsoluteFile)
  }

  /** A segment of a quorumstore key: no '/', which separates key levels. */
  def segment(s: String): String = s.replace('/', '_')
}
