"""Typed errors of the quorumstore client.

Every error the client raises is a `QuorumStoreError`, so `except QuorumStoreError`
catches them all. The per-operation outcomes a caller is expected to handle
(`KeyNotFound`, `UnexpectedVersionId`, `SessionDoesNotExist`) name the key; the
others say what failed and what to do about it.

    >>> try:
    ...     raise KeyNotFound("/users/7")
    ... except QuorumStoreError as e:
    ...     print(e)
    key not found: '/users/7'
"""

from __future__ import annotations


class QuorumStoreError(Exception):
    """Base class of every error the quorumstore client raises."""


class KeyNotFound(QuorumStoreError, KeyError):
    """A get (or conditional delete) found no record for the key.

    Also a `KeyError`, so `except KeyError` works as for a mapping.
    """

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"key not found: {self.key!r}"


class UnexpectedVersionId(QuorumStoreError):
    """A conditional put or delete found another version than `expected_version_id`.

    Read the record again (`get`) and retry with its current version id.
    """

    def __init__(self, key: str, expected_version_id: int | None) -> None:
        super().__init__(key, expected_version_id)
        self.key = key
        self.expected_version_id = expected_version_id

    def __str__(self) -> str:
        wanted = (
            "no record" if self.expected_version_id == -1 else f"version {self.expected_version_id}"
        )
        return f"unexpected version id for {self.key!r}: expected {wanted}"


class SessionDoesNotExist(QuorumStoreError):
    """A session the shard does not know (it expired or was closed).

    Raised for a put that named the session (`key` is its key) or for a keep-alive
    or close of it (`key` is None).
    """

    def __init__(self, key: str | None, detail: str = "") -> None:
        super().__init__(key, detail)
        self.key = key
        self.detail = detail

    def __str__(self) -> str:
        if self.key is None:
            return self.detail or "session does not exist"
        return f"session does not exist for the write of {self.key!r}"


class InvalidRequest(QuorumStoreError, ValueError):
    """The server refused a request as malformed (empty key, oversized value, ...).

    Nothing of the request was written. Also a `ValueError`.
    """


class NotSupported(QuorumStoreError):
    """The server does not implement a feature the request needs."""


class Unauthenticated(QuorumStoreError):
    """The cluster wants credentials: no token, or one it does not accept (expired,
    forged, unknown); the message says which."""


class PermissionDenied(QuorumStoreError, PermissionError):
    """The token's principal may not do this to this namespace (the cluster's grants)."""


class NamespaceNotFound(QuorumStoreError):
    """The namespace given to the client does not exist in the cluster."""


class ServiceUnavailable(QuorumStoreError):
    """An operation kept failing on transient errors until its deadline passed.

    The cluster was unreachable, or had no leader for the shard, that long. For a
    write the outcome is unknown (it may have been applied): read the key before
    writing it again. Raise `request_timeout_s` to ride out longer outages.
    """


class ClientClosed(QuorumStoreError):
    """The client was closed; open a new one."""
