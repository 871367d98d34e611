"""The Oxia client protocol served over a node's shards: one module per job (see `servicer`)."""
