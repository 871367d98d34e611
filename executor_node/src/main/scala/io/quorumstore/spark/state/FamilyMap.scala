package io.quorumstore.spark.state

import java.io.{ByteArrayOutputStream, File, IOException, RandomAccessFile, UncheckedIOException}
import java.nio.ByteBuffer
import java.util.{Arrays, Map => JMap}

import scala.annotation.tailrec
import scala.collection.mutable
import scala.jdk.CollectionConverters._

/**
 * Sorted entries packed into one byte array: entry i's key is data[starts(2i), starts(2i+1))
 * and its value data[starts(2i+1), starts(2i+2)). One block of a BaseFile, decoded without
 * copying its data. Immutable.
 */
private final class PackedRun(data: Array[Byte], starts: Array[Int]) {
  val size: Int = (starts.length - 1) / 2

  def compareKey(i: Int, key: Array[Byte]): Int =
    Arrays.compareUnsigned(data, starts(2 * i), starts(2 * i + 1), key, 0, key.length)

  def key(i: Int): Array[Byte] = Arrays.copyOfRange(data, starts(2 * i), starts(2 * i + 1))
  def value(i: Int): Array[Byte] = Arrays.copyOfRange(data, starts(2 * i + 1), starts(2 * i + 2))

  /** Appends entry i to `out` without copying it out first. */
  def copyTo(i: Int, out: BaseFileWriter): Unit =
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

  /** The index of the entry whose key is `key`; -1 when there is none. */
  def indexOf(key: Array[Byte]): Int = {
    val i = lowerBound(key)
    if (i < size && compareKey(i, key) == 0) i else -1
  }
}

/**
 * The packed, sorted part of a column family, in a local file: blocks of about `blockBytes`
 * of keys and values, each `[n: int][2n+1 entry starts: int][keys and values]`, and on the
 * heap only each block's first key and file offset. A get reads one block.
 *
 * The file is a cache of state that quorumstore holds durably, so it is never fsync'd, and it
 * is unlinked as soon as it is opened, so its space is freed when it is closed or the
 * executor dies. It is closed when retired (replaced by a compaction) and no reader is left;
 * a reader that never finishes (an abandoned iterator) leaves that to the JDK, which closes
 * a RandomAccessFile that became unreachable. Classic file I/O, unlike a FileChannel,
 * survives the interrupts Spark sends to cancelled tasks. Immutable; reads are thread-safe.
 */
private final class BaseFile(file: RandomAccessFile, firstKeys: Array[Array[Byte]],
    offsets: Array[Long], val entries: Long) {
  private var readers = 0 // guarded by this, with retired
  private var retired = false

  /** Registers a reader, who must `release` it; false once it is retired (look again). */
  def acquire(): Boolean = synchronized {
    if (!retired) readers += 1
    !retired
  }

  def release(): Unit = synchronized {
    readers -= 1
    if (retired && readers == 0) file.close()
  }

  /** No new readers; closes the file once the current ones are done. */
  def retire(): Unit = if (file != null) synchronized {
    retired = true
    if (readers == 0) file.close()
  }

  def blocks: Int = firstKeys.length
  def diskBytes: Long = offsets(blocks)
  val heapBytes: Long = firstKeys.iterator.map(k => 24L + ((k.length + 7) & ~7)).sum +
    8L * offsets.length + 80L

  def block(b: Int): PackedRun = {
    val bytes = new Array[Byte]((offsets(b + 1) - offsets(b)).toInt)
    file.synchronized {
      file.seek(offsets(b))
      file.readFully(bytes)
    }
    val header = ByteBuffer.wrap(bytes)
    val starts = new Array[Int](2 * header.getInt(0) + 1)
    header.position(4)
    header.asIntBuffer().get(starts)
    new PackedRun(bytes, starts)
  }

  /** The block that holds `key` if any does: the last whose first key is <= `key`; -1 if none. */
  private def blockOf(key: Array[Byte]): Int = {
    var lo = 0
    var hi = blocks
    while (lo < hi) {
      val mid = (lo + hi) >>> 1
      if (Bytes.Order.compare(firstKeys(mid), key) <= 0) lo = mid + 1 else hi = mid
    }
    lo - 1
  }

  def get(key: Array[Byte]): Array[Byte] = {
    val b = blockOf(key)
    if (b < 0) null
    else {
      val run = block(b)
      val i = run.indexOf(key)
      if (i >= 0) run.value(i) else null
    }
  }

  /** A membership test for keys asked in ascending order, reading each block at most once. */
  def ascendingContains(): Array[Byte] => Boolean = {
    var cached = -1
    var run: PackedRun = null
    key => {
      val b = blockOf(key)
      b >= 0 && {
        if (b != cached) { run = block(b); cached = b }
        run.indexOf(key) >= 0
      }
    }
  }

  /**
   * Entries with from <= key < to, either bound optional, reading one block at a time, for a
   * reader that acquired the file: the iterator releases it when it reaches its end.
   */
  def range(from: Option[Array[Byte]], to: Option[Array[Byte]])
      : java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]] =
    new java.util.Iterator[JMap.Entry[Array[Byte], Array[Byte]]] {
      private var b = from.map(k => math.max(blockOf(k), 0)).getOrElse(0)
      private var run = if (b < blocks) block(b) else null
      private var i = if (run == null) 0 else from.map(run.lowerBound).getOrElse(0)
      private var open = true
      settle()

      private def settle(): Unit = {
        while (run != null && i >= run.size) {
          b += 1
          run = if (b < blocks) block(b) else null
          i = 0
        }
        if (open && !hasNext) {
          open = false
          release()
        }
      }

      override def hasNext: Boolean = run != null && to.forall(t => run.compareKey(i, t) < 0)

      override def next(): JMap.Entry[Array[Byte], Array[Byte]] = {
        if (!hasNext) throw new NoSuchElementException("no more state entries")
        val entry = new java.util.AbstractMap.SimpleImmutableEntry(run.key(i), run.value(i))
        i += 1
        settle()
        entry
      }
    }
}

private object BaseFile {
  val Empty = new BaseFile(null, Array.empty, Array(0L), 0L)
}

/**
 * Writes entries given in ascending key order into a new BaseFile in `dir`, cutting blocks
 * at `blockBytes` (a block holds at least one entry) and writing 1 MiB at a time.
 */
private final class BaseFileWriter(dir: File, blockBytes: Int) {
  private val file = FamilyMap.localFile(dir)
  private val pending = new ByteArrayOutputStream(FamilyMap.WriteBytes + 2 * blockBytes)
  private var written = 0L
  private val block = new ByteArrayOutputStream(2 * blockBytes)
  private val starts = new mutable.ArrayBuilder.ofInt
  private val firstKeys = mutable.ArrayBuffer.empty[Array[Byte]]
  private val offsets = new mutable.ArrayBuilder.ofLong
  private var entries = 0L
  offsets += 0L

  def add(key: Array[Byte], value: Array[Byte]): Unit = {
    begin(key, 0, key.length, key.length + value.length)
    block.write(key, 0, key.length)
    starts += block.size()
    block.write(value, 0, value.length)
  }

  /** Adds the entry whose key is bytes[keyStart, valueStart) and value bytes[valueStart, end). */
  def add(bytes: Array[Byte], keyStart: Int, valueStart: Int, end: Int): Unit = {
    begin(bytes, keyStart, valueStart, end - keyStart)
    starts += block.size() + valueStart - keyStart
    block.write(bytes, keyStart, end - keyStart)
  }

  private def begin(bytes: Array[Byte], keyStart: Int, keyEnd: Int, entryBytes: Int): Unit = {
    if (block.size() > 0 && block.size() + entryBytes > blockBytes) cutBlock()
    if (block.size() == 0) firstKeys += Arrays.copyOfRange(bytes, keyStart, keyEnd)
    starts += block.size()
    entries += 1
  }

  private def cutBlock(): Unit = {
    starts += block.size()
    val relative = starts.result()
    val header = 4 * (relative.length + 1)
    val head = ByteBuffer.allocate(header).putInt(relative.length / 2)
    relative.foreach(s => head.putInt(header + s))
    pending.write(head.array())
    block.writeTo(pending)
    written += header + block.size()
    offsets += written
    block.reset()
    starts.clear()
    if (pending.size() >= FamilyMap.WriteBytes) flush()
  }

  private def flush(): Unit = {
    FamilyMap.onDisk(dir)(file.write(pending.toByteArray))
    pending.reset()
  }

  def finish(): BaseFile = {
    if (block.size() > 0) cutBlock()
    if (entries == 0) {
      file.close()
      BaseFile.Empty
    } else {
      flush()
      new BaseFile(file, firstKeys.toArray, offsets.result(), entries)
    }
  }
}

/**
 * One column family of a partition's local copy: a sorted map of encoded key -> value.
 *
 * Most entries live in `base`, a BaseFile of packed sorted blocks on local disk with a small
 * index on the heap; changes since the last compaction live in `recent`, a skip list in which
 * a removed base key maps to `Bytes.Tombstone`. When `recent` outgrows 1/`RecentShare` of the
 * base (and `minCompaction`), both are merged into a new file in one sequential pass. Writes come
 * from one thread at a time (the provider's state lock); reads may run concurrently and see a
 * consistent (base, recent) pair, each iterator being weakly consistent like a
 * ConcurrentSkipListMap's. Readers other than the writer hold the base file they read (see
 * BaseFile) so that a compaction closes it only after them; the writer, who alone replaces
 * it, reads it freely.
 *
 * A bulk load (`load`, `loadRemoval`, then `finishLoading`) looks nothing up until it ends,
 * when it counts the keys, and into an empty family it streams the
 * leading run of ascending puts straight into the base file, without `recent`. A snapshot,
 * or the first deltas of a query, is such a run, because commits and snapshots write each
 * family in key order. The run ends at the first other change or read; a map being loaded
 * is read by its loading thread only (it is not shared yet).
 */
final class FamilyMap(localDir: File, minCompaction: Int = FamilyMap.MinCompaction,
    blockBytes: Int = FamilyMap.BlockBytes) {
  import FamilyMap.Layers

  @volatile private var layers = Layers(BaseFile.Empty, Bytes.newMap())
  @volatile private var closed = false
  private var entries = 0L
  private var recentHeap = 0L
  // A bulk load's leading run of ascending puts, being written as the base; null when none.
  private var appending: BaseFileWriter = null
  private var lastAppended: Array[Byte] = null

  /** Live keys; during a bulk load, only once `finishLoading` or `compact` has ended it. */
  def size: Long = entries
  def heapBytes: Long = layers.base.heapBytes + recentHeap
  def diskBytes: Long = layers.base.diskBytes

  /** The current layers, their base file acquired. */
  @tailrec private def acquired(): Layers = {
    val l = layers
    if (l.base.acquire()) l
    else if (closed) throw new IllegalStateException("this local copy of the state was " +
      "closed (its provider was unloaded); the store must be opened again")
    else acquired()
  }

  def get(key: Array[Byte]): Array[Byte] = {
    endAppending()
    val l = acquired()
    try {
      val changed = l.recent.get(key)
      if (changed eq Bytes.Tombstone) null
      else if (changed != null) changed
      else l.base.get(key)
    } finally l.base.release()
  }

  def containsKey(key: Array[Byte]): Boolean = get(key) != null

  /** Puts `value` at `key`; the previous value, or null. */
  def put(key: Array[Byte], value: Array[Byte]): Array[Byte] = {
    endAppending()
    val l = layers
    val replaced = l.recent.put(key, value)
    remember(key, replaced, value)
    val previous =
      if (replaced eq Bytes.Tombstone) null
      else if (replaced != null) replaced
      else l.base.get(key)
    if (previous == null) entries += 1
    maybeCompact()
    previous
  }

  /** Removes `key`; its value, or null when it had none. */
  def remove(key: Array[Byte]): Array[Byte] = {
    endAppending()
    val l = layers
    val based = l.base.get(key)
    val changed = l.recent.get(key)
    val previous = if (changed eq Bytes.Tombstone) null else if (changed != null) changed else based
    if (previous != null) {
      if (based != null) {
        remember(key, l.recent.put(key, Bytes.Tombstone), Bytes.Tombstone)
      } else {
        remember(key, l.recent.remove(key), null)
      }
      entries -= 1
      maybeCompact()
    }
    previous
  }

  /** A bulk load's put (see the class comment); `recent` grows until `compact`. */
  def load(key: Array[Byte], value: Array[Byte]): Unit =
    if (appends(key)) {
      appending.add(key, value)
      lastAppended = key
      entries += 1
    } else {
      endAppending()
      remember(key, layers.recent.put(key, value), value)
    }

  /** A bulk load's removal: a tombstone, dropped by `compact` if nothing was there. */
  def loadRemoval(key: Array[Byte]): Unit = {
    endAppending()
    remember(key, layers.recent.put(key, Bytes.Tombstone), Bytes.Tombstone)
  }

  /** Whether a bulk put of `key` continues (or starts) the leading run of ascending puts. */
  private def appends(key: Array[Byte]): Boolean =
    if (appending != null) Bytes.Order.compare(lastAppended, key) < 0
    else if (layers.base.entries == 0 && layers.recent.isEmpty) {
      appending = new BaseFileWriter(localDir, blockBytes)
      true
    } else false

  private def endAppending(): Unit = if (appending != null) {
    val replaced = layers.base
    layers = Layers(appending.finish(), layers.recent)
    appending = null
    lastAppended = null
    replaced.retire()
  }

  private def remember(key: Array[Byte], replaced: Array[Byte], now: Array[Byte]): Unit = {
    if (replaced != null) recentHeap -= Bytes.entryHeapBytes(key, replaced)
    if (now != null) recentHeap += Bytes.entryHeapBytes(key, now)
  }

  /** Live entries with from <= key < to, either bound optional, in key order. */
  def range(from: Option[Array[Byte]], to: Option[Array[Byte]])
      : Iterator[JMap.Entry[Array[Byte], Array[Byte]]] = {
    endAppending()
    val l = acquired()
    Bytes.merged(l.base.range(from, to), Bytes.range(l.recent, from, to))
  }

  /**
   * Every entry as of now, read later from the base file alone: compacts first, so call it
   * as the writer. Later changes do not show; the file stays open until the iterator ends.
   */
  def frozenEntries(): Iterator[JMap.Entry[Array[Byte], Array[Byte]]] = {
    compact()
    acquired().base.range(None, None).asScala
  }

  /** Frees the base file (once current readers are done); later reads fail. */
  def close(): Unit = {
    endAppending()
    closed = true
    layers.base.retire()
  }

  private def maybeCompact(): Unit = if (outgrown(layers)) compact()

  private def outgrown(l: Layers): Boolean =
    l.recent.size() > math.max(minCompaction.toLong, l.base.entries / FamilyMap.RecentShare)

  /**
   * Ends a bulk load. Its changes that went to `recent` are packed into the base only if
   * `recent` outgrew it (as a put would compact); else the keys are counted in one ascending
   * pass of lookups, so that the few deltas after a snapshot do not cost a rewrite of the
   * whole file. Tombstones of keys the base lacks stay in `recent`, where they hide nothing.
   * True when it packed.
   */
  def finishLoading(): Boolean = {
    endAppending()
    val l = layers
    if (outgrown(l)) {
      compact()
      true
    } else {
      val inBase = l.base.ascendingContains()
      var live = l.base.entries
      val changes = l.recent.entrySet().iterator()
      while (changes.hasNext) {
        val change = changes.next()
        val based = inBase(change.getKey)
        if (change.getValue eq Bytes.Tombstone) { if (based) live -= 1 }
        else if (!based) live += 1
      }
      entries = live
      false
    }
  }

  /** Merges `recent` into a new base file, in one pass over both (nothing to do if empty). */
  def compact(): Unit = {
    endAppending()
    if (!layers.recent.isEmpty) merge()
  }

  private def merge(): Unit = {
    val base = layers.base
    val writer = new BaseFileWriter(localDir, blockBytes)
    val changes = layers.recent.entrySet().iterator()
    var change = if (changes.hasNext) changes.next() else null
    def addChange(): Unit = {
      if (!(change.getValue eq Bytes.Tombstone)) writer.add(change.getKey, change.getValue)
      change = if (changes.hasNext) changes.next() else null
    }
    // base entry vs the next change: > 0 the change comes first, 0 it replaces the entry
    def order(run: PackedRun, i: Int): Int = if (change == null) -1 else run.compareKey(i, change.getKey)
    for (b <- 0 until base.blocks) {
      val run = base.block(b)
      for (i <- 0 until run.size) {
        var cmp = order(run, i)
        while (cmp > 0) { addChange(); cmp = order(run, i) }
        if (cmp == 0) addChange() else run.copyTo(i, writer)
      }
    }
    while (change != null) addChange()
    layers = Layers(writer.finish(), Bytes.newMap())
    entries = layers.base.entries
    recentHeap = 0L
    base.retire()
  }
}

object FamilyMap {
  /** `recent` is compacted once it holds more than this many keys and 1/`RecentShare` of
   * the base's: a skip-list entry costs ~100 bytes of heap (`Bytes.entryHeapBytes`). */
  val MinCompaction: Int = 8192
  /** How large `recent` may grow against the base: at 1/32 it holds ~3 bytes of heap per
   * entry of state, and a compaction (one sequential rewrite of the file) comes at most
   * every base/32 writes. At 1/8 the state-store bench's provider held twice the heap, and
   * its micro-batches were no faster. */
  val RecentShare: Int = 32
  /** Bytes of keys and values per block of a base file: what one get reads. */
  val BlockBytes: Int = 4096
  /** Bytes a base file is written in. */
  private[state] val WriteBytes: Int = 1 << 20

  private final case class Layers(base: BaseFile, recent: Bytes.SortedBytes)

  /** Runs local-disk I/O, turning a failure into an error that names the directory. */
  private[state] def onDisk[T](dir: File)(io: => T): T = try io catch {
    case e: IOException => throw new UncheckedIOException(s"the state store's local copy " +
      s"cannot be written to $dir (${e.getMessage}); set ${QuorumConf.LocalDir} to a local " +
      "directory with free space", e)
  }

  /** A new, already unlinked file in `dir`, open for reading and writing. */
  private[state] def localFile(dir: File): RandomAccessFile = onDisk(dir) {
    if (!dir.isDirectory && !dir.mkdirs() && !dir.isDirectory) {
      throw new IOException("it is not a directory and cannot be created")
    }
    val path = File.createTempFile("quorumstore-state-", ".base", dir)
    val file = new RandomAccessFile(path, "rw")
    if (!path.delete()) path.deleteOnExit()
    file
  }
}
