"""The archive at its fsspec URL (a local path, s3://...): objects, manifests and the
coordinator's metadata copy. Blocking I/O: callers run it off their event loop.

Layout under the URL::

    metadata.pb                               the coordinator's latest metadata
    shards/<namespace>/<shard>/manifest.json  the shard's index (`manifest.py`)
    shards/<namespace>/<shard>/segments/...   committed entries (`objects.py`)
    shards/<namespace>/<shard>/snapshots/...  KV snapshots

What a reader may see whole is replaced in one step: on a local filesystem a file is
written beside its name, fsynced and renamed (an object named by a manifest must
survive a power loss as the manifest does); an object store replaces an object in
one PUT, and an upload streamed in parts becomes visible only when complete.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import fsspec

from quorumstore.archive.manifest import ArchiveError, Manifest
from quorumstore.protocol.messages import ShardKey

_MANIFEST = "manifest.json"
_METADATA = "metadata.pb"


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether `fs` is the local filesystem, where atomic replacement is a rename."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return "file" in protocols or "local" in protocols


class ArchiveStore:
    def __init__(self, url: str):
        self.url = url
        try:
            self._fs, root = fsspec.core.url_to_fs(url)
        except (ValueError, ImportError) as e:
            raise ArchiveError(
                f"cannot use {url} as the archive: {e}; give a local path or an fsspec URL "
                "whose filesystem package is installed (s3://: pip install quorumstore[s3])"
            ) from e
        self._root = root.rstrip("/")
        self._local = is_local(self._fs)

    def _shard(self, shard: ShardKey) -> str:
        return f"{self._root}/shards/{shard[0]}/{shard[1]}"

    # ------------------------------------------------------------------ manifests

    def load_manifest(self, shard: ShardKey) -> Manifest | None:
        path = f"{self._shard(shard)}/{_MANIFEST}"
        data = self._read(path)
        return None if data is None else Manifest.from_json(data, path)

    def save_manifest(self, manifest: Manifest) -> None:
        self._replace(f"{self._shard(manifest.shard)}/{_MANIFEST}", manifest.to_json())

    # ------------------------------------------------------------------ objects

    def put(self, shard: ShardKey, name: str, data: bytes) -> int:
        """Writes object `name` of `shard` whole; returns its size."""
        self._replace(f"{self._shard(shard)}/{name}", data)
        return len(data)

    def put_stream(self, shard: ShardKey, name: str, parts: Iterable[bytes]) -> int:
        """Writes object `name` from `parts` (a snapshot: too large to hold in memory)."""
        path = f"{self._shard(shard)}/{name}"
        if self._local:
            return _write_local(Path(path), parts)
        size = 0
        with self._fs.open(path, "wb") as f:
            for part in parts:
                f.write(part)
                size += len(part)
        return size

    def get(self, shard: ShardKey, name: str) -> bytes:
        data = self._read(f"{self._shard(shard)}/{name}")
        if data is None:
            raise ArchiveError(
                f"the archive at {self.url} lacks {name} of shard {shard[0]}/{shard[1]}, "
                "which its manifest names (deleted by hand, or by a deposed leader's retention)"
            )
        return data

    @contextlib.contextmanager
    def open(self, shard: ShardKey, name: str) -> Iterator[BinaryIO]:
        path = f"{self._shard(shard)}/{name}"
        try:
            with self._fs.open(path, "rb") as f:
                yield f
        except FileNotFoundError:
            raise ArchiveError(
                f"the archive at {self.url} lacks {name} of shard {shard[0]}/{shard[1]}, "
                "which its manifest names"
            ) from None

    def names(self, shard: ShardKey) -> list[str]:
        """Every object name under the shard, leftovers of cut uploads included."""
        prefix = self._shard(shard)
        self._fs.invalidate_cache(prefix)
        try:
            found = self._fs.find(prefix)
        except FileNotFoundError:
            return []
        return [p[len(prefix) + 1 :] for p in (str(p) for p in found) if not p.endswith(_MANIFEST)]

    def delete(self, shard: ShardKey, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                self._fs.rm_file(f"{self._shard(shard)}/{name}")

    # ------------------------------------------------------------------ coordinator metadata

    def save_metadata(self, data: bytes) -> None:
        self._replace(f"{self._root}/{_METADATA}", data)

    def load_metadata(self) -> bytes | None:
        return self._read(f"{self._root}/{_METADATA}")

    # ------------------------------------------------------------------ plumbing

    def _read(self, path: str) -> bytes | None:
        try:
            data: bytes = self._fs.cat_file(path)
        except FileNotFoundError:
            return None
        return data

    def _replace(self, path: str, data: bytes) -> None:
        if self._local:
            _write_local(Path(path), [data])
        else:
            self._fs.pipe_file(path, data)


def _write_local(target: Path, parts: Iterable[bytes]) -> int:
    """Writes `parts` beside `target` under a name of its own (two writers of one manifest
    must not share a temporary file), fsyncs, renames and fsyncs the directory."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    size = 0
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
                size += len(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _fsync_dir(target.parent)
    return size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
