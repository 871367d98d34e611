"""Exactly-once writes: the latest completed serial of each client, per shard.

The rule is in docs/protocol.md, "Exactly-once serials".

Every exactly-once write carries (client id, serial). The shard records, in its
replicated KV and in the same atomic write as the entry's changes, the latest serial
each client completed and that write's results. A retry of the same serial (after a
leader failover, say) changes nothing and returns the original results; an older
serial changes nothing. The table is bounded by age: a client's record expires
`SERIAL_TTL_MS` after its last write, judged by the entries' own timestamps so every
replica expires the same records at the same offset.
"""

from __future__ import annotations

import struct
from itertools import islice

from quorumstore.storage.keys import INTERNAL_PREFIX
from quorumstore.storage.kv import KvReader

#: How long a client's latest serial is remembered after its last write.
SERIAL_TTL_MS = 60 * 60 * 1000
#: Expired records removed per exactly-once write, so expiry never stalls one apply.
_EXPIRE_PER_WRITE = 64

_SERIAL_PREFIX = INTERNAL_PREFIX + b"serial/"
_BY_TIME_PREFIX = INTERNAL_PREFIX + b"serial-by-time/"
_ENTRY = struct.Struct("<qq")  # serial, timestamp_ms
_TIME = struct.Struct(">q")  # big-endian so byte order is time order


def serial_key(client_id: str) -> bytes:
    return _SERIAL_PREFIX + client_id.encode()


def _by_time_key(timestamp_ms: int, client_id: str) -> bytes:
    return _BY_TIME_PREFIX + _TIME.pack(timestamp_ms) + client_id.encode()


def decode_serial_record(data: bytes) -> tuple[int, int, bytes]:
    """(serial, timestamp_ms, encoded results) of a stored record."""
    serial, timestamp_ms = _ENTRY.unpack_from(data)
    return serial, timestamp_ms, data[_ENTRY.size :]


def serial_changes(
    kv: KvReader,
    client_id: str,
    serial: int,
    timestamp_ms: int,
    results: bytes,
    previous: bytes | None,
) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """Puts and deletes that record `serial` as the client's latest and expire old clients."""
    puts = [
        (serial_key(client_id), _ENTRY.pack(serial, timestamp_ms) + results),
        (_by_time_key(timestamp_ms, client_id), b""),
    ]
    deletes: list[bytes] = []
    if previous is not None:
        _, previous_ts, _ = decode_serial_record(previous)
        if previous_ts != timestamp_ms:
            deletes.append(_by_time_key(previous_ts, client_id))
    horizon = _BY_TIME_PREFIX + _TIME.pack(timestamp_ms - SERIAL_TTL_MS)
    for index_key, _ in islice(kv.scan(_BY_TIME_PREFIX, horizon), _EXPIRE_PER_WRITE):
        expired_client = index_key[len(_BY_TIME_PREFIX) + _TIME.size :]
        if expired_client.decode() != client_id:
            deletes.append(index_key)
            deletes.append(_SERIAL_PREFIX + expired_client)
    return puts, deletes
