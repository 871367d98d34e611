"""Holding a metadata location on an object store with conditional writes.

An object store has no lock a crashed process gives back, and fsspec has no portable
compare-and-swap. Two conditions on a put are enough: create only if absent, and
replace only the version read (by its ETag). S3's PutObject takes them as
`If-None-Match: *` and `If-Match`, as do the servers that copy its API; Azure Blob
Storage's Put Blob takes the same headers, which its SDK spells `overwrite=False` and
`match_condition=IfNotModified`. `ConditionalObject` is one object written only under
them, on either (`conditional_object` picks by the fsspec filesystem). `ObjectLease`
builds on it a lease that a coordinator renews while it runs: a second coordinator
that finds the lease renewed is refused, one that finds it abandoned (not renewed for
a whole lease period, or released) takes it over. The lease is what refuses; the
fence is the metadata record itself, which every coordinator writes on the condition
that it still holds the version it wrote last.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import fsspec.asyn

log = logging.getLogger(__name__)

#: How long a coordinator's lease lasts unrenewed; it renews it 4 times as often.
LEASE_S = 10.0
#: How often a coordinator waiting for a lease looks for its renewal.
LEASE_POLL_S = 0.5


class ConditionFailed(Exception):
    """The object is not the version this writer saw last: another writer changed it."""


def conditional_object(fs: fsspec.AbstractFileSystem, path: str) -> ConditionalObject | None:
    """`path` on `fs` as a ConditionalObject; None if `fs` takes no write conditions
    that this module reaches (local files are locked instead; GCS's generation
    conditions are not implemented here)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if any(p in ("s3", "s3a") for p in protocols):
        return S3Object(fs, path)
    if any(p in ("abfs", "abfss", "az") for p in protocols):
        return AzureBlobObject(fs, path)
    return None


class ConditionalObject(ABC):
    """One object on an object store, replaced only in the version last seen here."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str):
        self._fs = fs
        self.path = path
        self._bucket, self._key, _ = fs.split_path(path)
        #: The ETag of the version this object last read or wrote; None: absent.
        self.etag: str | None = None

    def beside(self, suffix: str) -> ConditionalObject:
        """The object named `suffix` longer, on the same store."""
        return type(self)(self._fs, self.path + suffix)

    def read(self) -> bytes | None:
        """The object's data (None if absent), remembering its version."""
        found = fsspec.asyn.sync(self._fs.loop, self._get)
        self.etag = None if found is None else found[1]
        return None if found is None else found[0]

    def write(self, data: bytes) -> None:
        """Replaces the version last seen (creates the object if none was); raises
        ConditionFailed if another writer changed it meanwhile."""
        try:
            etag = fsspec.asyn.sync(self._fs.loop, self._put, data, self.etag)
        except _ConditionNotMet as e:
            # A put whose answer was lost and that was sent again fails its own condition:
            # the object holding exactly this data is this writer's version.
            if self.read() == data:
                return
            raise ConditionFailed(str(e.__cause__)) from e.__cause__
        finally:
            self._fs.invalidate_cache(f"{self._bucket}/{self._key}")
        self.etag = etag

    @abstractmethod
    async def _get(self) -> tuple[bytes, str] | None:
        """The object's data and ETag; None if absent."""

    @abstractmethod
    async def _put(self, data: bytes, etag: str | None) -> str:
        """Puts `data` if the object is at `etag` (absent if None); returns the new ETag,
        or raises _ConditionNotMet (from the store's error)."""


class _ConditionNotMet(Exception):
    """The store refused a conditional put; its error is the cause."""


class S3Object(ConditionalObject):
    """On S3 and the servers that copy its API (s3fs)."""

    async def _get(self) -> tuple[bytes, str] | None:
        try:
            response = await self._fs._call_s3("get_object", Bucket=self._bucket, Key=self._key)
        except FileNotFoundError:
            return None
        try:
            return await response["Body"].read(), response["ETag"]
        finally:
            response["Body"].close()

    async def _put(self, data: bytes, etag: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            response = await self._fs._call_s3(
                "put_object", Bucket=self._bucket, Key=self._key, Body=data, **condition
            )
        except OSError as e:
            if _is_s3_condition_failure(e):
                raise _ConditionNotMet from e
            raise
        return str(response["ETag"])


def _is_s3_condition_failure(error: BaseException) -> bool:
    """S3 answers a failed condition with 412 (409 for a concurrent conditional write);
    s3fs turns both into OSErrors caused by botocore's ClientError."""
    if isinstance(error, FileExistsError):
        return True
    response: dict[str, Any] = getattr(error.__cause__, "response", None) or {}
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


class AzureBlobObject(ConditionalObject):
    """On Azure Blob Storage (adlfs): a block blob put whole, with Put Blob's conditions."""

    def _blob(self) -> Any:
        return self._fs.service_client.get_blob_client(self._bucket, self._key)

    async def _get(self) -> tuple[bytes, str] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            download = await self._blob().download_blob()
            return await download.readall(), str(download.properties.etag)
        except ResourceNotFoundError:
            return None

    async def _put(self, data: bytes, etag: str | None) -> str:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        condition: dict[str, Any] = (
            {"overwrite": False}
            if etag is None
            else {"overwrite": True, "etag": etag, "match_condition": MatchConditions.IfNotModified}
        )
        try:
            response = await self._blob().upload_blob(data, **condition)
        except (ResourceExistsError, ResourceModifiedError) as e:  # 409, 412
            raise _ConditionNotMet from e
        return str(response["etag"])


class ObjectLease:
    """A lease on a location, kept in `lock` as JSON: who holds it and when it renewed."""

    def __init__(self, lock: ConditionalObject, holder: str, lease_s: float = LEASE_S):
        self._lock = lock
        self.holder = holder
        self.lease_s = lease_s
        #: Whether this lease was taken and not released: only then is the object ours.
        self.held = False

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 4

    def take(self, refuse: Callable[[str], Exception]) -> None:
        """Takes the lease, waiting up to a lease period to see whether a holder still
        renews it; raises `refuse(holder)` if it does. A lease whose record says it
        was released, or is unreadable, is taken at once."""
        while not self.held:
            record = _parse(self._lock.read())
            if record is not None and not record.get("released"):
                seen = self._lock.etag
                log.info(
                    "the metadata location is leased by %s; waiting up to %.0f s for it to "
                    "renew the lease before taking it over",
                    record.get("holder"),
                    self.lease_s,
                )
                if self._renewed_within_a_lease(seen):
                    raise refuse(str(record.get("holder", "another coordinator")))
            try:
                self._lock.write(self._record(released=False))
                self.held = True
            except ConditionFailed:
                continue  # another coordinator moved first: look again

    def _renewed_within_a_lease(self, seen: str | None) -> bool:
        """Whether the lease's version changes (its holder renews) within a lease period."""
        deadline = time.monotonic() + self.lease_s
        while time.monotonic() < deadline:
            time.sleep(LEASE_POLL_S)
            data = self._lock.read()
            if self._lock.etag != seen:
                record = _parse(data)
                return record is not None and not record.get("released")
        return False

    def renew(self) -> None:
        """Renews the lease; raises ConditionFailed if another coordinator took it."""
        self._lock.write(self._record(released=False))

    def release(self) -> None:
        """Marks the lease released so the next coordinator need not wait it out; a
        lease this store never took (another coordinator's) is left alone."""
        if not self.held:
            return
        self.held = False
        try:
            self._lock.write(self._record(released=True))
        except ConditionFailed:
            pass  # taken over already: nothing of ours to release

    def _record(self, released: bool) -> bytes:
        return json.dumps(
            {"holder": self.holder, "renewed_at": time.time(), "released": released}
        ).encode()


def _parse(data: bytes | None) -> dict[str, Any] | None:
    """A lease record; None if absent or unreadable (then nobody can be said to hold it)."""
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
