package io.quorumstore.spark.state

import java.util.{Arrays, TreeMap}

import scala.jdk.CollectionConverters._
import scala.util.Random

/**
 * Model check of FamilyMap against a java.util.TreeMap: random puts and removes over a small
 * key space, with tiny compaction thresholds and runs so that every path (many runs, a key
 * and its tombstone in different layers, compactions) is taken often. Every get, size and
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

  def main(args: Array[String]): Unit = {
    val seeds = if (args.nonEmpty) args.map(_.toLong).toSeq else 1L to 200L
    var compactions = 0L
    for (seed <- seeds) {
      val rng = new Random(seed)
      val map = new FamilyMap(minCompaction = 1 + rng.nextInt(8), runBytes = 8 + rng.nextInt(64))
      val model = new TreeMap[Array[Byte], Array[Byte]](Bytes.Order)
      def randomKey(): Array[Byte] = Array.fill(1 + rng.nextInt(3))(rng.nextInt(4).toByte)
      // Every fourth seed starts with a bulk load: no compaction until step 200.
      val loadUntil = if (seed % 4 == 0) 200 else 0
      for (step <- 0 until 400) {
        if (step == loadUntil && loadUntil > 0) map.compact()
        val due = step >= loadUntil
        val key = randomKey()
        if (rng.nextInt(3) == 0) {
          val got = map.remove(key, compactWhenDue = due)
          val want = model.remove(key)
          if (!Arrays.equals(got, want)) fail(seed, step, s"remove returned ${Arrays.toString(got)}")
        } else {
          val value = Array.fill(rng.nextInt(4))(rng.nextInt(256).toByte)
          val got = map.put(key, value, compactWhenDue = due)
          val want = model.put(key, value)
          if (!Arrays.equals(got, want)) fail(seed, step, s"put returned ${Arrays.toString(got)}")
        }
        if (rng.nextInt(50) == 0) { map.compact(); compactions += 1 }
        val probe = randomKey()
        if (!Arrays.equals(map.get(probe), model.get(probe))) fail(seed, step, "get differs")
        if (map.containsKey(probe) != model.containsKey(probe)) fail(seed, step, "containsKey differs")
        if (map.size != model.size) fail(seed, step, s"size ${map.size} != ${model.size}")
        val from = if (rng.nextBoolean()) Some(randomKey()) else None
        val to = if (rng.nextBoolean()) Some(randomKey()) else None
        val expected = Bytes.range(new java.util.concurrent.ConcurrentSkipListMap(model), from, to)
        val want = show(expected.asScala)
        val got = show(map.range(from, to))
        if (got != want) fail(seed, step, s"range $from..$to: got [$got], want [$want]")
      }
      if (map.heapBytes <= 0 && map.size > 0) fail(seed, 400, "no heap estimate")
    }
    println(s"FamilyMapCheck ok: ${seeds.size} seeds, $compactions forced compactions")
  }
}
