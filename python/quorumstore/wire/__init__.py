"""The wire contract: what servers and clients must agree on, defined once.

Metadata keys, routing modes and the exactly-once pair (`metadata`), Oxia's status
codes and the not-leader hint (`status`), the key routing hash (`hashing`), the
hierarchical key order and its byte encoding (`keys`), the Arrow schemas of the data
service's rows (`schemas`), session timeout bounds (`sessions`), addresses, gRPC
channel and server options and listening (`addresses`, `channels`), and the
translation between the engine's messages and the internal protobuf messages
(`replication`). Servers and clients import these names from here, never from each
other.
"""
