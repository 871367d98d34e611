"""A storage node: shard replicas (engine, WAL, KV) behind the Oxia client API, the data
service and the internal replication and control services."""
