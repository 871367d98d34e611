package io.quorumstore.spark.state

import java.util.UUID
import java.util.concurrent.{ConcurrentHashMap, Semaphore, TimeUnit}

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import org.apache.spark.TaskContext
import org.apache.spark.quorumstore.ChangeIterator
import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, ReadStateStore, RecordType, StateSchemaProvider, StateStore, StateStoreConf, StateStoreCustomMetric, StateStoreErrors, StateStoreId, StateStoreProvider, SupportsFineGrainedReplay}
import org.apache.spark.sql.types.StructType

/**
 * A StateStoreProvider whose versions live in quorumstore, Oxia's client protocol spoken
 * from the JVM. Set `spark.sql.streaming.stateStore.providerClass` to this class and
 * `spark.quorumstore.address` to any node of the cluster.
 *
 * Each commit is one fenced, replicated write of the batch's changes (PartitionStore).
 * The partition's state stays on the executor between micro-batches (the local copy), so a batch
 * on the same executor reads nothing but the head from the cluster; a task landing on a new
 * executor loads the newest snapshot and the deltas after it in bulk.
 *
 * Spark's state data source (`spark.read.format("statestore")`) reads the state of any
 * retained version, its changes (`readChangeFeed`, from the stored deltas) and a version
 * rebuilt from one chosen snapshot (`snapshotStartBatchId`).
 */
class QuorumStateStoreProvider
    extends StateStoreProvider with SupportsFineGrainedReplay with Logging {
  private var id: StateStoreId = _
  private var hadoopConf: Configuration = _
  private var conf: QuorumConf = _
  private var partition: PartitionStore = _
  private[state] var storeConf: StateStoreConf = _
  private[state] var useColumnFamilies = false
  private val codecs = new ConcurrentHashMap[String, FamilyCodec]()

  // Guarded by `this`: loading, applying a commit and encoding a snapshot exclude each other.
  private var local: Option[LocalCopy] = None
  // Guarded by `this`: how many stores not yet ended read each map (by identity). A map that
  // is no longer the local copy is closed when its last store ends, which frees its files'
  // disk space at once (they are unlinked) instead of whenever the JDK collects them.
  private val storesOn = new java.util.IdentityHashMap[StateMap, Integer]()
  private var lastSnapshotVersion = 0L
  // Loads not yet reported: a batch's read store loads, its write store reports.
  private var unreportedLoadMs = 0L
  private var unreportedLoads = 0L

  // One writing store at a time shares the local copy; others wait for it.
  private val writer = new Semaphore(1)
  @volatile private var writerOwner: QuorumStateStore = _

  override def init(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useColumnFamilies: Boolean,
      storeConf: StateStoreConf,
      hadoopConf: Configuration,
      useMultipleValuesPerKey: Boolean,
      stateSchemaProvider: Option[StateSchemaProvider]): Unit = {
    require(!useMultipleValuesPerKey || useColumnFamilies,
      "multiple values per key need column families, as with the RocksDB provider")
    this.id = stateStoreId
    this.storeConf = storeConf
    this.hadoopConf = hadoopConf
    this.useColumnFamilies = useColumnFamilies
    this.conf = QuorumConf.from(hadoopConf)
    // Only a load in bulk writes there, which may come hours later (on a restart): a
    // directory that cannot be written to fails the query now, naming the setting.
    FamilyMap.localFile(conf.localDir).close()
    markPartition(stateStoreId, hadoopConf)
    val client = QuorumClient.shared(conf.addresses, conf.namespace, conf.security)
    partition = new PartitionStore(client,
      new StateKeys(PartitionKey(conf, stateStoreId, hadoopConf)), conf,
      stateStoreId.checkpointRootLocation)
    registerFamily(StateStore.DEFAULT_COL_FAMILY_NAME, keyStateEncoderSpec, valueSchema,
      useMultipleValuesPerKey)
  }

  /**
   * Creates the store's directory in the state checkpoint, which holds nothing here: Spark's
   * state data source finds a query's partitions by listing those directories, as the
   * file-based providers leave them, and would read only those Spark made itself.
   */
  private def markPartition(stateStoreId: StateStoreId, hadoopConf: Configuration): Unit = {
    val dir = new Path(stateStoreId.storeCheckpointLocation().toString)
    try dir.getFileSystem(hadoopConf).mkdirs(dir)
    catch {
      case NonFatal(e) => logWarning(s"cannot create $dir ($e): Spark's state data source " +
        s"will not list partition ${stateStoreId.partitionId} of this state")
    }
  }

  override def stateStoreId: StateStoreId = id

  def partitionKey: String = partition.keys.partitionKey

  override def supportedCustomMetrics: Seq[StateStoreCustomMetric] = StoreMetrics.All

  private[state] def codec(family: String): FamilyCodec = codecs.get(family)

  private[state] def registerFamily(
      family: String,
      spec: KeyStateEncoderSpec,
      valueSchema: StructType,
      multipleValues: Boolean): Unit =
    codecs.computeIfAbsent(family, _ => FamilyCodec(spec, valueSchema, multipleValues))

  /** The checks (and errors) of the RocksDB provider for creating and removing families. */
  private[state] def checkFamilyName(op: String, family: String, isInternal: Boolean): Unit = {
    if (!useColumnFamilies) {
      throw StateStoreErrors.unsupportedOperationException(op,
        "column families are disabled for this state store")
    }
    if (family == null || family.trim.isEmpty || family == StateStore.DEFAULT_COL_FAMILY_NAME) {
      throw StateStoreErrors.cannotUseColumnFamilyWithInvalidName(op, family)
    }
    if (!isInternal && family.charAt(0) == '$') {
      throw StateStoreErrors.cannotCreateColumnFamilyWithReservedChars(family)
    }
  }

  override def getStore(
      version: Long,
      uniqueId: Option[String],
      forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): StateStore = {
    require(version >= 0, s"state store version must not be negative, got $version")
    val started = System.nanoTime()
    // The fencing token is the head as this attempt first sees it, before any waiting.
    val head = partition.readHead()
    if (!writer.tryAcquire(conf.timeoutMs, TimeUnit.MILLISECONDS)) {
      throw new IllegalStateException(s"state partition $partitionKey is still being written " +
        s"by $writerOwner on this executor after ${conf.timeoutMs} ms")
    }
    try {
      val copy =
        if (loadEmpty) LocalCopy(version, uniqueId.getOrElse(""), new StateMap(conf.localDir))
        else load(version, uniqueId, head.map(_._1), started)
      val (loadMs, loads) = takeLoadStats()
      val store = new QuorumStateStore(this, version, copy.uid, new StateView(copy.map), head,
        followsHead = !storeConf.enableStateStoreCheckpointIds, readOnly = false,
        forceSnapshotOnCommit, loadMs, loads)
      storeOpened(copy.map)
      writerOwner = store
      Option(TaskContext.get()).foreach(_.addTaskCompletionListener[Unit] { _ =>
        if (!store.hasCommitted) store.abort()
      })
      store
    } catch {
      case NonFatal(e) =>
        writer.release()
        throw e
    }
  }

  override def getReadStore(version: Long, uniqueId: Option[String]): ReadStateStore = {
    require(version >= 0, s"state store version must not be negative, got $version")
    val started = System.nanoTime()
    val head = if (uniqueId.isDefined || version == 0) None else partition.readHead().map(_._1)
    val copy = load(version, uniqueId, head, started)
    readStore(version, copy)
  }

  private def readStore(version: Long, copy: LocalCopy): QuorumStateStore = {
    storeOpened(copy.map)
    new QuorumStateStore(this, version, copy.uid, new StateView(copy.map), seenHead = None,
      followsHead = false, readOnly = true, forceSnapshot = false, loadTimeMs = 0L,
      storeLoads = 0L)
  }

  private def storeOpened(map: StateMap): Unit = synchronized {
    storesOn.put(map, Option(storesOn.get(map)).fold(1)(_ + 1))
  }

  /** A store over `map` committed, aborted or was released (once per store). */
  private[state] def storeEnded(map: StateMap): Unit = synchronized {
    val left = storesOn.get(map) - 1
    if (left > 0) storesOn.put(map, left)
    else {
      storesOn.remove(map)
      if (!local.exists(_.map eq map)) map.close()
    }
  }

  /** Makes `next` the local copy, closing the one it replaces if no store reads it. */
  private def setLocal(next: Option[LocalCopy]): Unit = synchronized {
    for (old <- local if !next.exists(_.map eq old.map) && !storesOn.containsKey(old.map)) {
      old.map.close()
    }
    local = next
  }

  /** A read-only store of `endVersion` rebuilt from the snapshot of `snapshotVersion`. */
  override def replayStateFromSnapshot(
      snapshotVersion: Long,
      endVersion: Long,
      readOnly: Boolean,
      snapshotVersionStateStoreCkptId: Option[String],
      endVersionStateStoreCkptId: Option[String]): StateStore = {
    if (!readOnly) {
      throw new UnsupportedOperationException("the quorumstore state store provider replays " +
        "state from a snapshot for reading only (the state data source's snapshotStartBatchId)")
    }
    val copy = synchronized {
      val replayed = partition.replayFromSnapshot(snapshotVersion, endVersion,
        snapshotVersionStateStoreCkptId, endVersionStateStoreCkptId)
      setLocal(Some(replayed))
      replayed
    }
    readStore(endVersion, copy)
  }

  /**
   * The puts and deletes committed by versions `startVersion` to `endVersion`, oldest first,
   * each with its batch id (version - 1), as the RocksDB provider's changelog reader gives them.
   */
  override def getStateStoreChangeDataReader(
      startVersion: Long,
      endVersion: Long,
      colFamilyNameOpt: Option[String],
      endVersionStateStoreCkptId: Option[String])
      : ChangeIterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] = {
    val family = colFamilyNameOpt.getOrElse(StateStore.DEFAULT_COL_FAMILY_NAME)
    val c = Option(codec(family)).getOrElse(
      throw StateStoreErrors.unsupportedOperationOnMissingColumnFamily("change feed", family))
    new ChangeIterator(partition.changes(startVersion, endVersion, endVersionStateStoreCkptId)
      .filter(_.family == family).map { change =>
        val key = c.keys.decodeKey(change.key).copy()
        if (change.value == null) (RecordType.DELETE_RECORD, key, null, change.version - 1)
        else {
          (RecordType.PUT_RECORD, key, c.values.decodeValue(change.value).copy(),
            change.version - 1)
        }
      })
  }

  /** `version` as the local copy; `started` is when the caller began (for the load time). */
  private def load(version: Long, uniqueId: Option[String], head: Option[Head], started: Long)
      : LocalCopy = synchronized {
    val loaded =
      try partition.load(version, uniqueId, head, local)
      catch {
        case NonFatal(e) =>
          setLocal(None) // a failed incremental load may have changed it halfway
          throw e
      }
    setLocal(Some(loaded.copy))
    loaded.snapshotVersion.foreach(v => lastSnapshotVersion = v)
    if (loaded.fromStore) {
      unreportedLoadMs += (System.nanoTime() - started) / 1000000L
      unreportedLoads += 1
      logInfo(s"loaded version $version of $partitionKey from quorumstore " +
        s"(${loaded.copy.map.numKeys} keys)")
    }
    loaded.copy
  }

  private def takeLoadStats(): (Long, Long) = synchronized {
    val stats = (unreportedLoadMs, unreportedLoads)
    unreportedLoadMs = 0L
    unreportedLoads = 0L
    stats
  }

  /** Ships `store`'s changes as the next version, then folds them into the local copy. */
  private[state] def commit(store: QuorumStateStore): (String, CommitStats) = {
    val newVersion = store.version + 1
    val uid = UUID.randomUUID().toString
    val stats = partition.commit(newVersion, uid, store.baseUid, store.view, store.seenHead,
      store.followsHead)
    synchronized {
      store.view.replay(store.view.base)
      setLocal(Some(LocalCopy(newVersion, uid, store.view.base)))
    }
    if (storeConf.commitValidationEnabled) {
      StateStore.reportCommitToCoordinator(newVersion, id, hadoopConf)
    }
    releaseWriter(store)
    if (store.forceSnapshot) snapshot(force = true)
    (uid, stats)
  }

  private[state] def releaseWriter(store: QuorumStateStore): Unit = synchronized {
    if (writerOwner eq store) {
      writerOwner = null
      writer.release()
    }
  }

  /**
   * Writes a snapshot of the local copy when `snapshotInterval` versions have passed: frozen
   * under the state lock, encoded and sent without it, so commits go on meanwhile.
   */
  private def snapshot(force: Boolean): Unit = {
    val due = synchronized {
      local.filter(l => l.version > lastSnapshotVersion &&
        (force || l.version - lastSnapshotVersion >= conf.snapshotInterval))
        .map(l => (l, l.map.frozen()))
    }
    due.foreach { case (l, entries) =>
      val written = partition.writeSnapshot(l.version, l.uid, entries)
      synchronized { lastSnapshotVersion = math.max(lastSnapshotVersion, l.version) }
      logInfo(s"wrote snapshot of version ${l.version} of $partitionKey ($written keys)")
    }
  }

  // Spark 4.3's maintenance thread runs the snapshot and the cleanup as separate operations,
  // on separate pools, and calls doMaintenance only when it unloads a provider.

  /** Snapshots the local copy when due. */
  override def doSnapshotMaintenance(): Unit = maintain("snapshot")(snapshot(force = false))

  /** Drops the versions Spark can no longer ask for. */
  override def doCleanupMaintenance(): Unit =
    maintain("cleanup")(partition.cleanup(storeConf.minVersionsToRetain))

  override def doMaintenance(): Unit = {
    doSnapshotMaintenance()
    doCleanupMaintenance()
  }

  private def maintain(what: String)(work: => Unit): Unit = if (partition != null) {
    try work catch {
      // The next round retries; failing here would only unload the provider.
      case NonFatal(e) => logWarning(s"$what maintenance of $partitionKey failed: $e")
    }
  }

  override def close(): Unit = synchronized {
    local.foreach(_.map.close())
    local = None
  }

  override def toString: String = s"QuorumStateStoreProvider[$partitionKey]"
}
