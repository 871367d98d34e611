"""The token check of a node's client port, and the auth config it is built from.

Every call must carry `authorization: Bearer <token>` (as Oxia's clients send it); a
call without one, or with a token no verifier accepts, ends as UNAUTHENTICATED before
any servicer sees it. A verified token is remembered until it expires (at most
`_CACHE_S`), so the signature is checked once, not on every call, and a first check that
has to fetch an issuer's keys runs off the event loop.

The auth config is a JSON file, readable by its owner only when it holds tokens:

    {"tokens": {"alice": "<random token>"},
     "oidc": {"issuer": "https://id.example.com", "audience": "quorumstore"},
     "grants": {"alice": {"*": "write"}, "*": {"reports": "read"}}}
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from quorumstore.node.auth.access import METHOD_ACCESS, Access, Caller, Grants, set_caller
from quorumstore.node.auth.tokens import (
    OidcSettings,
    OidcTokens,
    StaticTokens,
    TokenError,
    TokenVerifier,
)
from quorumstore.wire.guards import Guard, GuardInterceptor, RefusalLog, metadata_value
from quorumstore.wire.metadata import AUTHORIZATION_METADATA_KEY, BEARER_PREFIX, bearer_metadata

#: A verified token is trusted this long at most without checking it again.
_CACHE_S = 60.0
_CACHE_ENTRIES = 10_000


class AuthConfigError(ValueError):
    """An auth config that cannot be used."""


@dataclass(frozen=True)
class AuthConfig:
    """How callers of the client port are authenticated and what they may do."""

    verifiers: tuple[TokenVerifier, ...]
    grants: Grants

    @classmethod
    def parse(cls, raw: object, source: str = "the auth config") -> AuthConfig:
        try:
            if not isinstance(raw, dict):
                raise TypeError("it must be a JSON object")
            unknown = sorted(set(raw) - {"tokens", "oidc", "grants"})
            if unknown:
                raise ValueError(f'unknown settings {unknown}; known: "tokens", "oidc", "grants"')
            verifiers: list[TokenVerifier] = []
            if raw.get("tokens"):
                if not isinstance(raw["tokens"], dict):
                    raise ValueError('"tokens" must map principals to tokens')
                verifiers.append(StaticTokens(raw["tokens"]))
            if raw.get("oidc"):
                verifiers.append(OidcTokens(OidcSettings.parse(raw["oidc"])))
            if not verifiers:
                raise ValueError('it names no "tokens" and no "oidc" issuer, so nobody could call')
            return cls(tuple(verifiers), Grants.parse(raw.get("grants")))
        except (TypeError, ValueError) as e:
            raise AuthConfigError(f"{source}: {e}") from None

    @classmethod
    def from_file(cls, path: Path) -> AuthConfig:
        return cls.parse(read_auth_file(path), str(path))


def read_auth_file(path: Path) -> Any:
    """The JSON of an auth config file; refuses one holding tokens that others may read."""
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except OSError as e:
        raise AuthConfigError(f"cannot read the auth config {path}: {e.strerror}") from None
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise AuthConfigError(f"{path} is not JSON: {e}") from None
    if isinstance(raw, dict) and raw.get("tokens") and mode & 0o077:
        raise AuthConfigError(
            f"the auth config {path} holds tokens and may be read by other users "
            f"(mode {mode & 0o777:o}); make it private with `chmod 600 {path}`"
        )
    return raw


class _Unauthenticated(Exception):
    pass


class TokenCheck(GuardInterceptor):
    """Authenticates every call of the client port (see the module docstring)."""

    def __init__(self, config: AuthConfig, server_name: Callable[[], str]) -> None:
        self._config = config
        self._verified: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._refusals = RefusalLog(server_name)

    def guard_for(self, details: grpc.HandlerCallDetails) -> Guard:
        presented = metadata_value(details, AUTHORIZATION_METADATA_KEY)
        access = METHOD_ACCESS.get(details.method, Access.WRITE)
        return lambda context: self._admit(presented, details.method, access, context)

    @asynccontextmanager
    async def _admit(
        self,
        presented: str | bytes | None,
        method: str,
        access: Access,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[None]:
        try:
            token = _bearer_token(presented)
            principal = await self._principal(token)
        except _Unauthenticated as e:
            self._refusals.note(context.peer(), method, str(e))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{e} (docs/security.md)")
        set_caller(Caller(principal, access, self._config.grants, bearer_metadata(token)))
        yield

    async def _principal(self, token: str) -> str:
        now = time.time()
        cached = self._verified.get(token)
        if cached is not None and cached[1] > now:
            return cached[0]
        failures = []
        for verifier in self._config.verifiers:
            try:
                principal, expiry = await asyncio.get_running_loop().run_in_executor(
                    None, verifier.verify, token
                )
            except TokenError as e:
                failures.append(str(e))
                continue
            until = min(now + _CACHE_S, expiry if expiry is not None else now + _CACHE_S)
            self._verified[token] = (principal, until)
            self._verified.move_to_end(token)
            while len(self._verified) > _CACHE_ENTRIES:
                self._verified.popitem(last=False)
            return principal
        raise _Unauthenticated("; ".join(failures))


def _bearer_token(presented: str | bytes | None) -> str:
    if presented is None:
        raise _Unauthenticated(
            "the call carries no bearer token (metadata `authorization: Bearer <token>`)"
        )
    if isinstance(presented, bytes):
        presented = presented.decode("utf-8", "replace")
    if not presented.startswith(BEARER_PREFIX) or len(presented) == len(BEARER_PREFIX):
        raise _Unauthenticated("the authorization metadata is not of the form `Bearer <token>`")
    return presented[len(BEARER_PREFIX) :]
