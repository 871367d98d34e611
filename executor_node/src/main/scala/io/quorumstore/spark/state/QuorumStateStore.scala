package io.quorumstore.spark.state

import java.util.{Map => JMap}

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, StateStore, StateStoreCheckpointInfo, StateStoreCustomMetric, StateStoreErrors, StateStoreId, StateStoreIterator, StateStoreMetrics, StateStoreProvider, UnsafeRowPair}
import org.apache.spark.sql.types.StructType

/**
 * One micro-batch's store for version `version`: reads and writes go to a StateView over
 * the partition's local copy; `commit` hands the changes to the provider, which ships them
 * as one replicated write and then applies them to the local copy.
 */
final class QuorumStateStore(
    provider: QuorumStateStoreProvider,
    override val version: Long,
    val baseUid: String,
    val view: StateView,
    val seenHead: Option[(Head, Long)],
    val followsHead: Boolean,
    val readOnly: Boolean,
    val forceSnapshot: Boolean,
    loadTimeMs: Long,
    storeLoads: Long) extends StateStore {

  private sealed trait Phase
  private case object Updating extends Phase
  private case object Committed extends Phase
  private case object Aborted extends Phase

  @volatile private var phase: Phase = Updating
  @volatile private var committedUid: Option[String] = None
  @volatile private var commitStats = CommitStats(0L, 0L)
  @volatile private var commitMs = 0L
  @volatile private var validated = false
  private val ended = new java.util.concurrent.atomic.AtomicBoolean(false)

  override def id: StateStoreId = provider.stateStoreId

  private def codec(family: String, op: String): FamilyCodec = {
    if (!provider.useColumnFamilies && family != StateStore.DEFAULT_COL_FAMILY_NAME) {
      throw StateStoreErrors.unsupportedOperationException(op,
        "column families are disabled for this state store")
    }
    val c = provider.codec(family)
    if (c == null || !view.familyExists(family)) {
      throw StateStoreErrors.unsupportedOperationOnMissingColumnFamily(op, family)
    }
    c
  }

  private def writable(op: String): Unit = {
    if (readOnly) throw new UnsupportedOperationException(s"$op on a read-only state store")
    if (phase != Updating) {
      throw new IllegalStateException(s"cannot $op: the store for version $version is $phase")
    }
  }

  private def multi(c: FamilyCodec, op: String): Unit =
    if (!c.multipleValues) {
      throw new IllegalStateException(s"$op needs a column family with multiple values per key")
    }

  // ------------------------------------------------------------------ reads

  override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow = {
    val c = codec(colFamilyName, "get")
    val value = c.values.decodeValue(view.get(colFamilyName, c.keys.encodeKey(key)))
    if (!validated && value != null && !provider.useColumnFamilies) {
      StateStoreProvider.validateStateRowFormat(key, c.keySchema, value, c.valueSchema, id,
        provider.storeConf)
      validated = true
    }
    value
  }

  override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] = {
    val c = codec(colFamilyName, "valuesIterator")
    multi(c, "valuesIterator")
    c.values.decodeValues(view.get(colFamilyName, c.keys.encodeKey(key)))
  }

  private def pairs(
      c: FamilyCodec,
      entries: Iterator[JMap.Entry[Array[Byte], Array[Byte]]]): StateStoreIterator[UnsafeRowPair] = {
    val pair = new UnsafeRowPair()
    new StateStoreIterator(entries.map { e =>
      pair.withRows(c.keys.decodeKey(e.getKey), c.values.decodeValue(e.getValue))
    })
  }

  private def multiPairs(
      c: FamilyCodec,
      entries: Iterator[JMap.Entry[Array[Byte], Array[Byte]]]): StateStoreIterator[UnsafeRowPair] = {
    val pair = new UnsafeRowPair()
    new StateStoreIterator(entries.flatMap { e =>
      val key = c.keys.decodeKey(e.getKey).copy()
      c.values.decodeValues(e.getValue).map(v => pair.withRows(key, v))
    })
  }

  override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    pairs(codec(colFamilyName, "iterator"), view.scan(colFamilyName, None, None))

  override def iteratorWithMultiValues(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    val c = codec(colFamilyName, "iteratorWithMultiValues")
    multi(c, "iteratorWithMultiValues")
    multiPairs(c, view.scan(colFamilyName, None, None))
  }

  private def prefixEntries(c: FamilyCodec, prefixKey: UnsafeRow, family: String) = {
    if (!c.keys.supportPrefixKeyScan) {
      throw StateStoreErrors.unsupportedOperationException("prefixScan",
        "the key encoder of this column family has no prefix key")
    }
    val prefix = c.keys.encodePrefixKey(prefixKey)
    view.scan(family, Some(prefix), Bytes.prefixEnd(prefix))
  }

  override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = {
    val c = codec(colFamilyName, "prefixScan")
    pairs(c, prefixEntries(c, prefixKey, colFamilyName))
  }

  override def prefixScanWithMultiValues(prefixKey: UnsafeRow, colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = {
    val c = codec(colFamilyName, "prefixScanWithMultiValues")
    multi(c, "prefixScanWithMultiValues")
    multiPairs(c, prefixEntries(c, prefixKey, colFamilyName))
  }

  private def rangeEntries(
      c: FamilyCodec,
      start: Option[UnsafeRow],
      end: Option[UnsafeRow],
      family: String) = {
    if (!c.keys.supportsRangeScan) {
      throw StateStoreErrors.unsupportedOperationException("rangeScan",
        "the key encoder of this column family does not order keys for range scans")
    }
    view.scan(family, start.map(c.keys.encodeKey), end.map(c.keys.encodeKey))
  }

  override def rangeScan(start: Option[UnsafeRow], end: Option[UnsafeRow], colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = {
    val c = codec(colFamilyName, "rangeScan")
    pairs(c, rangeEntries(c, start, end, colFamilyName))
  }

  override def rangeScanWithMultiValues(
      start: Option[UnsafeRow],
      end: Option[UnsafeRow],
      colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    val c = codec(colFamilyName, "rangeScanWithMultiValues")
    multi(c, "rangeScanWithMultiValues")
    multiPairs(c, rangeEntries(c, start, end, colFamilyName))
  }

  override def allColumnFamilyNames: Set[String] = view.familyNames

  // ----------------------------------------------------------------- writes

  override def put(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = {
    writable("put")
    require(value != null, "Cannot put a null value")
    val c = codec(colFamilyName, "put")
    view.put(colFamilyName, c.keys.encodeKey(key), c.values.encodeValue(value))
  }

  override def remove(key: UnsafeRow, colFamilyName: String): Unit = {
    writable("remove")
    val c = codec(colFamilyName, "remove")
    view.delete(colFamilyName, c.keys.encodeKey(key))
  }

  override def merge(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit =
    mergeList(key, Array(value), colFamilyName)

  override def mergeList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = {
    writable("merge")
    val c = codec(colFamilyName, "merge")
    multi(c, "merge")
    require(values.forall(_ != null), "Cannot merge a null value")
    val k = c.keys.encodeKey(key)
    view.put(colFamilyName, k, values.foldLeft(view.get(colFamilyName, k)) { (acc, v) =>
      FamilyCodec.appendValue(acc, c.values.encodeValue(v))
    })
  }

  override def putList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = {
    writable("putList")
    val c = codec(colFamilyName, "putList")
    multi(c, "putList")
    require(values.nonEmpty && values.forall(_ != null), "Cannot put an empty or null value list")
    view.put(colFamilyName, c.keys.encodeKey(key), values.map(c.values.encodeValue)
      .reduceLeft(FamilyCodec.appendValue))
  }

  override def deleteRange(begin: UnsafeRow, end: UnsafeRow, colFamilyName: String): Unit = {
    writable("deleteRange")
    val c = codec(colFamilyName, "deleteRange")
    view.scan(colFamilyName, Some(c.keys.encodeKey(begin)), Some(c.keys.encodeKey(end)))
      .map(_.getKey).toVector.foreach(view.delete(colFamilyName, _))
  }

  override def createColFamilyIfAbsent(
      colFamilyName: String,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useMultipleValuesPerKey: Boolean,
      isInternal: Boolean): Unit = {
    provider.checkFamilyName("create_col_family", colFamilyName, isInternal)
    provider.registerFamily(colFamilyName, keyStateEncoderSpec, valueSchema,
      useMultipleValuesPerKey)
    if (!readOnly) view.createFamily(colFamilyName)
  }

  override def removeColFamilyIfExists(colFamilyName: String): Boolean = {
    provider.checkFamilyName("remove_col_family", colFamilyName, isInternal = true)
    writable("removeColFamilyIfExists")
    view.removeFamily(colFamilyName)
  }

  // --------------------------------------------------------------- lifecycle

  override def commit(): Long = {
    writable("commit")
    val started = System.nanoTime()
    val (uid, stats) = provider.commit(this)
    commitMs = (System.nanoTime() - started) / 1000000L
    committedUid = Some(uid)
    commitStats = stats
    phase = Committed
    end()
    version + 1
  }

  override def abort(): Unit = {
    if (phase == Updating) phase = Aborted
    if (!readOnly) provider.releaseWriter(this)
    end()
  }

  private def end(): Unit = if (ended.compareAndSet(false, true)) provider.storeEnded(view.base)

  override def release(): Unit = abort()

  override def hasCommitted: Boolean = phase == Committed

  override def metrics: StateStoreMetrics = {
    val custom: Map[StateStoreCustomMetric, Long] = Map(
      StoreMetrics.CommitLatency -> commitMs,
      StoreMetrics.CommitKeys -> commitStats.keys,
      StoreMetrics.CommitBytes -> commitStats.bytes,
      StoreMetrics.LoadTime -> loadTimeMs,
      StoreMetrics.StoreLoads -> storeLoads,
      StoreMetrics.LocalDiskBytes -> view.base.diskBytes)
    StateStoreMetrics(view.base.numKeys, view.base.estimatedHeapBytes, custom)
  }

  override def getStateStoreCheckpointInfo(): StateStoreCheckpointInfo =
    StateStoreCheckpointInfo(id.partitionId, version + 1, committedUid,
      Some(baseUid).filter(_.nonEmpty))

  override def toString: String =
    s"QuorumStateStore[${provider.partitionKey}, version=$version, $phase]"
}
