"""The cluster secret: what admits a caller to a node's internal port.

Node control, replication and snapshots travel on a port of their own (the internal
port), and every call there carries the cluster's secret, a random 32-byte token, in
the `METADATA_KEY` header. `SecretCheck`, a server interceptor, ends any other call as
UNAUTHENTICATED before a servicer sees it, comparing in constant time. The token is
kept in a file only its owner may read (`write_file`, `from_file`) or handed over in
memory, never on a command line, which any local user can read with `ps`.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc

from quorumstore.wire.guards import Guard, GuardInterceptor, RefusalLog, metadata_value

#: The gRPC header that carries the secret on every internal call.
METADATA_KEY = "qs-cluster-secret"
#: The header in which the coordinator names itself (a random id per run) on its calls:
#: a node compares assignment versions only with those of the same coordinator.
COORDINATOR_METADATA_KEY = "qs-coordinator"
#: Bytes of randomness in a secret; its text is their hex, twice as many characters.
SECRET_BYTES = 32


class SecretError(ValueError):
    """A secret file is missing, unreadable, readable by others, or holds no secret."""


class ClusterSecret:
    """The cluster's shared token, as the hex text that travels in metadata."""

    def __init__(self, token: str) -> None:
        if len(token) != 2 * SECRET_BYTES or not _is_hex(token):
            raise SecretError(
                f"a cluster secret is {2 * SECRET_BYTES} hex digits ({SECRET_BYTES} random bytes), "
                f"got {len(token)} characters"
            )
        self._token = token

    @classmethod
    def generate(cls) -> ClusterSecret:
        return cls(secrets.token_hex(SECRET_BYTES))

    @classmethod
    def from_file(cls, path: Path) -> ClusterSecret:
        """Reads a secret written by `write_file`; refuses one that other users may read."""
        try:
            mode = path.stat().st_mode
            text = path.read_text().strip()
        except OSError as e:
            raise SecretError(f"cannot read the cluster secret file {path}: {e.strerror}") from None
        if mode & 0o077:
            raise SecretError(
                f"the cluster secret file {path} may be read by other users (mode {mode & 0o777:o}); "
                f"make it private with `chmod 600 {path}`"
            )
        try:
            return cls(text)
        except SecretError as e:
            raise SecretError(f"{path}: {e}") from None

    def write_file(self, path: Path) -> None:
        """Writes the secret to `path`, readable by its owner only (mode 0600)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self._token + "\n")

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The header every internal call carries."""
        return ((METADATA_KEY, self._token),)

    def admits(self, presented: str | bytes | None) -> bool:
        """Whether `presented` is this secret, compared in constant time."""
        if isinstance(presented, str):
            presented = presented.encode("ascii", "replace")
        if presented is None:
            return False
        return hmac.compare_digest(presented, self._token.encode())

    def __repr__(self) -> str:
        return "ClusterSecret(<hidden>)"


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (a name is resolved; one that does not
    resolve counts as not loopback)."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


class SecretCheck(GuardInterceptor):
    """Ends every call that does not carry the cluster secret as UNAUTHENTICATED, logging
    each refused caller (by host) once."""

    def __init__(self, secret: ClusterSecret, server_name: Callable[[], str]) -> None:
        self._secret = secret
        self._refusals = RefusalLog(server_name)

    def guard_for(self, details: grpc.HandlerCallDetails) -> Guard | None:
        presented = metadata_value(details, METADATA_KEY)
        if self._secret.admits(presented):
            return None
        return lambda context: self._refuse(context, details.method, presented is None)

    @asynccontextmanager
    async def _refuse(
        self, context: grpc.aio.ServicerContext, method: str, missing: bool
    ) -> AsyncIterator[None]:
        """Aborts the call as UNAUTHENTICATED before any servicer sees it (a request
        stream is never read)."""
        self._refusals.note(
            context.peer(), method, f"{'no' if missing else 'a wrong'} cluster secret"
        )
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "this is a quorumstore node's internal port, and the call "
            + ("carries no cluster secret" if missing else "carries another cluster's secret")
            + "; only members of the cluster may call it (docs/security.md)",
        )
        yield  # never reached: abort raises
