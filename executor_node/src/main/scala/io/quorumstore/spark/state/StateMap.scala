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
}

/**
 * The committed state of a partition at one version: per column family, a sorted map of
 * encoded key -> encoded value. Changed only by loading and by applying a commit, both
 * under the provider's state lock; read concurrently by stores and maintenance.
 */
final class StateMap extends Codec.Sink {
  import Bytes.SortedBytes

  private val families = new ConcurrentHashMap[String, SortedBytes]()
  families.put(StateMap.DefaultFamily, Bytes.newMap())
  @volatile private var keys = 0L
  @volatile private var heapBytes = 0L

  def family(name: String): SortedBytes = families.get(name)
  def familyNames: Set[String] = families.keySet().asScala.toSet
  def numKeys: Long = keys
  def estimatedHeapBytes: Long = heapBytes

  override def createFamily(name: String): Unit = families.putIfAbsent(name, Bytes.newMap())

  override def removeFamily(name: String): Unit = {
    val removed = if (name == StateMap.DefaultFamily) families.put(name, Bytes.newMap())
      else families.remove(name)
    if (removed != null) {
      removed.entrySet().asScala.foreach(e => forget(e.getKey, e.getValue))
    }
  }

  override def put(family: String, key: Array[Byte], value: Array[Byte]): Unit = {
    val previous = families.computeIfAbsent(family, _ => Bytes.newMap()).put(key, value)
    if (previous != null) forget(key, previous)
    keys += 1
    heapBytes += Bytes.entryHeapBytes(key, value)
  }

  override def delete(family: String, key: Array[Byte]): Unit = {
    val map = families.get(family)
    if (map != null) {
      val previous = map.remove(key)
      if (previous != null) forget(key, previous)
    }
  }

  private def forget(key: Array[Byte], value: Array[Byte]): Unit = {
    keys -= 1
    heapBytes -= Bytes.entryHeapBytes(key, value)
  }

  /** The whole state as snapshot entries: family creations, then every key. */
  def writeTo(out: Codec.ChunkWriter): Unit = {
    val names = familyNames.toSeq.sorted
    names.filter(_ != StateMap.DefaultFamily).foreach(out.createFamily)
    names.foreach { name =>
      val it = families.get(name).entrySet().iterator()
      while (it.hasNext) { val e = it.next(); out.put(name, e.getKey, e.getValue) }
    }
  }
}

object StateMap {
  val DefaultFamily: String = org.apache.spark.sql.execution.streaming.state.StateStore.DEFAULT_COL_FAMILY_NAME
}
