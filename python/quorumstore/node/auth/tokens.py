"""Bearer tokens: static tokens from a private file, or OIDC JWTs signed by an issuer.

A static token is a long random string that names one principal; tokens are compared
by their SHA-256, so no string comparison leaks how much of a guess was right. An OIDC
token is a JWT: its signature is checked with the issuer's public keys (a PEM file, or
the JWKS the issuer publishes, found through its discovery document), and its `exp`,
`iss` and `aud` claims must hold. PyJWT does the JWT work: it is the maintained,
widely used implementation, with JWKS fetching and caching built in.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt

#: Signature algorithms accepted in OIDC tokens: public-key ones only, so that a token
#: signed with a public key taken for an HMAC secret is refused.
ASYMMETRIC_ALGORITHMS = [
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
]
#: How long fetched signing keys are used before the issuer's JWKS is fetched again.
JWKS_LIFESPAN_S = 300
_FETCH_TIMEOUT_S = 10


class TokenError(Exception):
    """A token that admits nobody: unknown, expired, forged or malformed."""


class TokenVerifier(Protocol):
    def verify(self, token: str) -> tuple[str, float | None]:
        """(principal, expiry as a Unix time or None) of a valid token; raises TokenError."""
        ...


class StaticTokens:
    """Tokens listed in the auth config: principal -> token."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._by_digest: dict[bytes, str] = {}
        for principal, token in tokens.items():
            if not isinstance(token, str) or len(token) < 16:
                raise ValueError(
                    f"the token of {principal!r} must be a string of at least 16 characters"
                )
            self._by_digest[_digest(token)] = principal

    def verify(self, token: str) -> tuple[str, float | None]:
        principal = self._by_digest.get(_digest(token))
        if principal is None:
            raise TokenError("the token is not one of the configured tokens")
        return principal, None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class OidcSettings:
    """The `oidc` object of an auth config."""

    issuer: str | None = None
    audience: str | None = None
    #: Where the issuer's public keys are: a JWKS URL, or a PEM public key file; neither:
    #: the JWKS named by the issuer's discovery document.
    jwks_url: str | None = None
    public_key_file: Path | None = None
    #: The claim that names the principal.
    principal_claim: str = "sub"

    @classmethod
    def parse(cls, raw: object) -> OidcSettings:
        if not isinstance(raw, dict):
            raise TypeError('"oidc" must be an object')
        known = {"issuer", "audience", "jwks_url", "public_key_file", "principal_claim"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f'unknown "oidc" settings {unknown}; known: {sorted(known)}')
        settings = cls(
            issuer=raw.get("issuer"),
            audience=raw.get("audience"),
            jwks_url=raw.get("jwks_url"),
            public_key_file=Path(raw["public_key_file"]) if raw.get("public_key_file") else None,
            principal_claim=raw.get("principal_claim", "sub"),
        )
        if (
            settings.issuer is None
            and settings.jwks_url is None
            and settings.public_key_file is None
        ):
            raise ValueError('"oidc" needs an issuer, a jwks_url or a public_key_file')
        return settings


class OidcTokens:
    """JWTs of one issuer (see the module docstring)."""

    def __init__(self, settings: OidcSettings) -> None:
        self._settings = settings
        self._key: Any = None
        self._jwks: jwt.PyJWKClient | None = None
        if settings.public_key_file is not None:
            try:
                self._key = settings.public_key_file.read_bytes()
            except OSError as e:
                raise ValueError(
                    f"cannot read the OIDC public key {settings.public_key_file}: {e.strerror}"
                ) from None
        elif settings.jwks_url is not None:
            self._jwks = jwt.PyJWKClient(
                settings.jwks_url, lifespan=JWKS_LIFESPAN_S, timeout=_FETCH_TIMEOUT_S
            )

    def _signing_key(self, token: str) -> Any:
        if self._key is not None:
            return self._key
        if self._jwks is None:
            assert self._settings.issuer is not None
            self._jwks = jwt.PyJWKClient(
                _discover_jwks(self._settings.issuer),
                lifespan=JWKS_LIFESPAN_S,
                timeout=_FETCH_TIMEOUT_S,
            )
        return self._jwks.get_signing_key_from_jwt(token).key

    def verify(self, token: str) -> tuple[str, float | None]:
        settings = self._settings
        try:
            claims = jwt.decode(
                token,
                self._signing_key(token),
                algorithms=ASYMMETRIC_ALGORITHMS,
                audience=settings.audience,
                issuer=settings.issuer,
                options={"require": ["exp"], "verify_aud": settings.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise TokenError("the token has expired") from None
        except jwt.PyJWKClientError as e:
            raise TokenError(f"the token's signing key cannot be found: {e}") from None
        except jwt.InvalidTokenError as e:
            raise TokenError(f"the token is not valid: {e}") from None
        principal = claims.get(settings.principal_claim)
        if not isinstance(principal, str) or not principal:
            raise TokenError(
                f"the token has no {settings.principal_claim!r} claim naming its principal"
            )
        return principal, float(claims["exp"])


def _discover_jwks(issuer: str) -> str:
    """The JWKS URL of an OIDC issuer, from its discovery document."""
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        with urllib.request.urlopen(url, timeout=_FETCH_TIMEOUT_S) as response:
            document = json.load(response)
    except (OSError, ValueError) as e:
        raise TokenError(f"cannot read the issuer's discovery document {url}: {e}") from None
    jwks_uri = document.get("jwks_uri") if isinstance(document, dict) else None
    if not isinstance(jwks_uri, str):
        raise TokenError(f"the discovery document {url} names no jwks_uri")
    return jwks_uri
