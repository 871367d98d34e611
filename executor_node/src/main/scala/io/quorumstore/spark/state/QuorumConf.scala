package io.quorumstore.spark.state

import java.io.File

import java.util.concurrent.ConcurrentHashMap

import scala.io.Source
import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration

import org.apache.spark.SparkEnv
import org.apache.spark.internal.Logging

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
    localDir: File,
    security: WireSecurity)

/**
 * How the provider's calls are secured: the nodes' certificates checked against
 * `trustedCaFile` (TLS), and `token` presented as `authorization: Bearer <token>` on
 * every call. A token travels only over TLS or to a loopback address.
 */
final case class WireSecurity(trustedCaFile: Option[File], token: Option[String]) {
  override def toString: String =
    s"WireSecurity(trustedCaFile=$trustedCaFile, token=${token.map(_ => "<hidden>")})"
}

object QuorumConf extends Logging {
  val Address = "spark.quorumstore.address"
  val Namespace = "spark.quorumstore.namespace"
  val Prefix = "spark.quorumstore.stateStore.prefix"
  val TimeoutMs = "spark.quorumstore.timeoutMs"
  val MaxTimeoutMs: Long = 365L * 24 * 3600 * 1000
  val SnapshotInterval = "spark.quorumstore.stateStore.snapshotInterval"
  val ChunkBytes = "spark.quorumstore.stateStore.chunkBytes"
  val MaxWriteBytes = "spark.quorumstore.stateStore.maxWriteBytes"
  val LocalDir = "spark.quorumstore.stateStore.localDir"
  val TrustedCaFile = "spark.quorumstore.tls.trustedCaFile"
  val Token = "spark.quorumstore.auth.token"

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

  val KeyPrefix = "spark.quorumstore."
  /** Every `spark.quorumstore.*` setting, Python's and ours: conf_keys.txt, put in the jar by
   * jar_build.py from python/quorumstore/spark/. */
  val KeysResource = "io/quorumstore/spark/state/conf_keys.txt"

  lazy val knownKeys: Set[String] = {
    val stream = getClass.getClassLoader.getResourceAsStream(KeysResource)
    require(stream != null, s"$KeysResource is missing from the quorumstore jar; rebuild it " +
      "with python -m quorumstore.spark.jar_build --force")
    val source = Source.fromInputStream(stream, "UTF-8")
    try source.getLines().map(_.trim).filter(l => l.nonEmpty && !l.startsWith("#")).toSet
    finally source.close()
  }

  /** Unknown keys already warned about in this JVM: providers are made per partition. */
  private val warnedKeys = ConcurrentHashMap.newKeySet[String]()

  /** The warning for a `spark.quorumstore.*` key that nothing reads, e.g. a misspelling. */
  def unknownKeyWarning(key: String): Option[String] =
    if (!key.startsWith(KeyPrefix) || knownKeys.contains(key)) None
    else {
      val hint = knownKeys.find(_.equalsIgnoreCase(key)).map(k => s"did you mean $k?")
        .getOrElse("the state store's settings are in docs/state-store.md")
      Some(s"unknown setting $key (ignored); $hint")
    }

  private def warnUnknownKeys(hadoopConf: Configuration): Unit = {
    val fromHadoop = Option(hadoopConf).map(_.getPropsWithPrefix(KeyPrefix).asScala.keys)
      .getOrElse(Nil)
    val fromSpark = Option(SparkEnv.get).map(_.conf.getAllWithPrefix(KeyPrefix).map(_._1).toSeq)
      .getOrElse(Nil)
    for {
      key <- (fromHadoop ++ fromSpark).map(KeyPrefix + _)
      warning <- unknownKeyWarning(key)
      if warnedKeys.add(key)
    } logWarning(warning)
  }

  def from(hadoopConf: Configuration): QuorumConf = {
    warnUnknownKeys(hadoopConf)
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

    def positiveInt(key: String, default: Int): Int = {
      val value = positive(key, default.toLong)
      require(value <= Int.MaxValue, s"$key must be at most ${Int.MaxValue}, got $value")
      value.toInt
    }

    val addressList = get(Address, "127.0.0.1:6648")
    val addresses = addressList.split(",").map(_.trim).filter(_.nonEmpty).toSeq
    require(addresses.nonEmpty, s"$Address must name at least one host:port, got '$addressList'")
    addresses.foreach { a =>
      val (host, port) = (a.take(a.lastIndexOf(':')), a.drop(a.lastIndexOf(':') + 1))
      val validPort = port.nonEmpty && port.length <= 5 && port.forall(_.isDigit) &&
        (1 to 65535).contains(port.toInt)
      require(host.nonEmpty && !host.contains('/') && validPort,
        s"$Address must be host:port (comma-separated for several nodes), got '$a'")
    }
    val prefix = get(Prefix, "statestore").stripSuffix("/")
    require(!prefix.startsWith("/"), s"$Prefix must not start with '/', got '$prefix'")
    val chunkBytes = positiveInt(ChunkBytes, 1 << 20)
    val maxWriteBytes = positiveInt(MaxWriteBytes, 3 << 20)
    require(chunkBytes < maxWriteBytes, s"$ChunkBytes ($chunkBytes) must be below " +
      s"$MaxWriteBytes ($maxWriteBytes)")
    val timeoutMs = positive(TimeoutMs, 60000L)
    // Deadlines are System.nanoTime() + timeoutMs * 10^6, which must not overflow.
    require(timeoutMs <= MaxTimeoutMs, s"$TimeoutMs must be at most $MaxTimeoutMs (a year), " +
      s"got $timeoutMs")
    QuorumConf(
      addresses = addresses,
      namespace = get(Namespace, "default"),
      prefix = prefix,
      timeoutMs = timeoutMs,
      snapshotInterval = positiveInt(SnapshotInterval, 10),
      chunkBytes = chunkBytes,
      maxWriteBytes = maxWriteBytes,
      localDir = new File(get(LocalDir, defaultLocalDir)).getAbsoluteFile,
      security = WireSecurity(
        Option(get(TrustedCaFile, "")).filter(_.nonEmpty).map(new File(_).getAbsoluteFile),
        Option(get(Token, "")).filter(_.nonEmpty)))
  }

  /** A segment of a quorumstore key: no '/', which separates key levels. */
  def segment(s: String): String = s.replace('/', '_')
}
