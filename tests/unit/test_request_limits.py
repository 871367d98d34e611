"""The client port's resource limits (node/limits.py): their settings and validation, who
counts as a client, how amounts are held, and how the command line and Spark set them."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest

from quorumstore.cli import options
from quorumstore.cli.errors import CliError
from quorumstore.node.limits import (
    LimitExceeded,
    RequestLimits,
    Tally,
    client_of,
    limit_settings,
)
from quorumstore.node.oxia.sessions import SessionKeeper
from quorumstore.protocol.types import LogPosition
from quorumstore.spark.config import PREFIX, HostingConfig
from quorumstore.wire.channels import MAX_MESSAGE_BYTES


def test_every_limit_has_a_flag_and_a_spark_conf_named_after_it() -> None:
    settings = limit_settings()
    assert len(settings) == 7
    for name, setting in settings.items():
        assert setting.flag == "--" + name.replace("_", "-")
        camel = "".join(word.capitalize() for word in name.split("_"))
        assert setting.spark_conf == PREFIX + camel[0].lower() + camel[1:]
        assert setting.in_bytes == name.endswith(("_bytes", "_bytes_per_client", "_bytes_total"))


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "5", None])
@pytest.mark.parametrize("name", list(limit_settings()))
def test_a_limit_must_be_a_positive_whole_number(name: str, value: Any) -> None:
    setting = limit_settings()[name]
    with pytest.raises(ValueError) as caught:
        RequestLimits(**{name: value})
    assert str(caught.value) == (
        f"{name} must be a positive whole number, got {value!r} "
        f"({setting.flag}, {setting.spark_conf})"
    )


def test_a_request_may_not_exceed_what_quorumstore_sends() -> None:
    assert RequestLimits(max_request_bytes=MAX_MESSAGE_BYTES).max_request_bytes == MAX_MESSAGE_BYTES
    with pytest.raises(ValueError, match="at most 268435456.*--max-request-bytes"):
        RequestLimits(max_request_bytes=MAX_MESSAGE_BYTES + 1)


def test_refusals_name_the_limit_and_its_settings() -> None:
    limits = RequestLimits()
    limits.check_ops(10_000)
    with pytest.raises(LimitExceeded) as caught:
        limits.check_ops(20_000)
    assert caught.value.limit == "max_ops_per_request"
    assert caught.value.message == (
        "the request has 20000 ops, more than the limit of 10000 "
        "(--max-ops-per-request, spark.quorumstore.maxOpsPerRequest; docs/limits.md)"
    )
    staged = limits.exceeded("max_staged_bytes_total", "this node would hold 1 more")
    assert staged.message == (
        "this node would hold 1 more, more than the limit of 64 GiB (68719476736 bytes; "
        "--max-staged-bytes-total, spark.quorumstore.maxStagedBytesTotal; docs/limits.md)"
    )


class _Context:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


@pytest.mark.parametrize(
    ("peer", "client"),
    [
        ("ipv4:1.2.3.4:5555", "1.2.3.4"),
        ("ipv6:%5B::1%5D:44218", "::1"),
        ("ipv6:[2001:db8::7]:6648", "2001:db8::7"),
        ("unix:/run/quorumstore.sock", "unix:/run/quorumstore.sock"),
        ("ipv4:", "ipv4:"),
        ("", ""),
    ],
)
def test_a_client_is_the_host_of_its_peer(peer: str, client: str) -> None:
    assert client_of(_Context(peer)) == client  # type: ignore[arg-type]


def _tally(limit: int) -> Tally:
    return Tally(
        RequestLimits(max_streams_per_client=limit),
        "max_streams_per_client",
        lambda holder, held: f"{holder} would hold {held}",
    )


def test_a_tally_refuses_past_its_limit_and_counts_nothing_then() -> None:
    tally = _tally(3)
    tally.take("a", 2)
    tally.take("b", 3)
    with pytest.raises(LimitExceeded, match=r"^a would hold 4, more than the limit of 3 "):
        tally.take("a", 2)
    assert (tally.held("a"), tally.held("b")) == (2, 3)
    tally.give_back("a", 2)
    tally.take("a", 3)


def test_a_tally_gives_back_what_a_block_held_however_it_ends() -> None:
    tally = _tally(1)
    with pytest.raises(RuntimeError), tally.holding("a"):
        assert tally.held("a") == 1
        raise RuntimeError("the call failed")
    assert tally.held("a") == 0
    with tally.holding("a"), pytest.raises(LimitExceeded):
        tally.take("a")


class _Reader:
    def __init__(self) -> None:
        self.term = 1

    @property
    def applied_position(self) -> LogPosition:
        return LogPosition(self.term, 10, 0)

    def open_sessions(self) -> list[Any]:
        return []


class _Host:
    def __init__(self) -> None:
        self.leader = True
        self.state = _Reader()

    def is_leader(self) -> bool:
        return self.leader

    def reader(self) -> Any:
        return self.state


def test_a_session_counts_until_forgotten_or_its_leader_loses_its_clocks() -> None:
    """A new term or the loss of leadership drops a shard's clocks, and with them what
    its sessions counted (a later leader does not know who created them)."""

    async def close(_: Any, session_id: int) -> None:
        raise AssertionError(f"session {session_id} expired")

    async def scenario() -> None:
        keeper = SessionKeeper(lambda: 0, RequestLimits(max_sessions_per_client=1))
        host = _Host()

        def create(session_id: int) -> None:
            keeper.per_client.take("c")
            keeper.started(host, session_id, 60_000, "c")  # type: ignore[arg-type]
            with pytest.raises(LimitExceeded):
                keeper.per_client.take("c")

        create(1)
        host.state.term = 2
        keeper.expire([host], close)  # type: ignore[list-item]
        assert keeper.per_client.held("c") == 0
        create(2)
        host.leader = False
        keeper.expire([host], close)  # type: ignore[list-item]
        assert keeper.per_client.held("c") == 0
        host.leader = True
        create(3)
        keeper.forget(host, 3)  # type: ignore[arg-type]
        assert keeper.per_client.held("c") == 0

    asyncio.run(scenario())


def _node_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_limit_flags(parser)
    return parser.parse_args(argv)


def test_the_command_line_sets_the_limits_and_passes_them_on() -> None:
    assert options.request_limits(_node_flags()) == RequestLimits()
    args = _node_flags("--max-ops-per-request", "5", "--max-staged-bytes-total", "1048576")
    limits = options.request_limits(args)
    assert (limits.max_ops_per_request, limits.max_staged_bytes_total) == (5, 1 << 20)
    assert options.request_limits(_node_flags(*options.limit_flags(args))) == limits
    with pytest.raises(CliError, match="--max-request-bytes"):
        options.request_limits(_node_flags("--max-request-bytes", str(MAX_MESSAGE_BYTES + 1)))
    with pytest.raises(SystemExit):
        _node_flags("--max-streams-per-client", "0")


def test_spark_confs_set_the_limits_of_hosted_nodes() -> None:
    assert HostingConfig.resolve({}).limits == RequestLimits()
    config = HostingConfig.resolve(
        {f"{PREFIX}maxRequestBytes": "32m", f"{PREFIX}maxSessionsPerClient": "100"}
    )
    assert (config.limits.max_request_bytes, config.limits.max_sessions_per_client) == (
        32 << 20,
        100,
    )
    with pytest.raises(ValueError, match=rf"{PREFIX}maxStagedBytesTotal: cannot read 'lots'"):
        HostingConfig.resolve({f"{PREFIX}maxStagedBytesTotal": "lots"})
    with pytest.raises(ValueError, match="max_streams_per_client must be a positive"):
        HostingConfig.resolve({f"{PREFIX}maxStreamsPerClient": "0"})
