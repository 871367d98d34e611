"""quorumstore's Arrow data service over a node's shards: one module per job (see `servicer`)."""
