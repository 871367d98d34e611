package io.quorumstore.spark.state

/**
 * XXH3-64 with seed 0 and the default secret: the hash Oxia's servers and Go/Java clients
 * route keys with (low 32 bits). A straight port of the scalar path of xxhash's `XXH3_64bits`,
 * checked against Python's `xxhash.xxh3_64` for every length class.
 */
object Xxh3 {
  private val Prime32_1 = 0x9E3779B1L
  private val Prime32_2 = 0x85EBCA77L
  private val Prime32_3 = 0xC2B2AE3DL
  private val Prime64_1 = 0x9E3779B185EBCA87L
  private val Prime64_2 = 0xC2B2AE3D27D4EB4FL
  private val Prime64_3 = 0x165667B19E3779F9L
  private val Prime64_4 = 0x85EBCA77C2B2AE63L
  private val Prime64_5 = 0x27D4EB2F165667C5L
  private val PrimeMx1 = 0x165667919E3779F9L
  private val PrimeMx2 = 0x9FB21C651E98DF25L

  private val StripeLen = 64
  private val SecretConsumeRate = 8
  private val MidSizeMax = 240

  private val Secret: Array[Byte] = Array(
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e
  ).map(_.toByte)

  /** XXH3-64 of the UTF-8 bytes of `s`. */
  def hash64(s: String): Long = hash64(s.getBytes("UTF-8"))

  def hash64(in: Array[Byte]): Long = {
    val len = in.length
    if (len <= 16) len0To16(in, len)
    else if (len <= 128) len17To128(in, len)
    else if (len <= MidSizeMax) len129To240(in, len)
    else hashLong(in, len)
  }

  private def le64(b: Array[Byte], i: Int): Long =
    (b(i) & 0xffL) | (b(i + 1) & 0xffL) << 8 | (b(i + 2) & 0xffL) << 16 |
      (b(i + 3) & 0xffL) << 24 | (b(i + 4) & 0xffL) << 32 | (b(i + 5) & 0xffL) << 40 |
      (b(i + 6) & 0xffL) << 48 | (b(i + 7) & 0xffL) << 56

  private def le32(b: Array[Byte], i: Int): Long =
    (b(i) & 0xffL) | (b(i + 1) & 0xffL) << 8 | (b(i + 2) & 0xffL) << 16 | (b(i + 3) & 0xffL) << 24

  /** Low 64 bits xor high 64 bits of the unsigned 128-bit product. */
  private def mul128Fold64(a: Long, b: Long): Long = {
    val high = Math.multiplyHigh(a, b) + ((a >> 63) & b) + ((b >> 63) & a)
    (a * b) ^ high
  }

  private def xxh64Avalanche(h0: Long): Long = {
    var h = h0
    h ^= h >>> 33; h *= Prime64_2
    h ^= h >>> 29; h *= Prime64_3
    h ^ (h >>> 32)
  }

  private def avalanche(h0: Long): Long = {
    var h = h0
    h ^= h >>> 37; h *= PrimeMx1
    h ^ (h >>> 32)
  }

  private def rrmxmx(h0: Long, len: Int): Long = {
    var h = h0
    h ^= java.lang.Long.rotateLeft(h, 49) ^ java.lang.Long.rotateLeft(h, 24)
    h *= PrimeMx2
    h ^= (h >>> 35) + len
    h *= PrimeMx2
    h ^ (h >>> 28)
  }

  private def len0To16(in: Array[Byte], len: Int): Long = {
    if (len > 8) {
      val lo = le64(in, 0) ^ (le64(Secret, 24) ^ le64(Secret, 32))
      val hi = le64(in, len - 8) ^ (le64(Secret, 40) ^ le64(Secret, 48))
      avalanche(len + java.lang.Long.reverseBytes(lo) + hi + mul128Fold64(lo, hi))
    } else if (len >= 4) {
      val in1 = le32(in, 0)
      val in2 = le32(in, len - 4)
      val keyed = (in2 + (in1 << 32)) ^ (le64(Secret, 8) ^ le64(Secret, 16))
      rrmxmx(keyed, len)
    } else if (len > 0) {
      val c1 = in(0) & 0xffL
      val c2 = in(len >> 1) & 0xffL
      val c3 = in(len - 1) & 0xffL
      val combined = (c1 << 16) | (c2 << 24) | c3 | (len.toLong << 8)
      xxh64Avalanche(combined ^ (le32(Secret, 0) ^ le32(Secret, 4)))
    } else {
      xxh64Avalanche(le64(Secret, 56) ^ le64(Secret, 64))
    }
  }

  private def mix16B(in: Array[Byte], i: Int, s: Int): Long =
    mul128Fold64(le64(in, i) ^ le64(Secret, s), le64(in, i + 8) ^ le64(Secret, s + 8))

  private def len17To128(in: Array[Byte], len: Int): Long = {
    var acc = len * Prime64_1
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += mix16B(in, 48, 96)
          acc += mix16B(in, len - 64, 112)
        }
        acc += mix16B(in, 32, 64)
        acc += mix16B(in, len - 48, 80)
      }
      acc += mix16B(in, 16, 32)
      acc += mix16B(in, len - 32, 48)
    }
    acc += mix16B(in, 0, 0)
    acc += mix16B(in, len - 16, 16)
    avalanche(acc)
  }

  private def len129To240(in: Array[Byte], len: Int): Long = {
    val startOffset = 3
    val lastOffset = 17
    var acc = len * Prime64_1
    var i = 0
    while (i < 8) { acc += mix16B(in, 16 * i, 16 * i); i += 1 }
    acc = avalanche(acc)
    val rounds = len / 16
    i = 8
    while (i < rounds) { acc += mix16B(in, 16 * i, 16 * (i - 8) + startOffset); i += 1 }
    acc += mix16B(in, len - 16, 136 - lastOffset)
    avalanche(acc)
  }

  private def accumulate512(acc: Array[Long], in: Array[Byte], i: Int, s: Int): Unit = {
    var lane = 0
    while (lane < 8) {
      val data = le64(in, i + 8 * lane)
      val key = data ^ le64(Secret, s + 8 * lane)
      acc(lane ^ 1) += data
      acc(lane) += (key & 0xffffffffL) * (key >>> 32)
      lane += 1
    }
  }

  private def scramble(acc: Array[Long], s: Int): Unit = {
    var lane = 0
    while (lane < 8) {
      var a = acc(lane)
      a ^= a >>> 47
      a ^= le64(Secret, s + 8 * lane)
      acc(lane) = a * Prime32_1
      lane += 1
    }
  }

  private def hashLong(in: Array[Byte], len: Int): Long = {
    val acc = Array(Prime32_3, Prime64_1, Prime64_2, Prime64_3, Prime64_4, Prime32_2, Prime64_5,
      Prime32_1)
    val stripesPerBlock = (Secret.length - StripeLen) / SecretConsumeRate
    val blockLen = StripeLen * stripesPerBlock
    val blocks = (len - 1) / blockLen
    var b = 0
    while (b < blocks) {
      var n = 0
      while (n < stripesPerBlock) {
        accumulate512(acc, in, b * blockLen + n * StripeLen, n * SecretConsumeRate)
        n += 1
      }
      scramble(acc, Secret.length - StripeLen)
      b += 1
    }
    val lastStripes = ((len - 1) - blockLen * blocks) / StripeLen
    var n = 0
    while (n < lastStripes) {
      accumulate512(acc, in, blocks * blockLen + n * StripeLen, n * SecretConsumeRate)
      n += 1
    }
    accumulate512(acc, in, len - StripeLen, Secret.length - StripeLen - 7)
    var result = len * Prime64_1
    var i = 0
    while (i < 4) {
      result += mul128Fold64(acc(2 * i) ^ le64(Secret, 11 + 16 * i),
        acc(2 * i + 1) ^ le64(Secret, 11 + 16 * i + 8))
      i += 1
    }
    avalanche(result)
  }
}
