"""Oxia's own gRPC status codes, which quorumstore sends and its clients read.

grpcio reports a status above 16 as UNKNOWN, so clients tell these apart by the
message's prefix (the second member of each code).
"""

from __future__ import annotations

import enum


class OxiaCode(enum.Enum):
    """Oxia's status codes: (number, message prefix)."""

    NODE_IS_NOT_LEADER = (106, "node is not leader")
    SESSION_NOT_FOUND = (108, "session not found")
    INVALID_SESSION_TIMEOUT = (109, "invalid session timeout")
    NAMESPACE_NOT_FOUND = (110, "namespace not found")

    @property
    def message_prefix(self) -> str:
        """How the details of an error with this code begin: what clients match on."""
        if self is OxiaCode.NODE_IS_NOT_LEADER:
            return self.value[1]
        return f"oxia: {self.value[1]}"


def not_leader_message(shard: int | str, leader_hint: str | None) -> str:
    """The details of a not-leader error: the shard, and its leader when one is known
    (both services send it; clients match its prefix)."""
    message = f"{OxiaCode.NODE_IS_NOT_LEADER.message_prefix} for shard {shard}"
    return f"{message}; leader hint: {leader_hint}" if leader_hint else message
