"""Network addresses as quorumstore writes them: `host:port`, which gRPC dials and binds."""

from __future__ import annotations


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 literal in brackets (`[::1]:6648`), as gRPC expects."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"
