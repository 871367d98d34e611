"""Resource limits of a node's client port: what one request, one connection and one
client may take of a node, and how a call past a limit is refused.

Each limit is a field of `RequestLimits`, set by a command-line flag and a Spark conf
(docs/limits.md lists them). A call past one ends with RESOURCE_EXHAUSTED and a message
naming the limit and both settings:

    the request has 20000 ops, more than the limit of 10000
    (--max-ops-per-request, spark.quorumstore.maxOpsPerRequest; docs/limits.md)

Where each is counted:

- ops per request: the Oxia write path (`oxia/writes.py`) and `Read` (`oxia/servicer.py`);
- bytes per request: by gRPC, as the client port's largest message received
  (`wire/channels.client_port_options`); gRPC's own refusal names no setting;
- calls per connection, streams per client: `call_limits.CallLimits`, the interceptor
  every call of the client port passes, which also ends a call whose servicer raised
  `LimitExceeded`;
- sessions per client: `oxia/sessions.py`; staged bytes: `data/staging.py`.

"Per client" is per `client_of(context)`, the caller's host: all processes on one
machine (Spark executors, say) are one client.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from quorumstore.node.aborts import abort
from quorumstore.node.auth.access import current_principal
from quorumstore.wire.channels import MAX_MESSAGE_BYTES

#: Where an operator reads what each limit is for and how to raise it.
LIMITS_DOCS = "docs/limits.md"


@dataclass(frozen=True)
class LimitSetting:
    """How an operator sets one limit."""

    flag: str
    spark_conf: str
    #: Whether the limit is a number of bytes (a Spark conf then takes sizes like 64m).
    in_bytes: bool
    #: What the limit bounds, for `--help`.
    help: str


def _limit(default: int, setting: LimitSetting) -> Any:
    return dataclasses.field(default=default, metadata={"setting": setting})


@dataclass(frozen=True)
class RequestLimits:
    """The limits of one node's client port; the defaults leave room for heavy normal
    use (docs/limits.md says what each is sized for)."""

    max_ops_per_request: int = _limit(
        10_000,
        LimitSetting(
            "--max-ops-per-request",
            "spark.quorumstore.maxOpsPerRequest",
            False,
            "puts, deletes and range deletes of one Oxia write, or gets of one read",
        ),
    )
    max_request_bytes: int = _limit(
        64 << 20,
        LimitSetting(
            "--max-request-bytes",
            "spark.quorumstore.maxRequestBytes",
            True,
            f"bytes of one request message; at most {MAX_MESSAGE_BYTES}",
        ),
    )
    max_calls_per_connection: int = _limit(
        4096,
        LimitSetting(
            "--max-calls-per-connection",
            "spark.quorumstore.maxCallsPerConnection",
            False,
            "calls in progress on one client connection, streams included",
        ),
    )
    max_sessions_per_client: int = _limit(
        16_384,
        LimitSetting(
            "--max-sessions-per-client",
            "spark.quorumstore.maxSessionsPerClient",
            False,
            "open sessions one client host has on the shards this node leads",
        ),
    )
    max_streams_per_client: int = _limit(
        4096,
        LimitSetting(
            "--max-streams-per-client",
            "spark.quorumstore.maxStreamsPerClient",
            False,
            "open notification, shard assignment and sequence update streams of one client host",
        ),
    )
    max_staged_bytes_per_client: int = _limit(
        16 << 30,
        LimitSetting(
            "--max-staged-bytes-per-client",
            "spark.quorumstore.maxStagedBytesPerClient",
            True,
            "bytes of rows one client host has staged on this node, not yet published",
        ),
    )
    max_staged_bytes_total: int = _limit(
        64 << 30,
        LimitSetting(
            "--max-staged-bytes-total",
            "spark.quorumstore.maxStagedBytesTotal",
            True,
            "bytes of rows all clients have staged on this node, not yet published",
        ),
    )

    def __post_init__(self) -> None:
        for name, setting in limit_settings().items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name} must be a positive whole number, got {value!r} "
                    f"({setting.flag}, {setting.spark_conf})"
                )
        if self.max_request_bytes > MAX_MESSAGE_BYTES:
            setting = limit_settings()["max_request_bytes"]
            raise ValueError(
                f"max_request_bytes must be at most {MAX_MESSAGE_BYTES}, the largest message "
                f"quorumstore's processes send, got {self.max_request_bytes} "
                f"({setting.flag}, {setting.spark_conf})"
            )

    def exceeded(self, name: str, found: str) -> LimitExceeded:
        """The refusal of a call past the limit `name`; `found` says what the call would
        amount to ("the request has 20000 ops")."""
        setting = limit_settings()[name]
        value = getattr(self, name)
        limit, exactly = (
            (_binary_size(value), f"{value} bytes; ") if setting.in_bytes else (value, "")
        )
        return LimitExceeded(
            name,
            f"{found}, more than the limit of {limit} "
            f"({exactly}{setting.flag}, {setting.spark_conf}; {LIMITS_DOCS})",
        )

    def check_ops(self, ops: int) -> None:
        """Refuses a request of more than `max_ops_per_request` operations."""
        if ops > self.max_ops_per_request:
            raise self.exceeded("max_ops_per_request", f"the request has {ops} ops")


def limit_settings() -> dict[str, LimitSetting]:
    """Each limit's `RequestLimits` field name and how it is set, in declaration order."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(RequestLimits)}


def _binary_size(value: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift:
            return f"{value / (1 << shift):.4g} {unit}"
    return f"{value} B"


class LimitExceeded(Exception):
    """A call refused for a resource limit (RESOURCE_EXHAUSTED); made by
    `RequestLimits.exceeded`, so its message names the limit's settings."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        #: The `RequestLimits` field of the limit.
        self.limit = limit
        self.message = message

    async def abort(self, context: grpc.aio.ServicerContext) -> NoReturn:
        await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, self.message)


def client_of(context: grpc.aio.ServicerContext) -> str:
    """The client a call counts against: its authenticated principal when the client
    port checks tokens (also through a relaying node), else its host, from the peer
    gRPC names (`ipv4:1.2.3.4:5555` is 1.2.3.4, `ipv6:%5B::1%5D:5555` is ::1); any other
    kind of peer (a Unix socket) is itself."""
    principal = current_principal()
    if principal is not None:
        return f"principal {principal}"
    peer = context.peer() or ""
    kind, _, address = urllib.parse.unquote(peer).partition(":")
    if kind in ("ipv4", "ipv6"):
        host = address.rpartition(":")[0].strip("[]")
        if host:
            return host
    return peer


class Tally:
    """How much of one limit each holder (a connection, a client) has taken; taking more
    than the limit is refused. Not thread-safe: callers off the event loop hold a lock."""

    def __init__(
        self, limits: RequestLimits, limit: str, holding: Callable[[str, int], str]
    ) -> None:
        """`holding(holder, amount)` says what `holder` would hold past the limit, for the
        refusal ("client 1.2.3.4 would have 4097 streams open")."""
        self._limits = limits
        self._limit = limit
        self._most: int = getattr(limits, limit)
        self._holding = holding
        self._held: dict[str, int] = {}

    def held(self, holder: str) -> int:
        return self._held.get(holder, 0)

    def take(self, holder: str, amount: int = 1) -> None:
        """Counts `amount` more for `holder`, or raises LimitExceeded and counts nothing."""
        held = self._held.get(holder, 0) + amount
        if held > self._most:
            raise self._limits.exceeded(self._limit, self._holding(holder, held))
        self._held[holder] = held

    def give_back(self, holder: str, amount: int = 1) -> None:
        held = self._held[holder] - amount
        if held:
            self._held[holder] = held
        else:
            del self._held[holder]  # holders come and go: only current ones are kept

    @contextmanager
    def holding(self, holder: str) -> Iterator[None]:
        """One more for `holder` while the block runs."""
        self.take(holder)
        try:
            yield
        finally:
            self.give_back(holder)
