package org.apache.spark.quorumstore

import org.apache.spark.util.NextIterator

/**
 * `source` as the NextIterator that SupportsFineGrainedReplay's change reader must return.
 * NextIterator is private to Spark's packages, hence this class's package.
 */
final class ChangeIterator[T](source: Iterator[T]) extends NextIterator[T] {
  override protected def getNext(): T =
    if (source.hasNext) source.next()
    else {
      finished = true
      null.asInstanceOf[T]
    }

  override protected def close(): Unit = ()
}
