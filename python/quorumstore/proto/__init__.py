"""Wire contracts of quorumstore, generated from ``proto/*.proto`` by ``scripts/gen_proto.py``.

- ``oxia_client_pb2`` / ``oxia_client_pb2_grpc``: the Oxia client protocol
  (``io.streamnative.oxia.proto.OxiaClient``), wire-compatible with the official clients.
- ``oxia_write_columns_pb2``: Oxia's ``WriteRequest`` read column-wise (never sent; see
  ``quorumstore.node.oxia.plain_puts``).
- ``replication_pb2`` / ``replication_pb2_grpc``: internal services
  (``quorumstore.replication.v1``: ``NodeControl``, ``Replication``) and the
  coordinator's persisted metadata.

Every ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` here is generated: do not edit
them; change the .proto and run ``python scripts/gen_proto.py``.
"""
