"""The WAL's bytes on disk: segment files of records, and the ``base`` file.

A WAL directory holds segment files and, once a prefix was dropped, a ``base`` file.

Segment ``<first offset, 20 digits>.wal`` (e.g. ``00000000000000000042.wal``) holds the
records of consecutive offsets starting at its name. Segments are contiguous: the first
starts at ``base.offset + 1`` and each following one right after the last offset of the
one before it. Each record is a fixed 36-byte little-endian header followed by the
payload (opaque here: the Arrow IPC bytes of one record batch, built by the caller)::

    magic     u32   RECORD_MAGIC (the bytes b"QWAL")
    length    u32   payload bytes
    term      i64
    offset    i64
    checksum  u64   chain checksum (`protocol.types.chain_checksum`)
    crc       u32   zlib CRC-32 of the 32 header bytes before it, then of the payload

A new segment is started once the active one holds `segment_bytes` or more (always
after a whole record).

``base`` (36 bytes, little-endian: magic u32 = b"BASE", flags u32, term i64, offset i64,
checksum u64, crc u32 of the 32 bytes before it) is the position just before the first
entry; no file means `EMPTY_POSITION`. It is replaced atomically: write ``base.tmp``,
fsync it, rename it over ``base``, fsync the directory. Flag 1 (resetting) marks a
`reset` whose segment deletions may not have reached the disk.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

from quorumstore.protocol.types import EMPTY_POSITION, LogEntry, LogPosition

#: Record header: magic, payload length, term, offset, chain checksum, crc.
RECORD_HEADER = struct.Struct("<IIqqQI")
RECORD_MAGIC = int.from_bytes(b"QWAL", "little")
_HEADER_FIELDS = struct.Struct("<IIqqQ")  # the header bytes the crc covers
_CRC = struct.Struct("<I")
_MAGIC_BYTES = _CRC.pack(RECORD_MAGIC)
MAX_PAYLOAD = 2**32 - 1

_BASE_RECORD = struct.Struct("<IIqqQI")
_BASE_FIELDS = struct.Struct("<IIqqQ")
_BASE_MAGIC = int.from_bytes(b"BASE", "little")
#: Base flag: a `reset` whose segment deletions may not have reached the disk.
BASE_RESETTING = 1
_BASE_FILE = "base"
BASE_TMP = "base.tmp"

_SEGMENT_NAME = re.compile(r"^(\d{20})\.wal$")


class WalError(Exception):
    """The WAL cannot do what was asked; the message says what failed and what to do."""


class Unreadable(Exception):
    """A record that cannot be decoded (the reason is the message)."""


class Record(NamedTuple):
    """A decoded record: its entry's position and where its payload lies in the bytes read."""

    term: int
    offset: int
    checksum: int
    payload_start: int
    end: int


def decode_record(data: bytes, pos: int) -> Record:
    """The record at byte `pos` of `data`, CRC-checked; raises `Unreadable` if it is not whole."""
    if len(data) - pos < RECORD_HEADER.size:
        raise Unreadable("short header")
    magic, length, term, offset, checksum, crc = RECORD_HEADER.unpack_from(data, pos)
    if magic != RECORD_MAGIC:
        raise Unreadable("bad magic")
    start = pos + RECORD_HEADER.size
    end = start + length
    if end > len(data):
        raise Unreadable("short payload")
    view = memoryview(data)
    if zlib.crc32(view[start:end], zlib.crc32(view[pos : pos + _HEADER_FIELDS.size])) != crc:
        raise Unreadable("bad crc")
    return Record(term, offset, checksum, start, end)


def encode_header(entry: LogEntry) -> bytes:
    fields = _HEADER_FIELDS.pack(
        RECORD_MAGIC, len(entry.payload), entry.term, entry.offset, entry.checksum
    )
    return fields + _CRC.pack(zlib.crc32(entry.payload, zlib.crc32(fields)))


def any_record_after(data: bytes, pos: int) -> bool:
    """Whether a valid record starts anywhere after `pos`: tells a torn tail from damage."""
    candidate = data.find(_MAGIC_BYTES, pos + 1)
    while candidate != -1:
        try:
            decode_record(data, candidate)
            return True
        except Unreadable:
            candidate = data.find(_MAGIC_BYTES, candidate + 1)
    return False


def corrupt(path: Path, pos: int, problem: str) -> WalError:
    return WalError(
        f"{path}: corrupt at byte {pos} ({problem}); the log is damaged, not just torn: "
        f"restore this replica from a snapshot or its peers"
    )


def segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}.wal"


def segment_files(directory: Path) -> list[tuple[int, Path]]:
    """(first offset, path) of every segment file in `directory`, in log order."""
    files = []
    for name in os.listdir(directory):
        match = _SEGMENT_NAME.match(name)
        if match:
            files.append((int(match.group(1)), directory / name))
    return sorted(files)


def write_all(fd: int, data: bytes) -> None:
    """One os.write in practice; loops only if the kernel accepts part of the buffer."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_base(directory: Path) -> tuple[LogPosition, int]:
    """The base position in `directory` and its flags (EMPTY_POSITION without a file)."""
    path = directory / _BASE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return EMPTY_POSITION, 0
    if len(data) != _BASE_RECORD.size:
        raise corrupt(path, 0, f"base file is {len(data)} bytes, expected {_BASE_RECORD.size}")
    magic, flags, term, offset, checksum, crc = _BASE_RECORD.unpack(data)
    if magic != _BASE_MAGIC or zlib.crc32(data[: _BASE_FIELDS.size]) != crc:
        raise corrupt(path, 0, "bad magic or crc in the base file")
    return LogPosition(term, offset, checksum), flags


def write_base_file(directory: Path, base: LogPosition, flags: int, sync: bool) -> None:
    """Write ``base.tmp`` (fsync'ed when `sync`) and rename it over ``base``; the caller
    fsyncs the directory."""
    fields = _BASE_FIELDS.pack(_BASE_MAGIC, flags, base.term, base.offset, base.checksum)
    tmp = directory / BASE_TMP
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, fields + _CRC.pack(zlib.crc32(fields)))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / _BASE_FILE)
