package io.quorumstore.spark.state

import java.util.{Arrays, TreeMap}

import scala.jdk.CollectionConverters._
import scala.util.Random

/**
 * Model check of FamilyMap against a java.util.TreeMap: random puts and removes over a small
 * key space, with tiny compaction thresholds and blocks so that every path (many blocks, a
 * key and its tombstone in different layers, compactions) is taken often. Every get, size and
 * range is compared with the model. Run by tests/spark/test_scala_checks.py; exits 1 with
 * the seed and step on the first difference.
 */
object FamilyMapCheck {
  private def fail(seed: Long, step: Int, what: String): Nothing = {
    System.err.println(s"FamilyMapCheck seed $seed step $step: $what")
    sys.exit(1)
  }

  private def show(entries: Iterator[java.util.Map.Entry[Array[Byte], Array[Byte]]]): String =
    entries.map(e => Arrays.toString(e.getKey) + "=" + Arrays.toString(e.getValue)).mkString(", ")

  /** Base files this process holds open (they are unlinked, so only /proc shows them). */
  private def openBaseFiles(): Int =
    Option(new java.io.File("/proc/self/fd").listFiles()).getOrElse(Array.empty).count { fd =>
      scala.util.Try(java.nio.file.Files.readSymbolicLink(fd.toPath).toString)
        .getOrElse("").contains("quorumstore-state-")
    }

  def main(args: Array[String]): Unit = {
    val seeds = if (args.nonEmpty) args.map(_.toLong).toSeq else 1L to 200L
    var compactions = 0L
    var loadsPacked = 0L
    var loadsCounted = 0L
    val localDir = java.nio.file.Files.createTempDirectory("family-map-check").toFile
    for (seed <- seeds) {
      val rng = new Random(seed)
      val map = new FamilyMap(localDir, minCompaction = 1 + rng.nextInt(8),
        blockBytes = 8 + rng.nextInt(64))
      val model = new TreeMap[Array[Byte], Array[Byte]](Bytes.Order)
      def randomKey(): Array[Byte] = Array.fill(1 + rng.nextInt(3))(rng.nextInt(4).toByte)
      // Every fourth seed starts with a bulk load (load, loadRemoval) until step 200.
      val loadUntil = if (seed % 4 == 0) 200 else 0
      // A reader that advances one entry per step across compactions: the base file it
      // started on must stay readable until it ends, then close.
      var reader: Iterator[java.util.Map.Entry[Array[Byte], Array[Byte]]] = Iterator.empty
      var lastRead: Array[Byte] = null
      def advanceReader(step: Int): Unit = if (reader.hasNext) {
        val key = reader.next().getKey
        if (lastRead != null && Bytes.Order.compare(lastRead, key) >= 0) {
          fail(seed, step, "a reader spanning compactions went out of order")
        }
        lastRead = key
      } else if (rng.nextInt(20) == 0) {
        reader = map.range(None, None)
        lastRead = null
      }
      // Every eighth seed's bulk load mostly puts ascending keys (as a snapshot or a first
      // delta does) and reads only now and then, so that long runs go straight to the file.
      val ascending = seed % 8 == 0
      for (step <- 0 until 400) {
        val sorted = ascending && step < loadUntil
        val quiet = sorted && rng.nextInt(10) != 0
        if (!quiet) advanceReader(step)
        if (step == loadUntil && loadUntil > 0) {
          if (map.finishLoading()) loadsPacked += 1 else loadsCounted += 1
        }
        val loading = step < loadUntil
        def ascendingKey(i: Int): Array[Byte] = Array((i >> 8).toByte, i.toByte)
        val key = if (!sorted) randomKey() else rng.nextInt(20) match {
          case 0 => randomKey()
          case 1 => ascendingKey(step - 1) // the same key again
          case _ => ascendingKey(step)
        }
        if (rng.nextInt(if (sorted) 20 else 3) == 0) {
          val want = model.remove(key)
          if (loading) map.loadRemoval(key)
          else {
            val got = map.remove(key)
            if (!Arrays.equals(got, want)) fail(seed, step, s"remove returned ${Arrays.toString(got)}")
          }
        } else {
          val value = Array.fill(rng.nextInt(4))(rng.nextInt(256).toByte)
          val want = model.put(key, value)
          if (loading) map.load(key, value)
          else {
            val got = map.put(key, value)
            if (!Arrays.equals(got, want)) fail(seed, step, s"put returned ${Arrays.toString(got)}")
          }
        }
        if (rng.nextInt(50) == 0) { map.compact(); compactions += 1 }
        // A bulk load counts keys when it is compacted; after that, always.
        if (!loading && map.size != model.size) fail(seed, step, s"size ${map.size} != ${model.size}")
        if (!quiet) {
          val probe = randomKey()
          if (!Arrays.equals(map.get(probe), model.get(probe))) fail(seed, step, "get differs")
          if (map.containsKey(probe) != model.containsKey(probe)) fail(seed, step, "containsKey differs")
          val from = if (rng.nextBoolean()) Some(randomKey()) else None
          val to = if (rng.nextBoolean()) Some(randomKey()) else None
          val expected = Bytes.range(new java.util.concurrent.ConcurrentSkipListMap(model), from, to)
          val want = show(expected.asScala)
          val got = show(map.range(from, to))
          if (got != want) fail(seed, step, s"range $from..$to: got [$got], want [$want]")
        }
      }
      map.compact()
      if (map.heapBytes <= 0) fail(seed, 400, "no heap estimate")
      if (map.size > 0 && map.diskBytes <= 0) fail(seed, 400, "compacted entries are not on disk")
      while (reader.hasNext) advanceReader(400)
      map.close()
      if (openBaseFiles() != 0) fail(seed, 400, s"${openBaseFiles()} base files still open after close")
      val readAfterClose = scala.util.Try(map.get(Array[Byte](0)))
      if (map.size > 0 && readAfterClose.isSuccess) fail(seed, 400, "a closed map still reads")
    }
    val left = localDir.list()
    if (left.nonEmpty) fail(0, 0, s"base files left in $localDir: ${left.mkString(", ")}")
    localDir.delete()
    if (seeds.size >= 100 && (loadsPacked == 0 || loadsCounted == 0)) {
      fail(0, 0, s"bulk loads ended $loadsPacked times packed, $loadsCounted times counted: " +
        "the check must take both paths")
    }
    println(s"FamilyMapCheck ok: ${seeds.size} seeds, $compactions forced compactions, bulk " +
      s"loads ended $loadsPacked times packed and $loadsCounted times counted")
  }
}
