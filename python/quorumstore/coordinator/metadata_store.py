"""Durable coordinator metadata at a local path or any fsspec URL.

The metadata (ensembles, terms, leaders, live replica sets) must survive the
coordinator, and often the machine it ran on, so it can live on shared storage
(s3://, hdfs://, ...). Every save replaces the whole record atomically: a local file
is written beside the target, fsynced and renamed; object stores replace an object in
one put.
"""

from __future__ import annotations

from pathlib import Path

import fsspec

from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import ClusterMetadata
from quorumstore.storage.durable_files import replace_durably
from quorumstore.wire import replication as wire


class MetadataError(ValueError):
    """The saved metadata cannot be used: unreadable, or for other nodes than configured."""


class MetadataStore:
    def __init__(self, url: str):
        self.url = url
        try:
            self._fs, self._path = fsspec.core.url_to_fs(url)
        except (ValueError, ImportError) as e:
            raise MetadataError(
                f"cannot keep coordinator metadata at {url}: {e}; give a local path or an "
                "fsspec URL whose filesystem package is installed"
            ) from e
        self._local = (
            self._fs.protocol in ("file", ("file", "local")) or "file" in self._fs.protocol
        )

    def load(self) -> ClusterMetadata | None:
        """The saved metadata, or None if nothing was saved yet."""
        if not self._fs.exists(self._path):
            return None
        data = self._fs.cat_file(self._path)
        record = pb.CoordinatorMetadata()
        try:
            record.ParseFromString(data)
        except Exception as e:
            raise MetadataError(
                f"coordinator metadata at {self.url} is unreadable ({e}); restore it from a backup "
                "or point the coordinator at a new location to start a new cluster"
            ) from e
        if not record.shards:  # never saved so: every cluster has a shard at least
            raise MetadataError(
                f"coordinator metadata at {self.url} describes no shards (an empty or truncated "
                "file?); restore it from a backup or point the coordinator at a new location"
            )
        return wire.metadata_from_pb(record)

    def save(self, metadata: ClusterMetadata) -> None:
        data = wire.metadata_to_pb(metadata).SerializeToString()
        if self._local:
            replace_durably(Path(self._path), data)
        else:
            self._fs.pipe_file(self._path, data)
