"""The routing hash of a key, which picks its shard: Oxia's XXHASH3 rule.

Oxia's server and its Go and Java clients hash the low 32 bits of XXH3-64 of the
key's UTF-8 bytes (or of the partition key when one is given); shard hash ranges tile
the 32-bit space.
"""

from __future__ import annotations

import xxhash

_HASH_MASK = 0xFFFFFFFF
#: How many hashes there are: the shards' ranges of a namespace tile exactly this many.
HASH_SPACE = _HASH_MASK + 1


def key_hash(key: str) -> int:
    """The 32-bit routing hash of `key`."""
    return xxhash.xxh3_64_intdigest(key.encode()) & _HASH_MASK
