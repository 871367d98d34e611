"""What an authenticated caller may do: read or write, per namespace.

The token check (`check.py`) names the caller of each call and what the call does
(`METHOD_ACCESS`: reading or writing) and keeps both in a context variable for the
call's task; routing then asks `authorize(namespace)` once it knows which namespace the
call touches. Without authentication configured there is no caller and everything is
allowed: the client port is then as open as its network.
"""

from __future__ import annotations

import contextvars
import enum
from collections.abc import Mapping
from dataclasses import dataclass

#: Any principal, or any namespace, in a grant.
ANY = "*"


class Access(enum.IntEnum):
    """What a call does; a grant of WRITE includes READ."""

    READ = 1
    WRITE = 2


#: The access of every method of the client port. A method missing here needs WRITE.
METHOD_ACCESS: Mapping[str, Access] = {
    f"/io.streamnative.oxia.proto.OxiaClient/{name}": Access.READ
    for name in (
        "GetShardAssignments",
        "Read",
        "List",
        "RangeScan",
        "GetSequenceUpdates",
        "GetNotifications",
    )
} | {
    f"/quorumstore.data.v1.QuorumstoreData/{name}": Access.READ
    for name in ("ListShards", "SplitRanges", "ScanArrow", "GetOffsets", "ReadChanges")
}


class AccessDenied(Exception):
    """The caller may not do this to this namespace (PERMISSION_DENIED)."""


@dataclass(frozen=True)
class Grants:
    """principal -> namespace -> access; `ANY` stands for every principal or namespace.
    None: every authenticated caller may read and write every namespace."""

    table: Mapping[str, Mapping[str, Access]] | None = None

    def allows(self, principal: str, namespace: str, access: Access) -> bool:
        if self.table is None:
            return True
        granted = 0
        for who in (principal, ANY):
            namespaces = self.table.get(who, {})
            granted = max(granted, namespaces.get(namespace, 0), namespaces.get(ANY, 0))
        return granted >= access

    @classmethod
    def parse(cls, raw: object) -> Grants:
        """From the `grants` object of an auth config: {"alice": {"default": "write"}}."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise TypeError('"grants" must map principals to {namespace: "read" | "write"}')
        table: dict[str, dict[str, Access]] = {}
        for principal, namespaces in raw.items():
            if not isinstance(namespaces, dict):
                raise TypeError(
                    f'the grants of {principal!r} must map namespaces to "read" or "write"'
                )
            table[principal] = {}
            for namespace, access in namespaces.items():
                try:
                    table[principal][namespace] = Access[str(access).upper()]
                except KeyError:
                    raise ValueError(
                        f'the grant of {principal!r} on {namespace!r} is {access!r}; it must be "read" or "write"'
                    ) from None
        return cls(table)


@dataclass(frozen=True)
class Caller:
    """The authenticated caller of the current call, what the call does, and the
    credentials it came with (carried on when a node relays the call)."""

    principal: str
    access: Access
    grants: Grants
    credentials: tuple[tuple[str, str], ...]


_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "quorumstore_caller", default=None
)


def set_caller(caller: Caller) -> None:
    _caller.set(caller)


def authorize(namespace: str) -> None:
    """Raises AccessDenied unless the current call's caller may do what it does to
    `namespace`."""
    caller = _caller.get()
    if caller is None or caller.grants.allows(caller.principal, namespace, caller.access):
        return
    verb = "write to" if caller.access is Access.WRITE else "read"
    raise AccessDenied(
        f"{caller.principal!r} may not {verb} namespace {namespace!r} (see the grants of the auth config)"
    )


def current_principal() -> str | None:
    """The current call's authenticated principal; None without authentication."""
    caller = _caller.get()
    return None if caller is None else caller.principal


def relayed_credentials() -> tuple[tuple[str, str], ...]:
    """The current call's credentials, for a call relayed on its behalf."""
    caller = _caller.get()
    return () if caller is None else caller.credentials
