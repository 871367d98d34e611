"""The bounds of a session's timeout, which a client checks and a server enforces."""

from __future__ import annotations

#: Oxia's bounds for a session timeout (`common/constant`).
MIN_SESSION_TIMEOUT_MS = 2_000
MAX_SESSION_TIMEOUT_MS = 5 * 60_000
