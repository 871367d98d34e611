package io.quorumstore.spark.state

import java.util.{Map => JMap}
import java.util.concurrent.ConcurrentHashMap

import scala.collection.mutable
import scala.jdk.CollectionConverters._

/**
 * One micro-batch's view of a partition: the committed `base` plus this batch's changes,
 * kept aside until commit. Reads see the changes first; the base is never touched here, so
 * aborting is just dropping the view, and a commit ships exactly these changes.
 */
final class StateView(val base: StateMap) {
  import Bytes.{SortedBytes, Tombstone}

  private val overlays = new ConcurrentHashMap[String, SortedBytes]()
  // Families removed during the batch: their base content is invisible from then on.
  private val cleared = mutable.LinkedHashSet.empty[String]
  private val created = mutable.LinkedHashSet.empty[String]
  private val removed = mutable.HashSet.empty[String]

  private def overlay(family: String): SortedBytes =
    overlays.computeIfAbsent(family, _ => Bytes.newMap())

  def familyExists(family: String): Boolean =
    !removed.contains(family) && (created.contains(family) || base.family(family) != null)

  def familyNames: Set[String] =
    (base.familyNames -- removed -- cleared) ++ created

  private def baseFamily(family: String): FamilyMap =
    if (cleared.contains(family)) null else base.family(family)

  def get(family: String, key: Array[Byte]): Array[Byte] = {
    val changed = overlay(family).get(key)
    if (changed eq Tombstone) null
    else if (changed != null) changed
    else {
      val b = baseFamily(family)
      if (b == null) null else b.get(key)
    }
  }

  def put(family: String, key: Array[Byte], value: Array[Byte]): Unit =
    overlay(family).put(key, value)

  def delete(family: String, key: Array[Byte]): Unit = {
    val b = baseFamily(family)
    if (b != null && b.containsKey(key)) overlay(family).put(key, Tombstone)
    else overlay(family).remove(key)
  }

  def createFamily(family: String): Unit =
    if (!familyExists(family)) { created += family; removed -= family }

  def removeFamily(family: String): Boolean = {
    val existed = familyExists(family)
    if (existed) {
      if (base.family(family) != null) cleared += family
      created -= family
      removed += family
      overlay(family).clear()
    }
    existed
  }

  /** Live entries of `family` in [from, to), in key order; tolerates concurrent changes. */
  def scan(family: String, from: Option[Array[Byte]], to: Option[Array[Byte]])
      : Iterator[JMap.Entry[Array[Byte], Array[Byte]]] = {
    val b = baseFamily(family)
    val baseIt = if (b == null) java.util.Collections.emptyIterator[JMap.Entry[Array[Byte],
      Array[Byte]]]() else b.range(from, to).asJava
    Bytes.merged(baseIt, Bytes.range(overlay(family), from, to))
  }

  /** Number of keys changed (put or removed) in this batch. */
  def changedKeys: Long = overlays.values().asScala.map(_.size.toLong).sum

  /** Replays the batch's changes, in the order a reader must apply them. */
  def replay(out: Codec.Sink): Unit = {
    cleared.foreach(out.removeFamily)
    created.filterNot(removed).foreach(out.createFamily)
    overlays.asScala.toSeq.sortBy(_._1).foreach { case (family, changes) =>
      if (!removed.contains(family)) {
        val it = changes.entrySet().iterator()
        while (it.hasNext) {
          val e = it.next()
          if (e.getValue eq Tombstone) out.delete(family, e.getKey)
          else out.put(family, e.getKey, e.getValue)
        }
      }
    }
  }
}
