"""The durable archive: committed log entries and KV snapshots of every shard, shipped by
shard leaders to an fsspec URL, and the restores that rebuild a cluster from it.

- `manifest.py`: the per-shard index of completed objects, retention and restore plans
  (no I/O);
- `objects.py`: the encodings of archived segments and snapshots (no I/O);
- `store.py`: the archive at its URL: atomic objects and manifests, the metadata copy;
- `shipper.py`: a node's background task that ships the shards it leads;
- `restore.py`: a cluster's data directories rebuilt from the archive at a point;
- `delta_export.py`: the state at a point written as a version of a Delta Lake table.

docs/archive.md describes the design.
"""
