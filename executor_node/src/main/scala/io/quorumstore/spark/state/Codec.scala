package io.quorumstore.spark.state

import java.io.ByteArrayOutputStream
import java.nio.charset.StandardCharsets.UTF_8

import scala.collection.mutable

import com.github.luben.zstd.Zstd

/** Growable byte buffer with the varint framing used by every stored record. */
final class ByteWriter(initial: Int = 256) extends ByteArrayOutputStream(initial) {
  def varLong(v0: Long): this.type = {
    var v = v0
    while ((v & ~0x7fL) != 0) { write(((v & 0x7f) | 0x80).toInt); v >>>= 7 }
    write(v.toInt)
    this
  }
  def bytes(b: Array[Byte]): this.type = { varLong(b.length); write(b, 0, b.length); this }
  def string(s: String): this.type = bytes(s.getBytes(UTF_8))
  def byte(b: Int): this.type = { write(b); this }
}

final class ByteReader(buf: Array[Byte]) {
  private var pos = 0
  def position: Int = pos
  def remaining: Boolean = pos < buf.length
  def byte(): Int = { val b = buf(pos) & 0xff; pos += 1; b }
  def varLong(): Long = {
    var result = 0L
    var shift = 0
    var b = byte()
    while ((b & 0x80) != 0) { result |= (b & 0x7fL) << shift; shift += 7; b = byte() }
    result | (b.toLong << shift)
  }
  def bytes(): Array[Byte] = {
    val n = varLong().toInt
    val out = java.util.Arrays.copyOfRange(buf, pos, pos + n)
    pos += n
    out
  }
  def string(): String = new String(bytes(), UTF_8)
}

/**
 * `P/head`: the partition's latest committed version, its checkpoint id, and the state
 * checkpoint location of the query that committed it ("" in heads written before it was
 * recorded), which tells a copied checkpoint's commits apart from the original's.
 */
final case class Head(version: Long, uid: String, checkpoint: String)

/**
 * Chunk 0 of a delta or snapshot, written last: its presence means every data chunk
 * (1..chunks) is there. `parentUid` is the checkpoint id of version-1 ("" for version 0).
 */
final case class CommitHeader(parentUid: String, chunks: Int, entries: Long, bytes: Long)

object Codec {
  private val Format = 1
  /**
   * A data chunk stored compressed: this byte, the length of the plain chunk's body (all of
   * it after its format byte) as a varint, then that body as one zstd frame with a content
   * checksum, so that damaged state is refused rather than loaded.
   */
  private val CompressedFormat = 2
  /** zstd's fastest level, Spark's default for its own zstd streams. */
  private val CompressionLevel = 1

  def encodeHead(h: Head): Array[Byte] = new ByteWriter(128).byte(Format)
    .varLong(h.version).string(h.uid).string(h.checkpoint).toByteArray

  def decodeHead(b: Array[Byte]): Head = {
    val r = reader(b, "head")
    Head(r.varLong(), r.string(), if (r.remaining) r.string() else "")
  }

  def encodeHeader(h: CommitHeader): Array[Byte] = new ByteWriter(64).byte(Format)
    .string(h.parentUid).varLong(h.chunks).varLong(h.entries).varLong(h.bytes).toByteArray

  def decodeHeader(b: Array[Byte]): CommitHeader = {
    val r = reader(b, "commit header")
    CommitHeader(r.string(), r.varLong().toInt, r.varLong(), r.varLong())
  }

  private def reader(b: Array[Byte], what: String): ByteReader = {
    val r = new ByteReader(b)
    val format = r.byte()
    if (format != Format) {
      throw new IllegalStateException(s"unknown $what format $format: written by a newer " +
        "quorumstore state-store provider?")
    }
    r
  }

  // Data chunk entries. A family is named once per chunk (Define) and referred to by index.
  private val Define = 1
  private val Put = 2
  private val Delete = 3
  private val CreateFamily = 4
  private val RemoveFamily = 5

  /** Receives the entries of data chunks, in order. */
  trait Sink {
    def removeFamily(family: String): Unit
    def createFamily(family: String): Unit
    def put(family: String, key: Array[Byte], value: Array[Byte]): Unit
    def delete(family: String, key: Array[Byte]): Unit
  }

  /** Encodes entries into chunks of about `chunkBytes`, handing each to `emit` when full. */
  final class ChunkWriter(chunkBytes: Int, emit: Array[Byte] => Unit) extends Sink {
    private var out = newChunk()
    private var chunkCount = 0
    private var families = mutable.HashMap.empty[String, Int]
    private var entryCount = 0L
    private var payloadBytes = 0L

    private def newChunk(): ByteWriter = new ByteWriter(math.min(chunkBytes + 1024, 1 << 16))
      .byte(Format)

    private def family(name: String): Int = families.getOrElseUpdate(name, {
      out.byte(Define).varLong(families.size).string(name)
      families.size
    })

    private def entry(): Unit = {
      entryCount += 1
      if (out.size() >= chunkBytes) {
        emitChunk()
        out = newChunk()
        families = mutable.HashMap.empty
      }
    }

    override def removeFamily(name: String): Unit = { out.byte(RemoveFamily).string(name); entry() }
    override def createFamily(name: String): Unit = { out.byte(CreateFamily).string(name); entry() }

    override def put(name: String, key: Array[Byte], value: Array[Byte]): Unit = {
      val f = family(name)
      out.byte(Put).varLong(f).bytes(key).bytes(value)
      payloadBytes += key.length + value.length
      entry()
    }

    override def delete(name: String, key: Array[Byte]): Unit = {
      val f = family(name)
      out.byte(Delete).varLong(f).bytes(key)
      payloadBytes += key.length
      entry()
    }

    private def emitChunk(): Unit = {
      emit(compressed(out.toByteArray))
      chunkCount += 1
    }

    def entries: Long = entryCount
    def bytes: Long = payloadBytes
    def chunks: Int = chunkCount

    /** Emits the last chunk unless it is empty; no more entries afterwards. */
    def finish(): Unit = if (out.size() > 1) emitChunk()
  }

  /**
   * A finished data chunk as it is stored: compressed when that makes it smaller (state rows
   * compress several times over, and every byte stored is replicated, fsynced and read back
   * by each load), else as it is, so that a stored chunk is never larger than the chunk written.
   */
  private def compressed(plain: Array[Byte]): Array[Byte] = {
    val bodyLength = plain.length - 1
    val frame = new Array[Byte](Zstd.compressBound(bodyLength.toLong).toInt)
    val frameLength = Zstd.compressByteArray(frame, 0, frame.length, plain, 1, bodyLength,
      CompressionLevel, true)
    if (Zstd.isError(frameLength)) {
      throw new IllegalStateException(
        s"zstd could not compress a state chunk: ${Zstd.getErrorName(frameLength)}")
    }
    val head = new ByteWriter(16).byte(CompressedFormat).varLong(bodyLength)
    if (head.size() + frameLength >= plain.length) plain
    else {
      head.write(frame, 0, frameLength.toInt)
      head.toByteArray
    }
  }

  /** A reader of a stored data chunk's entries, decompressing a compressed chunk first. */
  private def chunkReader(chunk: Array[Byte]): ByteReader =
    if (chunk.isEmpty || (chunk(0) & 0xff) != CompressedFormat) reader(chunk, "data chunk")
    else {
      val head = new ByteReader(chunk)
      head.byte()
      val bodyLength = head.varLong().toInt
      val body = new Array[Byte](bodyLength)
      val n = Zstd.decompressByteArray(body, 0, bodyLength, chunk, head.position,
        chunk.length - head.position)
      if (Zstd.isError(n) || n != bodyLength) {
        throw new IllegalStateException("corrupt compressed state chunk (" +
          (if (Zstd.isError(n)) s"zstd: ${Zstd.getErrorName(n)}" else s"$n bytes, not $bodyLength") +
          "): the state stored in quorumstore is damaged and this version cannot be loaded")
      }
      new ByteReader(body)
    }

  def readChunk(chunk: Array[Byte], sink: Sink): Unit = {
    val r = chunkReader(chunk)
    val families = mutable.ArrayBuffer.empty[String]
    while (r.remaining) {
      r.byte() match {
        case Define =>
          val index = r.varLong().toInt
          require(index == families.size, s"corrupt data chunk: family index $index")
          families += r.string()
        case Put => sink.put(families(r.varLong().toInt), r.bytes(), r.bytes())
        case Delete => sink.delete(families(r.varLong().toInt), r.bytes())
        case CreateFamily => sink.createFamily(r.string())
        case RemoveFamily => sink.removeFamily(r.string())
        case op => throw new IllegalStateException(s"corrupt data chunk: unknown entry type $op")
      }
    }
  }
}
