package io.quorumstore.spark.state

import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, RocksDBKeyStateEncoder, RocksDBStateEncoder, RocksDBValueStateEncoder, UnsafeRowDataEncoder}
import org.apache.spark.sql.types.StructType

/**
 * How one column family's rows become bytes: Spark's own RocksDB key and value encoders,
 * so prefix scans, range scans (order-preserving keys) and multiple values per key behave
 * exactly as with the RocksDB provider, and iteration follows the same byte order.
 */
final class FamilyCodec(
    val keySchema: StructType,
    val valueSchema: StructType,
    val keys: RocksDBKeyStateEncoder,
    val values: RocksDBValueStateEncoder,
    val multipleValues: Boolean)

object FamilyCodec {
  /** Separator between values of one key: RocksDB's merge operator puts one byte there. */
  val ValueDelimiterSize = 1

  def apply(spec: KeyStateEncoderSpec, valueSchema: StructType, multipleValues: Boolean)
      : FamilyCodec = {
    val data = new UnsafeRowDataEncoder(spec, valueSchema)
    new FamilyCodec(spec.keySchema, valueSchema,
      RocksDBStateEncoder.getKeyEncoder(data, spec, false),
      RocksDBStateEncoder.getValueEncoder(data, valueSchema, multipleValues, ValueDelimiterSize),
      multipleValues)
  }

  /** `existing` followed by `more`, as RocksDB's string-append merge joins values. */
  def appendValue(existing: Array[Byte], more: Array[Byte]): Array[Byte] =
    if (existing == null) more
    else {
      val out = java.util.Arrays.copyOf(existing, existing.length + ValueDelimiterSize + more.length)
      out(existing.length) = ','.toByte
      System.arraycopy(more, 0, out, existing.length + ValueDelimiterSize, more.length)
      out
    }
}
