package io.quorumstore.spark.state

import java.io.InputStream
import java.net.{InetAddress, UnknownHostException}
import java.util.concurrent.TimeUnit

import scala.jdk.CollectionConverters._

import org.sparkproject.connect.grpc.{CallOptions, Channel, ClientCall, ClientInterceptor, Context, ForwardingClientCall, Grpc, ManagedChannel, ManagedChannelBuilder, Metadata, MethodDescriptor, StatusException, StatusRuntimeException, TlsChannelCredentials}
import org.sparkproject.connect.grpc.stub.ClientCalls
import org.sparkproject.connect.protobuf.{ByteString, DescriptorProtos, Descriptors, DynamicMessage}

/**
 * The Oxia client protocol over the gRPC and protobuf runtimes that Spark ships shaded
 * inside spark-connect. This is the only file that names `org.sparkproject.*` (a
 * Spark-internal prefix): messages are `DynamicMessage`s built from the descriptor set
 * that jar_build.py serializes from the generated oxia_client_pb2, so no generated Java exists.
 * Everything it returns is a plain value of OxiaModel.scala.
 */
object OxiaWire {
  private val DescriptorResource = "/io/quorumstore/spark/state/oxia_client.desc"
  private val Service = "io.streamnative.oxia.proto.OxiaClient"
  private val MaxInboundBytes = 256 << 20
  private val LeaderHintKey = Metadata.Key.of("leader-hint", Metadata.ASCII_STRING_MARSHALLER)

  private lazy val file: Descriptors.FileDescriptor = {
    val in = getClass.getResourceAsStream(DescriptorResource)
    if (in == null) {
      throw new IllegalStateException(s"$DescriptorResource is missing from the quorumstore " +
        "state-store jar; rebuild it with `python -m quorumstore.spark.jar_build --force`")
    }
    val set = try DescriptorProtos.FileDescriptorSet.parseFrom(in) finally in.close()
    val built = scala.collection.mutable.Map.empty[String, Descriptors.FileDescriptor]
    // --include_imports lists dependencies before the files that import them.
    set.getFileList.asScala.foreach { proto =>
      val deps = proto.getDependencyList.asScala.map(built).toArray
      built(proto.getName) = Descriptors.FileDescriptor.buildFrom(proto, deps)
    }
    built("oxia_client.proto")
  }

  private def msg(name: String): Descriptors.Descriptor = file.findMessageTypeByName(name)

  private final class Marshaller(d: => Descriptors.Descriptor)
    extends MethodDescriptor.Marshaller[DynamicMessage] {
    override def stream(m: DynamicMessage): InputStream = m.toByteString.newInput()
    override def parse(in: InputStream): DynamicMessage = DynamicMessage.parseFrom(d, in)
  }

  private def method(
      name: String,
      request: String,
      response: String,
      kind: MethodDescriptor.MethodType): MethodDescriptor[DynamicMessage, DynamicMessage] =
    MethodDescriptor.newBuilder[DynamicMessage, DynamicMessage]()
      .setType(kind)
      .setFullMethodName(MethodDescriptor.generateFullMethodName(Service, name))
      .setRequestMarshaller(new Marshaller(msg(request)))
      .setResponseMarshaller(new Marshaller(msg(response)))
      .build()

  private lazy val assignmentsMethod = method("GetShardAssignments", "ShardAssignmentsRequest",
    "ShardAssignments", MethodDescriptor.MethodType.SERVER_STREAMING)
  private lazy val writeMethod =
    method("Write", "WriteRequest", "WriteResponse", MethodDescriptor.MethodType.UNARY)
  private lazy val readMethod =
    method("Read", "ReadRequest", "ReadResponse", MethodDescriptor.MethodType.SERVER_STREAMING)
  private lazy val rangeScanMethod = method("RangeScan", "RangeScanRequest", "RangeScanResponse",
    MethodDescriptor.MethodType.SERVER_STREAMING)
  private lazy val listMethod =
    method("List", "ListRequest", "ListResponse", MethodDescriptor.MethodType.SERVER_STREAMING)

  /** A channel to one node ("host:port"). */
  final class Connection private[OxiaWire] (val address: String, channel: ManagedChannel) {
    private[OxiaWire] def options(timeoutMs: Long): CallOptions =
      CallOptions.DEFAULT.withDeadlineAfter(math.max(1L, timeoutMs), TimeUnit.MILLISECONDS)
    private[OxiaWire] def ch: ManagedChannel = channel
    def close(): Unit = channel.shutdownNow()
  }

  /** A channel to `address`: TLS when `security` names a trusted CA, and its token on
   * every call. A token is refused for a plaintext channel beyond loopback, so that it
   * never crosses a network in the clear. */
  def connect(address: String, security: WireSecurity): Connection = {
    val builder: ManagedChannelBuilder[_] = security.trustedCaFile match {
      case Some(ca) =>
        Grpc.newChannelBuilder(address, TlsChannelCredentials.newBuilder().trustManager(ca).build())
      case None =>
        if (security.token.nonEmpty && !isLoopback(address)) {
          throw new IllegalArgumentException(s"spark.quorumstore.auth.token is sent only over " +
            s"TLS, and $address is not a loopback address; set spark.quorumstore.tls.trustedCaFile")
        }
        ManagedChannelBuilder.forTarget(address).usePlaintext()
    }
    security.token.foreach(token => builder.intercept(new BearerToken(token)))
    builder.maxInboundMessageSize(MaxInboundBytes)
    new Connection(address, builder.build())
  }

  private def isLoopback(address: String): Boolean = {
    val host = address.take(address.lastIndexOf(':')).stripPrefix("[").stripSuffix("]")
    try InetAddress.getAllByName(host).forall(_.isLoopbackAddress)
    catch { case _: UnknownHostException => false }
  }

  /** Adds `authorization: Bearer <token>` to every call's headers. */
  private final class BearerToken(token: String) extends ClientInterceptor {
    private val key = Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER)

    override def interceptCall[Q, R](
        method: MethodDescriptor[Q, R], options: CallOptions, next: Channel): ClientCall[Q, R] =
      new ForwardingClientCall.SimpleForwardingClientCall[Q, R](next.newCall(method, options)) {
        override def start(listener: ClientCall.Listener[R], headers: Metadata): Unit = {
          headers.put(key, s"Bearer $token")
          super.start(listener, headers)
        }
      }
  }

  // ------------------------------------------------------------------ helpers

  private final class Builder(name: String) {
    val d: Descriptors.Descriptor = msg(name)
    val b: DynamicMessage.Builder = DynamicMessage.newBuilder(d)
    def set(field: String, v: Any): Builder = { b.setField(d.findFieldByName(field), v); this }
    def add(field: String, v: Any): Builder = { b.addRepeatedField(d.findFieldByName(field), v); this }
    def build(): DynamicMessage = b.build()
  }

  private def field(m: DynamicMessage, name: String): AnyRef =
    m.getField(m.getDescriptorForType.findFieldByName(name))

  private def has(m: DynamicMessage, name: String): Boolean =
    m.hasField(m.getDescriptorForType.findFieldByName(name))

  private def long(m: DynamicMessage, name: String): Long =
    field(m, name).asInstanceOf[java.lang.Number].longValue()

  private def str(m: DynamicMessage, name: String): String = field(m, name).asInstanceOf[String]

  private def bytes(m: DynamicMessage, name: String): Array[Byte] =
    field(m, name).asInstanceOf[ByteString].toByteArray

  private def enumNumber(m: DynamicMessage, name: String): Int =
    field(m, name).asInstanceOf[Descriptors.EnumValueDescriptor].getNumber

  private def messages(m: DynamicMessage, name: String): Seq[DynamicMessage] =
    field(m, name).asInstanceOf[java.util.List[DynamicMessage]].asScala.toSeq

  private def versionId(record: DynamicMessage): Long =
    if (has(record, "version")) long(field(record, "version").asInstanceOf[DynamicMessage],
      "version_id") else -1L

  /** Runs `call`, turning gRPC failures into WireException. */
  private def guarded[T](call: => T): T =
    try call catch {
      case e: StatusRuntimeException => throw wireError(e.getStatus, e.getTrailers, e)
      case e: StatusException => throw wireError(e.getStatus, e.getTrailers, e)
    }

  private def wireError(
      status: org.sparkproject.connect.grpc.Status,
      trailers: Metadata,
      cause: Throwable): WireException = {
    val hint = Option(trailers).flatMap(t => Option(t.get(LeaderHintKey)))
    new WireException(status.getCode.name, String.valueOf(status.getDescription), hint, cause)
  }

  private def streamAll(
      conn: Connection,
      m: MethodDescriptor[DynamicMessage, DynamicMessage],
      request: DynamicMessage,
      timeoutMs: Long): Iterator[DynamicMessage] = guarded {
    ClientCalls.blockingServerStreamingCall(conn.ch, m, conn.options(timeoutMs), request)
      .asScala.toVector.iterator
  }

  /**
   * Runs `body`, whose calls are cancelled (they fail with CANCELLED, which is retryable)
   * once the function handed to `watch` is called, from any thread. `watch` returns what
   * stops watching, run when `body` ends.
   */
  def abandonable[T](watch: (() => Unit) => (() => Unit))(body: => T): T = {
    val context = Context.current().withCancellation()
    val stopWatching = watch(() => context.cancel(null))
    try context.call(() => body)
    finally {
      stopWatching()
      context.close()
    }
  }

  // -------------------------------------------------------------------- calls

  /** The first complete assignment map of `namespace` sent on the GetShardAssignments stream. */
  def shardAssignments(conn: Connection, namespace: String, timeoutMs: Long): Seq[ShardAssignment] =
    guarded {
      val request = new Builder("ShardAssignmentsRequest").set("namespace", namespace).build()
      val call = ClientCalls.blockingV2ServerStreamingCall(conn.ch, assignmentsMethod,
        conn.options(timeoutMs), request)
      val first = try call.read(timeoutMs, TimeUnit.MILLISECONDS) catch {
        case _: java.util.concurrent.TimeoutException =>
          throw new WireException("DEADLINE_EXCEEDED",
            s"no shard assignments from ${conn.address} within $timeoutMs ms", None, null)
      } finally call.cancel("first assignment map received", null)
      if (first == null) {
        throw new WireException("UNAVAILABLE",
          s"${conn.address} closed the assignments stream without sending a map", None, null)
      }
      val entries = messages(first, "namespaces")
      val byName = entries.map(e => str(e, "key") -> field(e, "value").asInstanceOf[DynamicMessage])
      val ns = byName.toMap.getOrElse(namespace, throw new WireException("NOT_FOUND",
        s"namespace '$namespace' not found at ${conn.address}; it serves: " +
          byName.map(_._1).sorted.mkString(", "), None, null))
      messages(ns, "assignments").map { a =>
        val range = field(a, "int32_hash_range").asInstanceOf[DynamicMessage]
        ShardAssignment(long(a, "shard"), str(a, "leader"),
          Integer.toUnsignedLong(long(range, "min_hash_inclusive").toInt),
          Integer.toUnsignedLong(long(range, "max_hash_inclusive").toInt))
      }
    }

  /** One WriteRequest (one replicated write) to `shard`. */
  def write(
      conn: Connection,
      shard: Long,
      puts: Seq[PutOp],
      deleteRanges: Seq[DeleteRangeOp],
      timeoutMs: Long): WriteResult = guarded {
    val request = new Builder("WriteRequest").set("shard", shard)
    puts.foreach { p =>
      val put = new Builder("PutRequest").set("key", p.key)
        .set("value", ByteString.copyFrom(p.value)).set("partition_key", p.partitionKey)
      p.expectedVersionId.foreach(v => put.set("expected_version_id", v))
      request.add("puts", put.build())
    }
    deleteRanges.foreach { r =>
      request.add("delete_ranges", new Builder("DeleteRangeRequest")
        .set("start_inclusive", r.startInclusive).set("end_exclusive", r.endExclusive).build())
    }
    val response = ClientCalls.blockingUnaryCall(conn.ch, writeMethod, conn.options(timeoutMs),
      request.build())
    WriteResult(
      messages(response, "puts").map(p => PutResult(enumNumber(p, "status"), versionId(p)))
        .toIndexedSeq,
      messages(response, "delete_ranges").map(r => enumNumber(r, "status")).toIndexedSeq)
  }

  /** Point reads (EQUAL) of `keys` on `shard`, in order; None where the key is absent. */
  def read(conn: Connection, shard: Long, keys: Seq[String], timeoutMs: Long): Seq[Option[Record]] = {
    val request = new Builder("ReadRequest").set("shard", shard)
    keys.foreach(k => request.add("gets",
      new Builder("GetRequest").set("key", k).set("include_value", true).build()))
    val gets = streamAll(conn, readMethod, request.build(), timeoutMs).flatMap(messages(_, "gets"))
      .toVector
    if (gets.size != keys.size) {
      throw new WireException("INTERNAL", s"${conn.address} answered ${gets.size} of " +
        s"${keys.size} gets of shard $shard", None, null)
    }
    keys.zip(gets).map { case (key, g) =>
      if (enumNumber(g, "status") != OxiaStatus.Ok) None
      else Some(Record(key, if (has(g, "value")) bytes(g, "value") else Array.emptyByteArray,
        versionId(g)))
    }
  }

  /** Records of `shard` in [start, end), in hierarchical key order. */
  def rangeScan(conn: Connection, shard: Long, start: String, end: String, timeoutMs: Long)
      : Vector[Record] = {
    val request = new Builder("RangeScanRequest").set("shard", shard)
      .set("start_inclusive", start).set("end_exclusive", end).build()
    streamAll(conn, rangeScanMethod, request, timeoutMs).flatMap(messages(_, "records")).map { r =>
      Record(str(r, "key"), if (has(r, "value")) bytes(r, "value") else Array.emptyByteArray,
        versionId(r))
    }.toVector
  }

  /** Keys of `shard` in [start, end), in hierarchical key order. */
  def list(conn: Connection, shard: Long, start: String, end: String, timeoutMs: Long)
      : Vector[String] = {
    val request = new Builder("ListRequest").set("shard", shard)
      .set("start_inclusive", start).set("end_exclusive", end).build()
    streamAll(conn, listMethod, request, timeoutMs)
      .flatMap(m => field(m, "keys").asInstanceOf[java.util.List[String]].asScala).toVector
  }
}
