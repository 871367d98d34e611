"""Node addresses as servers and clients take them."""

from __future__ import annotations

import pytest

from quorumstore import AsyncClient
from quorumstore.wire.addresses import host_port


def test_host_port_brackets_ipv6_literals_only() -> None:
    assert host_port("127.0.0.1", 6648) == "127.0.0.1:6648"
    assert host_port("node-1.example", 7) == "node-1.example:7"
    assert host_port("::1", 6648) == "[::1]:6648"
    assert host_port("[::1]", 6648) == "[::1]:6648"
    assert host_port("fe80::2", 1) == "[fe80::2]:1"


def test_no_address_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="at least one node address"):
        AsyncClient([])
