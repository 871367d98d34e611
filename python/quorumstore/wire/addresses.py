"""Network addresses as quorumstore writes them: `host:port`, which gRPC dials and binds."""

from __future__ import annotations


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 literal in brackets (`[::1]:6648`), as gRPC expects."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def host_of(address: str) -> str:
    """The host of `host:port`, an IPv6 literal without its brackets."""
    return address.rpartition(":")[0].strip("[]")


def is_host_port(address: str) -> bool:
    """Whether `address` is `host:port` with a port gRPC can dial."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
