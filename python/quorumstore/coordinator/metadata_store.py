"""Durable coordinator metadata at a local path or any fsspec URL, held by one coordinator.

The metadata (ensembles, terms, leaders, live replica sets) must survive the
coordinator, and often the machine it ran on, so it can live on shared storage
(s3://, hdfs://, ...). Every save replaces the whole record atomically: a local file
is written beside the target, fsynced and renamed; object stores replace an object in
one put.

Two coordinators on one location would overwrite each other's terms and fence each
other's leaders, so a coordinator holds the location while it runs (`hold`). A local
path is held with an advisory `flock` on a lock file beside it, which the kernel
releases when the process dies, kill -9 included; the file names the holder for the
error the next coordinator reports. On S3 (and S3-compatible stores) and Azure Blob
Storage the location is held with conditional writes (`object_lease`): a lease object
beside the record, which the coordinator renews, refuses a second coordinator; and
every save of the record names the version this coordinator wrote last, so a
coordinator that lost the location cannot overwrite what its successor saved. Other
filesystems (GCS, whose generation conditions no emulator here checks, HDFS) get no
such condition; there, running one coordinator per URL is the operator's job, and
`hold` says so.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path

import fsspec

from quorumstore.archive.restore import archived_metadata
from quorumstore.archive.store import ArchiveStore, is_local
from quorumstore.coordinator.object_lease import (
    LEASE_S,
    ConditionalObject,
    ConditionFailed,
    ObjectLease,
    conditional_object,
)
from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import ClusterMetadata
from quorumstore.storage.durable_files import replace_durably
from quorumstore.wire import replication as wire

#: What a damaged record's error says to do: the coordinator rebuilds missing metadata
#: from the replicas' own terms and logs (see `CoordinatorServer.start`).
log = logging.getLogger(__name__)

_REBUILD_ADVICE = (
    "move it aside and start the coordinator again with the nodes, shard count and "
    "replication factor the cluster was created with: it rebuilds the metadata from the "
    "replicas. To start a new cluster instead, point it at a new location"
)


class MetadataError(ValueError):
    """The saved metadata cannot be used: unreadable, held by another coordinator, or for
    other nodes than configured."""


class MetadataTaken(MetadataError):
    """Another coordinator took the location from this one, which must stop deciding."""


class MetadataStore:
    def __init__(self, url: str, lease_s: float = LEASE_S):
        self.url = url
        try:
            self._fs, self._path = fsspec.core.url_to_fs(url)
        except (ValueError, ImportError) as e:
            raise MetadataError(
                f"cannot keep coordinator metadata at {url}: {e}; give a local path or an "
                "fsspec URL whose filesystem package is installed"
            ) from e
        self._local = is_local(self._fs)
        self._lock_fd: int | None = None
        #: On an object store with conditional writes: the record, replaced only in the
        #: version this store read or wrote last, and the lease beside it.
        self._record: ConditionalObject | None = None
        self.lease: ObjectLease | None = None
        if not self._local:
            self._record = conditional_object(self._fs, self._path)
            if self._record is not None:
                self.lease = ObjectLease(self._record.beside(".lock"), _holder(), lease_s)

    @property
    def lock_path(self) -> Path | None:
        """The lock file of a local location; None on other filesystems (never held)."""
        return Path(self._path + ".lock") if self._local else None

    def hold(self) -> None:
        """Takes the location for this store until `release` or the process's end; raises
        MetadataError, naming the holder, if another coordinator has it."""
        if self.lease is not None:
            self.lease.take(self._in_use)
            return
        path = self.lock_path
        if path is None:
            log.warning(
                "coordinator metadata at %s is not held against a second coordinator: this "
                "filesystem offers no lock or conditional write; run one coordinator per location",
                self.url,
            )
            return
        if self._lock_fd is not None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 512).decode(errors="replace").strip() or "a process"
            os.close(fd)
            raise self._in_use(f"{holder}, holding {path}") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{_holder()}\n".encode())
        self._lock_fd = fd

    def _in_use(self, holder: str) -> MetadataError:
        return MetadataError(
            f"coordinator metadata at {self.url} is in use by another coordinator "
            f"({holder}); run one coordinator per metadata location: "
            "stop that one first, or give this one another location"
        )

    def renew(self) -> None:
        """Renews the lease on an object store; raises MetadataTaken if it was taken."""
        if self.lease is None:
            return
        try:
            self.lease.renew()
        except ConditionFailed as e:
            raise self._taken() from e

    def _taken(self) -> MetadataTaken:
        return MetadataTaken(
            f"another coordinator took the coordinator metadata at {self.url}; this one "
            "stops deciding (two coordinators on one location would overwrite each other's terms)"
        )

    def release(self) -> None:
        """Lets another coordinator take the location; the lock file stays (deleting it
        would let two coordinators lock two different files of one name)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self.lease is not None:
            try:
                self.lease.release()
            except OSError as e:  # the next coordinator then waits out the lease
                log.warning("could not release the lease on %s: %s", self.url, e)

    def load(self) -> ClusterMetadata | None:
        """The saved metadata, or None if nothing was saved yet."""
        if self._record is not None:
            data = self._record.read()
            if data is None:
                return None
        elif not self._fs.exists(self._path):
            return None
        else:
            data = self._fs.cat_file(self._path)
        record = pb.CoordinatorMetadata()
        try:
            record.ParseFromString(data)
        except Exception as e:
            raise MetadataError(
                f"coordinator metadata at {self.url} is unreadable ({e}); {_REBUILD_ADVICE}"
            ) from e
        if not record.shards:  # never saved so: every cluster has a shard at least
            raise MetadataError(
                f"coordinator metadata at {self.url} describes no shards (an empty or "
                f"truncated file?); {_REBUILD_ADVICE}"
            )
        return wire.metadata_from_pb(record)

    def save(self, metadata: ClusterMetadata) -> None:
        data = wire.metadata_to_pb(metadata).SerializeToString()
        if self._local:
            replace_durably(Path(self._path), data)
        elif self._record is not None:
            try:
                self._record.write(data)
            except ConditionFailed as e:
                raise self._taken() from e
        else:
            self._fs.pipe_file(self._path, data)


def _holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def take_archived(store: MetadataStore, archive: ArchiveStore) -> ClusterMetadata | None:
    """The metadata last copied to `archive`, saved at `store` (which holds none); None if
    the archive holds none either. A copy keeps the replicas' incarnations, which a
    rebuild from the configuration could not know."""
    metadata = archived_metadata(archive)
    if metadata is not None:
        keep_archived_copy(store, archive.url, metadata)
    return metadata


def keep_archived_copy(store: MetadataStore, archive_url: str, metadata: ClusterMetadata) -> None:
    """Saves `metadata`, the copy read from the archive at `archive_url`, at `store`."""
    log.warning(
        "no coordinator metadata at %s: took the copy archived at %s (version %d)",
        store.url,
        archive_url,
        metadata.version,
    )
    store.save(metadata)
