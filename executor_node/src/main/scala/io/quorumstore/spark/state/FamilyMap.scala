package io.quorumstore.spark.state

import java.util.{Arrays, Map => JMap}
import java.util.concurrent.ConcurrentSkipListMap

import scala.collection.mutable

/**
 * Sorted entries packed into one byte array: entry i's key is data[starts(2i), starts(2i+1))
 * and its value data[starts(2i+1), starts(2i+2)). About 8 bytes of overhead per entry, where
 * a skip-list node with two arrays costs ~100. Immutable.
 */
private final class PackedRun(data: Array[Byte], starts: Array[Int]) {
  val size: Int = (starts.length - 1) / 2

  def compareKey(i: Int, key: Array[Byte]): Int =
    Arrays.compareUnsigned(data, starts(2 * i), starts(2 * i + 1), key, 0, key.length)

  def key(i: Int): Array[Byte] = Arrays.copyOfRange(data, starts(2 * i), starts(2 * i + 1))
  def value(i: Int): Array[Byte] = Arrays.copyOfRange(data, starts(2 * i + 1), starts(2 * i + 2))

  /** Appends entry i to `out` without copying it out first. */
  def copyTo(i: Int, out: PackedRunBuilder): Unit =
    out.add(data, starts(2 * i), starts(2 * i + 1), starts(2 * i + 2))

  /** The first entry whose key is >= `key` (`size` when there is none). */
  def lowerBound(key: Array[Byte]): Int = {
    var lo = 0
    var hi = size
    while (lo < hi) {
      val mid = (lo + hi) >>> 1
      if (compareKey(mid, key) < 0) lo = mid + 1 else hi = mid
    }
    lo
  }

  def heapBytes: Long = 16L + data.length + 16L + 4L * starts.length + 32L
}

/** Builds PackedRuns from entries given in ascending key order, cutting runs at `runBytes`. */
private final class PackedRunBuilder(runBytes: Int) {
  private val runs = mutable.ArrayBuffer.empty[PackedRun]
  private var data = new java.io.ByteArrayOutputStream(4096)
  private var starts = new mutable.ArrayBuilder.ofInt

  def add(key: Array[Byte], value: Array[Byte]): Unit = {
    if (data.size() > 0 && data.size() + key.length + value.length > runBytes) cut()
    starts += data.size()
    data.write(key, 0, key.length)
    starts += data.size()
    data.write(value, 0, value.length)
  }

  /** Adds the entry whose key is bytes[keyStart, valueStart) and value bytes[valueStart, end). */
  def add(bytes: Array[Byte], keyStart: Int, valueStart: Int, end: Int): Unit = {
    if (data.size() > 0 && data.size() + end - keyStart > runBytes) cut()
    starts += data.size()
    starts += data.size() + valueStart - keyStart
    data.write(bytes, keyStart, end - keyStart)
  }

  private def cut(): Unit = {
    starts += data.size()
    runs += new PackedRun(data.toByteArray, starts.result())
    data = new java.io.ByteArrayOutputStream(4096)
    starts = new mutable.ArrayBuilder.ofInt
  }

  def result(): IndexedSeq[PackedRun] = {
    if (data.size() > 0) cut()
    runs.toIndexedSeq
  }
}

/**
 * One column family of a partition's local copy: a sorted map of encoded key -> value.
 *
 * Most entries live in `base`, packed sorted runs; changes since the last compaction live in
 * `recent`, a skip list in which a removed base key maps to `Bytes.Tombstone`. When `recent`
 * outgrows an eighth of the base (and `minCompaction`), both are merged into new runs in one
 * linear pass. Writes come from one thread at a time (the provider's state lock); reads may
 * run concurrently and see a consistent (base, recent) pair, each iterator being weakly
 * consistent like a ConcurrentSkipListMap's.
 */
final class FamilyMap(minCompaction: Int = FamilyMap.MinCompaction,
    runBytes: Int = FamilyMap.RunBytes) {
  import FamilyMap.Layers

  @volatile private var layers = Layers(IndexedSeq.empty, Bytes.newMap())
  private var entries = 0L
  private var recentHeap = 0L

  def size: Long = entries
  def heapBytes: Long = layers.baseHeap + recentHeap

  def get(key: Array[Byte]): Array[Byte] = {
    val l = layers
    val changed = l.recent.get(key)
    if (changed eq Bytes.Tombstone) null
    else if (changed != null) changed
    else FamilyMap.baseGet(l.base, key)
  }

  def containsKey(key: Array[Byte]): Boolean = get(key) != null

  /**
   * Puts `value` at `key`; the previous value, or null. With `compactWhenDue` false (a bulk
   * load, which calls `compact` at its end) `recent` grows without bound.
   */
  def put(key: Array[Byte], value: Array[Byte], compactWhenDue: Boolean = true): Array[Byte] = {
    val l = layers
    val replaced = l.recent.put(key, value)
    remember(key, replaced, value)
    val previous =
      if (replaced eq Bytes.Tombstone) null
      else if (replaced != null) replaced
      else FamilyMap.baseGet(l.base, key)
    if (previous == null) entries += 1
    if (compactWhenDue) maybeCompact()
    previous
  }

  /** Removes `key`; its value, or null when it had none. See `put` for `compactWhenDue`. */
  def remove(key: Array[Byte], compactWhenDue: Boolean = true): Array[Byte] = {
    val l = layers
    val based = FamilyMap.baseGet(l.base, key)
    val changed = l.recent.get(key)
    val previous = if (changed eq Bytes.Tombstone) null else if (changed != null) changed else based
    if (previous != null) {
      if (based != null) {
        remember(key, l.recent.put(key, Bytes.Tombstone), Bytes.Tombstone)
      } else {
        remember(key, l.recent.remove(key), null)
      }
      entries -= 1
      if (compactWhenDue) maybeCompact()
    }
    previous
  }

  private def remember(key: Array[Byte], replaced: Array[Byte], now: Array[Byte]): Unit = {
    if (replaced != null) recentHeap -= Bytes.entryHeapBytes(key, replaced)
    if (now != null) recentHeap += Bytes.entryHeapBytes(key, now)
  }

  /** Live entries with from <= key < to, either bound optional, in key order. */
  def range(from: Option[Array[Byte]], to: Option[Array[Byte]])
      : Iterator[JMap.Entry[Array[Byte], Array[Byte]]] = {
    val l = layers
    Bytes.merged(FamilyMap.baseRange(l.base, from, to), Bytes.range(l.recent, from, to))
  }

  private def maybeCompact(): Unit = {
    val recent = layers.recent
    if (recent.size() > math.max(minCompaction.toLong, layers.baseEntries / 8)) compact()
  }

  /** Merges `recent` into new base runs, in one pass over both (nothing to do if empty). */
  def compact(): Unit = if (!layers.recent.isEmpty) {
    val builder = new PackedRunBuilder(runBytes)
    val changes = layers.recent.entrySet().iterator()
    var change = if (changes.hasNext) changes.next() else null
    def addChange(): Unit = {
      if (!(change.getValue eq Bytes.Tombstone)) builder.add(change.getKey, change.getValue)
      change = if (changes.hasNext) changes.next() else null
    }
    // base entry vs the next change: > 0 the change comes first, 0 it replaces the entry
    def order(run: PackedRun, i: Int): Int = if (change == null) -1 else run.compareKey(i, change.getKey)
    for (run <- layers.base; i <- 0 until run.size) {
      var cmp = order(run, i)
      while (cmp > 0) { addChange(); cmp = order(run, i) }
      if (cmp == 0) addChange() else run.copyTo(i, builder)
    }
    while (change != null) addChange()
    layers = Layers(builder.result(), Bytes.newMap())
    recentHeap = 0L
  }
}

object FamilyMap {
  /** `recent` is compacted once it holds more than this many keys and an eighth of the base:
   * a skip-list entry costs ~100 bytes more than a packed one, so `recent` stays a small part
   * of the memory, while a compaction (one copy of the base) comes at most every base/8 writes. */
  val MinCompaction: Int = 8192
  /** Bytes of keys and values per packed run (a run is one array). */
  val RunBytes: Int = 8 << 20

  private final case class Layers(base: IndexedSeq[PackedRun], recent: Bytes.SortedBytes) {
    val baseEntries: Long = base.map(_.size.toLong).sum
    val baseHeap: Long = base.map(_.heapBytes).sum
  }

  /** The run that holds `key` if any run does: the first whose last key is >= `key`. */
  private def runOf(base: IndexedSeq[PackedRun], key: Array[Byte]): Int = {
    var lo = 0
    var hi = base.size
    while (lo < hi) {
      val mid = (lo + hi) >>> 1
      val run = base(mid)
      if (run.compareKey(run.size - 1, key) < 0) lo = mid + 1 else hi = mid
    }
    lo
  }

  private def baseGet(base: IndexedSeq[PackedRun], key: Array[Byte]): Array[Byte] = {
    val r = runOf(base, key)
    if (r == base.size) null
    else {
      val run = base(r)
      val i = run.lowerBound(key)
      if (i < run.size && run.compareKey(i, key) == 0) run.value(i) else null
    }
  }

  private def baseRange(base: IndexedSeq[PackedRun], from: Option[Array[Byte]],
      to: Option[Array[Byte]]): java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]] =
    new java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]] {
      private var r = from.map(runOf(base, _)).getOrElse(0)
      private var i = if (r < base.size) from.map(base(r).lowerBound).getOrElse(0) else 0
      private def settle(): Unit = while (r < base.size && i >= base(r).size) { r += 1; i = 0 }
      settle()

      override def hasNext: Boolean =
        r < base.size && to.forall(t => base(r).compareKey(i, t) < 0)

      override def next(): JMap.Entry[Array[Byte], Array[Byte]] = {
        if (!hasNext) throw new NoSuchElementException("no more state entries")
        val run = base(r)
        val entry = new java.util.AbstractMap.SimpleImmutableEntry(run.key(i), run.value(i))
        i += 1
        settle()
        entry
      }
    }
}
