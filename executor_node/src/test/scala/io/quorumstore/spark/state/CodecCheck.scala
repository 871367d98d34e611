package io.quorumstore.spark.state

import java.util.Arrays

import scala.collection.mutable
import scala.util.Random

/**
 * Check of the data chunk codec: random entries (families, puts, deletes, values that
 * compress well and values that do not) written through ChunkWriter with random chunk sizes
 * and read back must be the same entries in the same order. Chunks that compress are stored
 * compressed, chunks that do not are stored as written (never larger than written), chunks
 * written before compression (plain, format 1) still read, and a damaged compressed chunk is
 * refused. Run by tests/spark/test_scala_checks.py; exits 1 with the seed on the first
 * difference.
 */
object CodecCheck {
  private def fail(seed: Long, what: String): Nothing = {
    System.err.println(s"CodecCheck seed $seed: $what")
    sys.exit(1)
  }

  /** Entries as comparable strings, in the order a sink receives them. */
  private final class Recorder extends Codec.Sink {
    val seen = mutable.ArrayBuffer.empty[String]
    override def removeFamily(family: String): Unit = seen += s"remove $family"
    override def createFamily(family: String): Unit = seen += s"create $family"
    override def put(family: String, key: Array[Byte], value: Array[Byte]): Unit =
      seen += s"put $family ${Arrays.toString(key)} ${Arrays.toString(value)}"
    override def delete(family: String, key: Array[Byte]): Unit =
      seen += s"delete $family ${Arrays.toString(key)}"
  }

  private def bytes(rng: Random, n: Int, compressible: Boolean): Array[Byte] =
    if (compressible) Array.tabulate(n)(i => (i % 4).toByte)
    else Array.fill(n)(rng.nextInt(256).toByte)

  def main(args: Array[String]): Unit = {
    val seeds = if (args.nonEmpty) args.map(_.toLong).toSeq else 1L to 300L
    var compressedChunks = 0L
    var plainChunks = 0L
    for (seed <- seeds) {
      val rng = new Random(seed)
      val chunkBytes = 1 + rng.nextInt(if (rng.nextBoolean()) 64 else 8192)
      val compressible = rng.nextBoolean()
      val stored = mutable.ArrayBuffer.empty[Array[Byte]]
      val written = new Recorder
      val writer = new Codec.ChunkWriter(chunkBytes, stored += _)
      val tee = Seq[Codec.Sink](writer, written)
      for (_ <- 0 until rng.nextInt(400)) {
        val family = s"f${rng.nextInt(3)}"
        val key = bytes(rng, rng.nextInt(40), compressible)
        rng.nextInt(10) match {
          case 0 => tee.foreach(_.createFamily(family))
          case 1 => tee.foreach(_.removeFamily(family))
          case 2 | 3 => tee.foreach(_.delete(family, key))
          case _ =>
            val value = bytes(rng, rng.nextInt(300), compressible)
            tee.foreach(_.put(family, key, value))
        }
      }
      writer.finish()
      if (writer.chunks != stored.size) fail(seed, s"${writer.chunks} chunks counted, ${stored.size} emitted")
      val read = new Recorder
      stored.foreach(Codec.readChunk(_, read))
      if (read.seen != written.seen) {
        fail(seed, s"read back ${read.seen.size} entries that differ from the ${written.seen.size} written")
      }
      for (chunk <- stored) {
        if (chunk(0) == 2) compressedChunks += 1 else plainChunks += 1
        // A chunk is closed once it reaches chunkBytes, so the last entry may overshoot by
        // one entry (at most 1 + 1 + 10 + 40 + 10 + 300 bytes here); never by compressing.
        if (chunk.length > chunkBytes + 400) fail(seed, s"a stored chunk of ${chunk.length} bytes")
        if (chunk(0) == 2) {
          val damaged = chunk.clone()
          damaged(damaged.length - 1) = (damaged(damaged.length - 1) ^ 0x5a).toByte
          val cut = Arrays.copyOf(chunk, chunk.length - 1)
          for ((bad, what) <- Seq(damaged -> "a damaged", cut -> "a cut")) {
            if (scala.util.Try(Codec.readChunk(bad, new Recorder)).isSuccess) {
              fail(seed, s"$what compressed chunk was read")
            }
          }
        }
      }
    }
    // Chunks written before compression: the format byte 1, then the entries as they are.
    val old = new Recorder
    Codec.readChunk(Array[Byte](1, 1, 0, 1, 'd', 2, 0, 1, 7, 2, 8, 9), old)
    if (old.seen != Seq("put d [7] [8, 9]")) fail(0, s"a format-1 chunk read as ${old.seen}")
    if (seeds.size >= 100 && (compressedChunks == 0 || plainChunks == 0)) {
      fail(0, s"$compressedChunks chunks compressed, $plainChunks stored plain: the check must " +
        "see both")
    }
    println(s"CodecCheck ok: ${seeds.size} seeds, $compressedChunks chunks compressed, " +
      s"$plainChunks stored plain")
  }
}
