package io.quorumstore.spark.state

import java.util.concurrent.{ConcurrentHashMap, Executors, ScheduledExecutorService, ThreadFactory, TimeUnit}
import java.util.concurrent.atomic.AtomicBoolean

import scala.util.control.NonFatal

import org.apache.spark.internal.Logging

/**
 * A small Oxia-protocol client for the state store: routes a partition key to its shard
 * (low 32 bits of XXH3-64 over the assignment hash ranges, Oxia's rule), sends each request
 * to that shard's leader, and on leader changes or unreachable nodes refreshes the
 * assignments (from any configured or previously known node) and retries until the
 * operation's time budget is spent. One instance per (addresses, namespace) per JVM.
 *
 * A leader that was paused, or cut off from the coordinator and its followers, may keep
 * a call waiting for as long as the fault lasts, and its own map still names it. So
 * while a call waits longer than `LeaderCheckMs`, the other known nodes are asked for
 * their maps (every `LeaderRecheckMs`); when those that answer agree on another leader
 * for the shard, the call is cancelled and retried there, as after any retryable failure.
 */
final class QuorumClient private (
    val addresses: Seq[String], val namespace: String, security: WireSecurity) extends Logging {
  private val connections = new ConcurrentHashMap[String, OxiaWire.Connection]()
  @volatile private var assignments: Seq[ShardAssignment] = Nil

  private def connection(address: String): OxiaWire.Connection =
    connections.computeIfAbsent(address, a => OxiaWire.connect(a, security))

  /** The shard holding every record written with `partitionKey`. */
  def shardFor(partitionKey: String, timeoutMs: Long): ShardAssignment = {
    if (assignments.isEmpty) refresh(System.nanoTime() + timeoutMs * 1000000L)
    route(partitionKey)
  }

  private def route(partitionKey: String): ShardAssignment = {
    val hash = Xxh3.hash64(partitionKey) & 0xffffffffL
    assignments.find(a => a.minHash <= hash && hash <= a.maxHash).getOrElse(
      throw new IllegalStateException(s"no shard of namespace '$namespace' covers hash $hash; " +
        s"assignments: ${assignments.mkString(", ")}"))
  }

  /** Fetches assignments from the configured nodes, then from any leader seen before. */
  private def refresh(deadlineNanos: Long): Unit = synchronized {
    val candidates = (addresses ++ assignments.map(_.leader).filter(_.nonEmpty)).distinct.iterator
    var fresh: Seq[ShardAssignment] = Nil
    var lastError: Throwable = null
    while (fresh.isEmpty && candidates.hasNext) {
      val address = candidates.next()
      try {
        fresh = OxiaWire.shardAssignments(connection(address), namespace,
          math.min(remainingMs(deadlineNanos), 10000L))
        if (fresh.isEmpty) lastError = new IllegalStateException(s"$address sent no shards")
      } catch {
        case e: WireException if e.namespaceNotFound =>
          throw new IllegalArgumentException(s"${QuorumConf.Namespace}: the quorumstore " +
            s"cluster at $address has no namespace '$namespace' (${e.description})", e)
        case e: WireException if e.refusedCredentials =>
          throw new SecurityException(s"the quorumstore cluster at $address refused this " +
            s"application's credentials (${QuorumConf.Token}, ${QuorumConf.TrustedCaFile}): " +
            e.getMessage, e)
        case NonFatal(e) => lastError = e
      }
    }
    if (fresh.isEmpty) {
      throw new QuorumUnavailableException(describe("fetching shard assignments") + ": " +
        String.valueOf(lastError.getMessage), lastError)
    }
    assignments = fresh
  }

  private def remainingMs(deadlineNanos: Long): Long =
    math.max(1L, (deadlineNanos - System.nanoTime()) / 1000000L)

  private def describe(what: String): String =
    s"quorumstore cluster at ${addresses.mkString(",")} (namespace '$namespace') failed " +
      s"while $what"

  /**
   * Runs `op` against the leader of `partitionKey`'s shard, retrying retryable failures with
   * backoff until `timeoutMs` is spent. `op` gets the connection, shard, remaining ms and
   * whether this is a retry.
   */
  private def withLeader[T](partitionKey: String, timeoutMs: Long, what: String)(
      op: (OxiaWire.Connection, Long, Long, Boolean) => T): T = {
    val deadline = System.nanoTime() + timeoutMs * 1000000L
    var attempt = 0
    var backoffMs = 50L
    var lastError: Throwable = null
    val moved = new AtomicBoolean(false)
    while (true) {
      val outOfTime = attempt > 0 && System.nanoTime() + backoffMs * 1000000L >= deadline
      if (outOfTime) {
        throw new QuorumUnavailableException(
          describe(what) + s" for $timeoutMs ms (spark.quorumstore.timeoutMs); last error: " +
            String.valueOf(lastError.getMessage), lastError)
      }
      if (attempt > 0 && !moved.get()) {
        Thread.sleep(backoffMs)
        backoffMs = math.min(backoffMs * 2, 1000L)
      }
      try {
        // After a leader check moved the shard, its map is the news: the configured node
        // asked first by refresh may be the deposed leader itself.
        if ((attempt > 0 && !moved.get()) || assignments.isEmpty) refresh(deadline)
        moved.set(false)
        val target = route(partitionKey)
        if (target.leader.isEmpty) {
          throw new WireException("UNAVAILABLE", s"shard ${target.shard} has no leader yet " +
            "(election in progress)", None, null)
        }
        return OxiaWire.abandonable(abandon => watchLeader(target, moved, abandon)) {
          op(connection(target.leader), target.shard, remainingMs(deadline), attempt > 0)
        }
      } catch {
        case e: WireException if e.retryable =>
          logInfo(s"retrying after ${e.getMessage} ($what)")
          lastError = e
        case e: QuorumUnavailableException =>
          lastError = Option(e.getCause).getOrElse(e)
      }
      attempt += 1
    }
    throw new AssertionError("unreachable")
  }

  /** Checks every LeaderCheckMs, while the call to `target` runs, whether the other nodes
   * know another leader of its shard; if so installs their map, sets `moved` and abandons
   * the call. Returns what stops the checks. */
  private def watchLeader(
      target: ShardAssignment, moved: AtomicBoolean, abandon: () => Unit): () => Unit = {
    val check: Runnable = () =>
      if (!moved.get()) newerLeaderElsewhere(target).foreach { fresh =>
        assignments = fresh
        moved.set(true)
        logInfo(s"shard ${target.shard}: the other nodes name " +
          s"${fresh.find(_.shard == target.shard).map(_.leader).getOrElse("")} as leader, not " +
          s"${target.leader}; retrying there")
        abandon()
      }
    val scheduled = QuorumClient.leaderChecks.scheduleWithFixedDelay(
      check, QuorumClient.LeaderCheckMs, QuorumClient.LeaderRecheckMs, TimeUnit.MILLISECONDS)
    () => scheduled.cancel(false)
  }

  /** The map of the other nodes, when every one that answers names the same leader of
   * `target`'s shard and it is not `target`'s. */
  private def newerLeaderElsewhere(target: ShardAssignment): Option[Seq[ShardAssignment]] = {
    val others = (addresses ++ assignments.map(_.leader))
      .filter(a => a.nonEmpty && a != target.leader).distinct
    val maps = others.flatMap { address =>
      try Some(OxiaWire.shardAssignments(connection(address), namespace,
        QuorumClient.LeaderCheckMs))
      catch { case NonFatal(_) => None }
    }
    val named = maps.map(_.find(_.shard == target.shard).map(_.leader).getOrElse("")).distinct
    if (named.size == 1 && named.head.nonEmpty && named.head != target.leader) maps.headOption
    else None
  }

  /**
   * One replicated write to the shard of `partitionKey`. The flag is true when the request
   * was sent more than once, so an earlier attempt may already have been applied.
   */
  def write(
      partitionKey: String,
      puts: Seq[PutOp],
      deleteRanges: Seq[DeleteRangeOp],
      timeoutMs: Long): (WriteResult, Boolean) =
    withLeader(partitionKey, timeoutMs, s"writing under $partitionKey") {
      (conn, shard, remaining, retried) =>
        (OxiaWire.write(conn, shard, puts, deleteRanges, remaining), retried)
    }

  /** Point reads of `keys` (all under `partitionKey`), in order; None where absent. */
  def read(partitionKey: String, keys: Seq[String], timeoutMs: Long): Seq[Option[Record]] =
    if (keys.isEmpty) Nil
    else withLeader(partitionKey, timeoutMs, s"reading ${keys.size} key(s) from ${keys.head}") {
      (conn, shard, remaining, _) => OxiaWire.read(conn, shard, keys, remaining)
    }

  def rangeScan(partitionKey: String, start: String, end: String, timeoutMs: Long): Vector[Record] =
    withLeader(partitionKey, timeoutMs, s"scanning [$start, $end)") {
      (conn, shard, remaining, _) => OxiaWire.rangeScan(conn, shard, start, end, remaining)
    }

  def list(partitionKey: String, start: String, end: String, timeoutMs: Long): Vector[String] =
    withLeader(partitionKey, timeoutMs, s"listing [$start, $end)") {
      (conn, shard, remaining, _) => OxiaWire.list(conn, shard, start, end, remaining)
    }
}

/** The cluster could not be reached (or kept failing) within the configured time budget. */
final class QuorumUnavailableException(message: String, cause: Throwable)
  extends RuntimeException(message + ". Check spark.quorumstore.address and that the " +
    "quorumstore cluster is running and reachable from the executors.", cause)

object QuorumClient {
  /** How long a call waits on a shard's leader before the other nodes are asked whether
   * another leads it, and how often again: a healthy leader answers in milliseconds, and
   * a new one is found soon after its election. */
  val LeaderCheckMs = 300L
  val LeaderRecheckMs = 100L

  /** Runs the leader checks of every client in the JVM (daemon threads). */
  private lazy val leaderChecks: ScheduledExecutorService =
    Executors.newScheduledThreadPool(2, new ThreadFactory {
      override def newThread(r: Runnable): Thread = {
        val thread = new Thread(r, "quorumstore-leader-check")
        thread.setDaemon(true)
        thread
      }
    })

  private val clients =
    new ConcurrentHashMap[(Seq[String], String, WireSecurity), QuorumClient]()

  /** The JVM-wide client for `addresses` (comma-separated "host:port") and `namespace`,
   * secured by `security`. */
  def shared(addresses: Seq[String], namespace: String, security: WireSecurity): QuorumClient =
    clients.computeIfAbsent((addresses, namespace, security),
      k => new QuorumClient(k._1, k._2, k._3))
}
