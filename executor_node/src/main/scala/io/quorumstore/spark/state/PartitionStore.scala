package io.quorumstore.spark.state

import java.util.concurrent.{ExecutionException, ExecutorService, Executors, Future}

import scala.collection.mutable

import org.apache.spark.internal.Logging

import io.quorumstore.spark.state.StateKeys.{Delta, Snapshot}

/** A version of the partition kept on this executor: what `uid` names at `version`. */
final case class LocalCopy(version: Long, uid: String, map: StateMap)

/** Result of loading a version: the map, its checkpoint id, and where it came from. */
final case class Loaded(copy: LocalCopy, fromStore: Boolean, snapshotVersion: Option[Long])

/** What one commit shipped. */
final case class CommitStats(keys: Long, bytes: Long)

/** The partition's head moved after this attempt loaded its version: someone else committed. */
final class StateCommitConflictException(message: String) extends IllegalStateException(message)

/** Under checkpoint format v1, a query from another checkpoint location commits this state. */
final class CheckpointForkException(message: String) extends IllegalStateException(message)

/**
 * All reads and writes of one state-store partition in quorumstore (layout: StateKeys).
 *
 * Versions form a lineage: each commit of version v is stored under its own checkpoint id
 * and names its parent's id, so attempts that lost a race leave only unreachable records.
 * A commit is fenced on the head record: it puts the new head with `expected_version_id`
 * set to the head's version id seen when the attempt loaded its state. `checkpoint`, the
 * state checkpoint location of this provider's query, is recorded in every head it writes.
 */
final class PartitionStore(
    client: QuorumClient,
    val keys: StateKeys,
    conf: QuorumConf,
    checkpoint: String) extends Logging {

  private val pk = keys.partitionKey
  private def timeout = conf.timeoutMs

  /** The head and its record version id (for fencing), if any version was committed. */
  def readHead(): Option[(Head, Long)] =
    client.read(pk, Seq(keys.head), timeout).head.map(r => (Codec.decodeHead(r.value), r.versionId))

  /**
   * Headers of the complete commits with versions below `to`: (deltas from version 1,
   * snapshots). One list and one read: delta and snapshot keys have the same depth, so
   * the deltas' range and the snapshots' after it make one range.
   */
  private def headers(to: Long): (Map[(Long, String), CommitHeader], Map[(Long, String), CommitHeader]) = {
    val (start, _) = keys.versions(Delta, 1, to)
    val (_, end) = keys.versions(Snapshot, 0, to)
    val present = client.list(pk, start, end, timeout).flatMap(keys.parse)
      .filter(k => k.index == 0 && k.version < to)
    val records = client.read(pk, present.map(k => keys.chunk(k.kind, k.version, k.uid, 0)), timeout)
    val found = present.zip(records).collect { case (k, Some(r)) =>
      (k.kind, (k.version, k.uid) -> Codec.decodeHeader(r.value))
    }
    (found.collect { case (Delta, h) => h }.toMap, found.collect { case (Snapshot, h) => h }.toMap)
  }

  /** (version, uid) pairs from `top` downwards, as far as delta headers reach. */
  private def chain(top: (Long, String), deltas: Map[(Long, String), CommitHeader])
      : IndexedSeq[(Long, String)] = {
    val out = mutable.ArrayBuffer(top)
    while (out.last._1 > 0 && deltas.contains(out.last)) {
      out += ((out.last._1 - 1, deltas(out.last).parentUid))
    }
    out.toIndexedSeq
  }

  private def missing(version: Long, detail: String): Nothing =
    throw new IllegalStateException(s"version $version of state partition $pk cannot be " +
      s"rebuilt from quorumstore: $detail. Was the state deleted, or retained for fewer " +
      "versions than spark.sql.streaming.minBatchesToRetain?")

  /**
   * Version `version` (checkpoint id `uniqueId`, or the one on the head's lineage), built
   * from the local copy when it is on the lineage, else from the newest snapshot on it, plus
   * the deltas after that.
   */
  def load(
      version: Long,
      uniqueId: Option[String],
      head: Option[Head],
      local: Option[LocalCopy]): Loaded = {
    if (version == 0) {
      return Loaded(LocalCopy(0L, "", new StateMap(conf.localDir)), fromStore = false, None)
    }
    val top = topOf(version, uniqueId, head)
    if (top._1 == version && local.exists(l => (l.version, l.uid) == top)) {
      return Loaded(local.get, fromStore = false, None)
    }
    val Lineage(lineage, deltas, snapshots) = lineageOf(version, top)
    val target = lineage.head
    val localAt = local.map(l => lineage.indexOf((l.version, l.uid))).filter(_ >= 0)
    if (localAt.contains(0)) return Loaded(local.get, fromStore = false, None)

    val (startAt, base, snapshotVersion) = localAt match {
      case Some(i) => (i, local.get.map, None)
      case None =>
        val s = lineage.indexWhere(p => p._1 > 0 && snapshots.contains(p))
        if (s >= 0) (s, readSnapshot(lineage(s), snapshots(lineage(s))), Some(lineage(s)._1))
        else if (lineage.last._1 == 0) {
          (lineage.size - 1, new StateMap(conf.localDir, loading = true), None)
        }
        else missing(version, s"no snapshot and no delta for version ${lineage.last._1}")
    }
    applyDeltas(lineage.take(startAt), deltas, base)
    base.finishLoading()
    Loaded(LocalCopy(version, target._2, base), fromStore = true, snapshotVersion)
  }

  /** The commit `version` is found from: the checkpoint id given, else the head's lineage. */
  private def topOf(version: Long, uniqueId: Option[String], head: Option[Head]): (Long, String) =
    uniqueId.map(u => (version, u)).orElse(head.filter(_.version >= version)
      .map(h => (h.version, h.uid))).getOrElse {
      missing(version, s"the latest committed version is ${head.map(_.version).getOrElse("none")}")
    }

  /** `topOf`, reading the head when no checkpoint id names the version. */
  private def topOf(version: Long, uniqueId: Option[String]): (Long, String) =
    topOf(version, uniqueId, if (uniqueId.isDefined) None else readHead().map(_._1))

  /** `version`'s lineage (from it downwards, as far as delta headers reach) below `top`. */
  private def lineageOf(version: Long, top: (Long, String)): Lineage = {
    val (deltas, snapshots) = headers(top._1 + 1)
    val fromTop = chain(top, deltas)
    if (fromTop.size <= top._1 - version) {
      missing(version, s"the delta of version ${fromTop.last._1} (id ${fromTop.last._2}) is gone")
    }
    Lineage(fromTop.drop((top._1 - version).toInt), deltas, snapshots)
  }

  /**
   * Version `version` rebuilt from the snapshot of version `snapshotVersion` on its lineage
   * and the deltas after it, never from the local copy or another snapshot: what Spark's
   * state data source asks for with `snapshotStartBatchId`.
   */
  def replayFromSnapshot(
      snapshotVersion: Long,
      version: Long,
      snapshotUid: Option[String],
      uniqueId: Option[String]): LocalCopy = {
    if (snapshotVersion < 1 || snapshotVersion > version) {
      throw new IllegalArgumentException(s"cannot replay version $version of state partition " +
        s"$pk from the snapshot of version $snapshotVersion: the snapshot must be of a version " +
        s"from 1 to $version")
    }
    val Lineage(lineage, deltas, snapshots) = lineageOf(version, topOf(version, uniqueId))
    val at = (version - snapshotVersion).toInt
    val base = lineage.lift(at).filter(p => snapshots.contains(p) && snapshotUid.forall(_ == p._2))
      .getOrElse(throw new IllegalStateException(s"cannot rebuild version $version of state " +
        s"partition $pk from a snapshot: there is no snapshot of version $snapshotVersion on " +
        s"its lineage${snapshotUid.fold("")(u => s" with checkpoint id $u")}. Maintenance " +
        "writes one every spark.quorumstore.stateStore.snapshotInterval versions, of the " +
        "version committed last; name the batch of one that was written"))
    val map = readSnapshot(base, snapshots(base))
    applyDeltas(lineage.take(at), deltas, map)
    map.finishLoading()
    LocalCopy(version, lineage.head._2, map)
  }

  /**
   * The changes committed by versions `from` to `to` (checkpoint id of `to`: `uniqueId`, or
   * the head's lineage), oldest first, read 4 MiB of chunks at a time as the caller goes.
   */
  def changes(from: Long, to: Long, uniqueId: Option[String]): Iterator[Change] = {
    if (from < 1 || from > to) {
      throw new IllegalArgumentException(s"cannot read the changes of versions $from to $to " +
        s"of state partition $pk: versions start at 1 and the range must not be empty")
    }
    val Lineage(lineage, deltas, _) = lineageOf(to, topOf(to, uniqueId))
    val commits = lineage.take((to - from + 1).toInt).reverse
    commits.find(c => !deltas.contains(c)).foreach { case (v, u) =>
      missing(v, s"the delta of version $v (id $u) is gone")
    }
    chunks(Delta, commits.map(commit => (commit, deltas(commit).chunks))).flatMap {
      case (version, data) =>
        val collected = new ChangeCollector(version)
        Codec.readChunk(data, collected)
        collected.changes
    }
  }

  private def readSnapshot(at: (Long, String), header: CommitHeader): StateMap = {
    val map = new StateMap(conf.localDir, loading = true)
    applyChunks(Snapshot, Seq((at, header.chunks)), map)
    map
  }

  /** Applies the deltas of `path` (newest first) to `map`, oldest first. */
  private def applyDeltas(
      path: Seq[(Long, String)],
      deltas: Map[(Long, String), CommitHeader],
      map: StateMap): Unit =
    applyChunks(Delta, path.reverse.map(commit => (commit, deltas(commit).chunks)), map)

  /** Applies the data chunks (1 to n) of each `(commit, n)` to `map`, in order. */
  private def applyChunks(kind: String, commits: Seq[((Long, String), Int)], map: StateMap)
      : Unit = chunks(kind, commits).foreach { case (_, data) => Codec.readChunk(data, map) }

  /**
   * The data chunks (1 to n) of each `(commit, n)`, in order, with their commit's version,
   * read `ReadBytes` of chunks per request as the caller goes, the next request in flight
   * while one is used: a load holds little more than the map itself, which keeps most of it
   * on local disk.
   */
  private def chunks(kind: String, commits: Seq[((Long, String), Int)])
      : Iterator[(Long, Array[Byte])] = {
    val perRead = math.max(1, PartitionStore.ReadBytes / conf.chunkBytes)
    val groups = commits.flatMap { case ((version, uid), n) =>
      (1 to n).map(index => (version, uid, index))
    }.grouped(perRead).toVector
    def fetch(group: Seq[(Long, String, Int)]): Future[Seq[Option[Record]]] =
      PartitionStore.Reads.submit(() =>
        client.read(pk, group.map { case (v, u, i) => keys.chunk(kind, v, u, i) }, timeout))
    var next = groups.headOption.map(fetch)
    groups.indices.iterator.flatMap { g =>
      val records = try next.get.get() catch { case e: ExecutionException => throw e.getCause }
      next = groups.lift(g + 1).map(fetch)
      groups(g).zip(records).map {
        case ((version, _, _), Some(record)) => (version, record.value)
        case ((version, uid, index), None) =>
          missing(version, s"chunk $index of $kind $uid is gone")
      }
    }
  }

  /**
   * Commits `view`'s changes as version `version` with id `uid`, fenced on `seenHead`, the
   * head (and its record version id) when the attempt loaded its state (None: no head yet).
   * Data that does not fit one request goes ahead in unreachable chunks; the request that
   * moves the head is the commit point. `followsHead`: the version was found from the head
   * (checkpoint format v1), not named by its checkpoint id (v2).
   */
  def commit(
      version: Long,
      uid: String,
      parentUid: String,
      view: StateView,
      seenHead: Option[(Head, Long)],
      followsHead: Boolean): CommitStats = {
    if (followsHead) seenHead.foreach { case (head, _) => refuseFork(head, version, parentUid) }
    val sender = new ChunkSender(Delta, version, uid)
    val writer = new Codec.ChunkWriter(conf.chunkBytes, sender.add)
    view.replay(writer)
    writer.finish()
    val header = CommitHeader(parentUid, writer.chunks, writer.entries, writer.bytes)
    val last = Seq(
      PutOp(keys.chunk(Delta, version, uid, 0), Codec.encodeHeader(header), pk),
      PutOp(keys.head, Codec.encodeHead(Head(version, uid, checkpoint)), pk,
        Some(seenHead.map(_._2).getOrElse(-1L))))
    val (result, retried) = sender.finish(last)
    if (result.puts.last.status != OxiaStatus.Ok) {
      val committedAnyway = retried && readHead().exists(_._1 == Head(version, uid, checkpoint))
      if (!committedAnyway) {
        discard(Delta, version, uid)
        throw new StateCommitConflictException(s"quorumstore refused the commit of version " +
          s"$version of state partition $pk (${OxiaStatus.name(result.puts.last.status)} on " +
          s"its head): another attempt of this task, speculative or a zombie, committed after " +
          "this one loaded its state, and this attempt must not overwrite it")
      }
    }
    CommitStats(writer.entries, writer.bytes)
  }

  /**
   * Under format v1 a query's versions are the head's lineage, so two queries that share a
   * query id (a checkpoint and a copy of it, at other locations) would read each other's
   * commits. A head written from another location is taken over only by a commit that
   * continues it (a checkpoint moved, then restarted); a commit that does not means both
   * are running, and is refused before anything is written.
   */
  private def refuseFork(head: Head, version: Long, parentUid: String): Unit =
    if (head.checkpoint.nonEmpty && head.checkpoint != checkpoint && head.uid != parentUid) {
      throw new CheckpointForkException(s"state partition $pk was last committed (version " +
        s"${head.version}) by the query with state checkpoint ${head.checkpoint}, and this " +
        s"query (state checkpoint $checkpoint) would commit version $version without " +
        "continuing from it: two checkpoints with the same query id, one copied from the " +
        "other, are running on one state. Under checkpoint format v1 they would read each " +
        "other's state, so this commit is refused. Give the copy its own " +
        "spark.quorumstore.stateStore.prefix (its state then starts empty) or a fresh " +
        "checkpoint, or use checkpoint format v2 " +
        "(spark.sql.streaming.stateStore.checkpointFormatVersion=2), which keeps copies apart.")
    }

  /**
   * Writes snapshot (version, uid) of the entries `write` gives its sink, sending chunks as
   * they fill rather than holding the state's encoding; the header goes last. The number of
   * entries written.
   */
  def writeSnapshot(version: Long, uid: String, write: Codec.Sink => Unit): Long = {
    val sender = new ChunkSender(Snapshot, version, uid)
    val writer = new Codec.ChunkWriter(conf.chunkBytes, sender.add)
    write(writer)
    writer.finish()
    val header = CommitHeader("", writer.chunks, writer.entries, writer.bytes)
    sender.finish(Seq(PutOp(keys.chunk(Snapshot, version, uid, 0), Codec.encodeHeader(header), pk)))
    writer.entries
  }

  /**
   * Sends one commit's data chunks (numbered from 1 as they are added) in requests of at
   * most maxWriteBytes, then `last` with what is left, as the final request.
   */
  private final class ChunkSender(kind: String, version: Long, uid: String) {
    private val pending = mutable.ArrayBuffer.empty[PutOp]
    private var pendingBytes = 0L
    private var index = 0

    def add(chunk: Array[Byte]): Unit = {
      index += 1
      if (pending.nonEmpty && pendingBytes + chunk.length > conf.maxWriteBytes) send()
      pending += PutOp(keys.chunk(kind, version, uid, index), chunk, pk)
      pendingBytes += chunk.length
    }

    private def send(): Unit = {
      client.write(pk, pending.toSeq, Nil, timeout)
      pending.clear()
      pendingBytes = 0L
    }

    /** The final request's result, and whether it was sent more than once. */
    def finish(last: Seq[PutOp]): (WriteResult, Boolean) = {
      if (pending.nonEmpty && pendingBytes + last.map(_.value.length).sum > conf.maxWriteBytes) {
        send()
      }
      client.write(pk, (pending ++ last).toSeq, Nil, timeout)
    }
  }

  /** Best-effort removal of one commit's records (after losing a commit race). */
  private def discard(kind: String, version: Long, uid: String): Unit =
    try {
      val (_, end) = keys.dataChunks(kind, version, uid)
      client.write(pk, Nil, Seq(DeleteRangeOp(keys.chunk(kind, version, uid, 0), end)), timeout)
    } catch {
      case e: Exception => logWarning(s"could not remove the records of losing commit $uid: $e")
    }

  /**
   * Deletes what no version Spark may still ask for needs: every delta and snapshot older
   * than the newest snapshot on the head's lineage at or below head - minVersionsToRetain.
   */
  def cleanup(minVersionsToRetain: Int): Unit = readHead().foreach { case (head, _) =>
    val floor = head.version - minVersionsToRetain
    if (floor > 0) {
      val (deltas, snapshots) = headers(head.version + 1)
      chain((head.version, head.uid), deltas)
        .find(p => p._1 > 0 && p._1 <= floor && snapshots.contains(p)).foreach { case (keep, _) =>
          val (deltasFrom, deltasTo) = keys.versions(Delta, 0, keep + 1)
          val (snapsFrom, snapsTo) = keys.versions(Snapshot, 0, keep)
          client.write(pk, Nil, Seq(DeleteRangeOp(deltasFrom, deltasTo),
            DeleteRangeOp(snapsFrom, snapsTo)), timeout)
          logInfo(s"removed versions up to $keep of $pk (snapshot $keep kept)")
        }
    }
  }
}

/** A version's lineage (newest first) and the headers found while walking it. */
private final case class Lineage(
    commits: IndexedSeq[(Long, String)],
    deltas: Map[(Long, String), CommitHeader],
    snapshots: Map[(Long, String), CommitHeader])

/** One change a version committed: a put of `value`, or a delete when it is null. */
final case class Change(version: Long, family: String, key: Array[Byte], value: Array[Byte])

/** Collects the puts and deletes of a delta chunk; family creation and removal are not rows. */
private final class ChangeCollector(version: Long) extends Codec.Sink {
  val changes = scala.collection.mutable.ArrayBuffer.empty[Change]
  override def removeFamily(family: String): Unit = ()
  override def createFamily(family: String): Unit = ()
  override def put(family: String, key: Array[Byte], value: Array[Byte]): Unit =
    changes += Change(version, family, key, value)
  override def delete(family: String, key: Array[Byte]): Unit =
    changes += Change(version, family, key, null)
}

object PartitionStore {
  /** Bytes of chunks a load reads per request (two requests' worth are held at a time). */
  val ReadBytes: Int = 4 << 20

  /** Runs loads' read-ahead requests (daemon threads, created as loads need them). */
  private val Reads: ExecutorService = Executors.newCachedThreadPool { (task: Runnable) =>
    val thread = new Thread(task, "quorumstore-state-read-ahead")
    thread.setDaemon(true)
    thread
  }
}
