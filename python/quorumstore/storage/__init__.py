"""Durable storage of a replica: the write-ahead log (`wal`) and the key-value state."""
