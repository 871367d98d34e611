"""The storage layer's own key space beside the user keys.

User keys are stored encoded (`quorumstore.wire.keys`), so every one starts with
0x01 or 0x02; the storage layer keeps its bookkeeping (sessions, serials, indexes,
the change log...) under INTERNAL_PREFIX, a key space no user key can reach.
"""

from __future__ import annotations

#: First byte of keys the storage layer reserves for itself.
INTERNAL_PREFIX = b"\x00"
