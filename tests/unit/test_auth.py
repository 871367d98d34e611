"""Grants, static tokens and OIDC tokens checked against a PEM public key: no server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from quorumstore.node.auth.access import Access, Grants
from quorumstore.node.auth.tokens import OidcSettings, OidcTokens, StaticTokens, TokenError


def test_grants_per_principal_and_namespace_with_wildcards() -> None:
    grants = Grants.parse(
        {"alice": {"*": "write"}, "bob": {"orders": "read"}, "*": {"public": "read"}}
    )
    assert grants.allows("alice", "anything", Access.WRITE)
    assert grants.allows("bob", "orders", Access.READ)
    assert not grants.allows("bob", "orders", Access.WRITE)
    assert not grants.allows("bob", "default", Access.READ)
    assert grants.allows("carol", "public", Access.READ)
    assert not grants.allows("carol", "public", Access.WRITE)
    assert Grants().allows("anyone", "anything", Access.WRITE)


def test_static_tokens_name_their_principal() -> None:
    tokens = StaticTokens({"app": "a-long-random-token-0123"})
    assert tokens.verify("a-long-random-token-0123") == ("app", None)
    with pytest.raises(TokenError, match="not one of"):
        tokens.verify("a-long-random-token-0124")


def _public_key_file(tmp_path: Path, key: object) -> Path:
    path = tmp_path / "issuer.pem"
    path.write_bytes(
        key.public_key().public_bytes(  # type: ignore[attr-defined]
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path


@pytest.mark.parametrize("algorithm", ["ES256", "RS256"])
def test_oidc_tokens_checked_against_a_public_key(tmp_path: Path, algorithm: str) -> None:
    key = (
        ec.generate_private_key(ec.SECP256R1())
        if algorithm == "ES256"
        else rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    verifier = OidcTokens(
        OidcSettings(
            issuer="https://id.example",
            audience="qs",
            public_key_file=_public_key_file(tmp_path, key),
        )
    )
    now = int(time.time())
    claims = {"iss": "https://id.example", "aud": "qs", "sub": "svc", "exp": now + 60}
    principal, expiry = verifier.verify(jwt.encode(claims, key, algorithm=algorithm))
    assert (principal, expiry) == ("svc", now + 60)
    refused = {
        "expired": {**claims, "exp": now - 60},
        "Audience doesn.t match": {**claims, "aud": "other"},
        "Invalid issuer": {**claims, "iss": "https://evil.example"},
        'missing the "exp"': {k: v for k, v in claims.items() if k != "exp"},
        "no 'sub' claim": {k: v for k, v in claims.items() if k != "sub"},
    }
    for reason, bad in refused.items():
        with pytest.raises(TokenError, match=reason):
            verifier.verify(jwt.encode(bad, key, algorithm=algorithm))
    # A token signed with HMAC, keyed by the public key's text (the old algorithm
    # confusion attack), is refused.
    public_pem = _public_key_file(tmp_path, key).read_bytes()
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = _b64(hmac.new(public_pem, f"{header}.{body}".encode(), hashlib.sha256).digest())
    with pytest.raises(TokenError, match="not valid"):
        verifier.verify(f"{header}.{body}.{signature}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
