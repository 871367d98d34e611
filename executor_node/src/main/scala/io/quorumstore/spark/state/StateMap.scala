package io.quorumstore.spark.state

import java.util.{Comparator, Map => JMap}
import java.util.concurrent.{ConcurrentHashMap, ConcurrentSkipListMap}

import scala.jdk.CollectionConverters._

/** Encoded keys sort as unsigned bytes, like RocksDB's default comparator. */
object Bytes {
  type SortedBytes = ConcurrentSkipListMap[Array[Byte], Array[Byte]]

  val Order: Comparator[Array[Byte]] = (a, b) => java.util.Arrays.compareUnsigned(a, b)

  def newMap(): SortedBytes = new ConcurrentSkipListMap[Array[Byte], Array[Byte]](Order)

  /** The least key above every key starting with `prefix`; None when there is none. */
  def prefixEnd(prefix: Array[Byte]): Option[Array[Byte]] = {
    var i = prefix.length - 1
    while (i >= 0 && prefix(i) == 0xff.toByte) i -= 1
    if (i < 0) None
    else {
      val end = java.util.Arrays.copyOf(prefix, i + 1)
      end(i) = (end(i) + 1).toByte
      Some(end)
    }
  }

  /** Entries of `map` in [from, to), either bound optional. */
  def range(map: SortedBytes, from: Option[Array[Byte]], to: Option[Array[Byte]])
      : java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]] = ((from, to) match {
    case (Some(f), Some(t)) =>
      if (Order.compare(f, t) >= 0) Bytes.newMap() else map.subMap(f, true, t, false)
    case (Some(f), None) => map.tailMap(f, true)
    case (None, Some(t)) => map.headMap(t, false)
    case (None, None) => map
  }).entrySet().iterator()

  /** Rough heap bytes of one entry: two arrays plus skip-list node and index share. */
  def entryHeapBytes(key: Array[Byte], value: Array[Byte]): Long =
    align(16 + key.length) + align(16 + value.length) + 48

  private def align(n: Long): Long = (n + 7) & ~7L

  /** Marks a removed key in a map of changes; compared by reference. */
  val Tombstone: Array[Byte] = new Array[Byte](0)

  /** Merges two sorted entry iterators; `overlay` wins on equal keys, tombstones are skipped. */
  def merged(
      base: java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]],
      overlay: java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]])
      : Iterator[JMap.Entry[Array[Byte], Array[Byte]]] = new Merged(base, overlay)

  private final class Merged(
      base: java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]],
      overlay: java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]])
    extends Iterator[JMap.Entry[Array[Byte], Array[Byte]]] {

    private var b = nextOf(base)
    private var o = nextOf(overlay)
    private var pending: JMap.Entry[Array[Byte], Array[Byte]] = advance()

    private def nextOf(it: java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]]) =
      if (it.hasNext) it.next() else null

    private def advance(): JMap.Entry[Array[Byte], Array[Byte]] = {
      var result: JMap.Entry[Array[Byte], Array[Byte]] = null
      while (result == null && (b != null || o != null)) {
        val cmp = if (b == null) 1 else if (o == null) -1 else Order.compare(b.getKey, o.getKey)
        if (cmp < 0) { result = b; b = nextOf(base) }
        else {
          if (cmp == 0) b = nextOf(base)
          if (!(o.getValue eq Tombstone)) result = o
          o = nextOf(overlay)
        }
      }
      result
    }

    override def hasNext: Boolean = pending != null
    override def next(): JMap.Entry[Array[Byte], Array[Byte]] = {
      if (pending == null) throw new NoSuchElementException("no more state entries")
      val current = pending
      pending = advance()
      current
    }
  }
}

/**
 * The committed state of a partition at one version: per column family, a FamilyMap of
 * encoded key -> encoded value, its packed part in files under `localDir`. Changed only by
 * loading and by applying a commit, both under the provider's state lock; read concurrently
 * by stores and maintenance.
 *
 * A map made `loading` (a bulk load from the store) takes changes without looking anything
 * up (FamilyMap.load) until `finishLoading`, which ends each family's load and counts it.
 */
final class StateMap(localDir: java.io.File, loading: Boolean = false) extends Codec.Sink {
  @volatile private var bulk = loading

  private val families = new ConcurrentHashMap[String, FamilyMap]()
  private def newFamily(): FamilyMap = new FamilyMap(localDir)
  families.put(StateMap.DefaultFamily, newFamily())

  def family(name: String): FamilyMap = families.get(name)
  def familyNames: Set[String] = families.keySet().asScala.toSet
  def numKeys: Long = families.values().asScala.map(_.size).sum
  def estimatedHeapBytes: Long = families.values().asScala.map(_.heapBytes).sum
  def diskBytes: Long = families.values().asScala.map(_.diskBytes).sum

  override def createFamily(name: String): Unit = families.putIfAbsent(name, newFamily())

  override def removeFamily(name: String): Unit =
    if (name == StateMap.DefaultFamily) families.put(name, newFamily())
    else families.remove(name)

  override def put(family: String, key: Array[Byte], value: Array[Byte]): Unit = {
    val map = families.computeIfAbsent(family, _ => newFamily())
    if (bulk) map.load(key, value) else map.put(key, value)
  }

  override def delete(family: String, key: Array[Byte]): Unit = {
    val map = families.get(family)
    if (map != null) { if (bulk) map.loadRemoval(key) else map.remove(key) }
  }

  /** Frees the families' local files; reads fail afterwards. */
  def close(): Unit = families.values().asScala.foreach(_.close())

  /** Ends a bulk load (FamilyMap.finishLoading); then changes compact as usual. */
  def finishLoading(): Unit = if (bulk) {
    families.values().asScala.foreach(_.finishLoading())
    bulk = false
  }

  /**
   * The whole state as it is now, as snapshot entries (family creations, then every key),
   * for writing without the state lock: call this under it; the function it returns gives
   * the entries to a sink later, unaffected by changes made meanwhile (every family is
   * compacted here, and its base file, immutable, is held until read).
   */
  def frozen(): Codec.Sink => Unit = {
    val names = familyNames.toSeq.sorted
    val entries = names.map(name => name -> families.get(name).frozenEntries())
    out => {
      names.filter(_ != StateMap.DefaultFamily).foreach(out.createFamily)
      entries.foreach { case (name, it) => it.foreach(e => out.put(name, e.getKey, e.getValue)) }
    }
  }
}

object StateMap {
  val DefaultFamily: String = org.apache.spark.sql.execution.streaming.state.StateStore.DEFAULT_COL_FAMILY_NAME
}
