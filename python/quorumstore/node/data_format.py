"""A node's data format: its data directory's marker, and the header of what it replicates.

A node's data directory holds quorumstore's own binary formats: WAL records
(`storage/wal.py`), KV record heads and change-log batches (`storage/records.py`,
`storage/change_log.py`), staged write pieces. A build reading another build's format
would misread it silently: wrong versions, wrong values, a corrupt log taken for a torn
tail. So the directory names its format in `MARKER_FILE`, and a node refuses a
directory in any other format than `DATA_FORMAT` before it opens a shard.

A build that changes any of those formats raises `DATA_FORMAT`. Directories written
before the marker existed (they hold a ``shards`` directory but no marker) are format 1,
and get the marker on their first start.

What a leader replicates (WAL entries, snapshots) is in its own format too, so every
replication call names it in the `METADATA_KEY` header, and a node refuses a call in
another format (`peer_format`); a call without the header comes from a build older than
it, which is format 1.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path

import grpc

from quorumstore import __version__
from quorumstore.storage.durable_files import replace_durably

log = logging.getLogger(__name__)

#: The on-disk format this build reads and writes.
DATA_FORMAT = 1
MARKER_FILE = "quorumstore-format.json"
#: The gRPC header in which a replication call names the data format of what it carries.
METADATA_KEY = "qs-data-format"
#: The metadata of this node's replication calls.
REPLICATION_METADATA = ((METADATA_KEY, str(DATA_FORMAT)),)


class DataFormatError(RuntimeError):
    """The data directory is in a format this build does not read, or its marker is damaged."""


def claim(data_dir: Path) -> None:
    """Checks that `data_dir` is in this build's format, marking it so if it is new.

    Raises DataFormatError, which names the directory, both formats and what to do, when
    the marker names another format or cannot be read.
    """
    marker = data_dir / MARKER_FILE
    try:
        text = marker.read_text()
    except FileNotFoundError:
        replace_durably(marker, _marker_text().encode())
        return
    found, writer = _read_marker(text, marker)
    if found != DATA_FORMAT:
        raise DataFormatError(
            f"{data_dir} holds node data in format {found} ({writer}), but quorumstore "
            f"{__version__} reads only format {DATA_FORMAT}; run this node with the quorumstore "
            "version that wrote it (nothing in the directory was read or changed)"
        )


def _read_marker(text: str, marker: Path) -> tuple[int, str]:
    """The format the marker names, and who wrote it (for the error when it is not ours)."""
    try:
        content = json.loads(text)
        found = content["format"]
    except (ValueError, KeyError, TypeError):
        found = None
    if not isinstance(found, int) or isinstance(found, bool):
        raise DataFormatError(
            f"{marker} does not name a data format (a quorumstore node data directory holds "
            f'{{"format": {DATA_FORMAT}, ...}} there); if the directory holds quorumstore data '
            "written by this version, restore that content; otherwise give the node another "
            "data directory"
        )
    writer = content.get("written_by")
    return found, f"written by {writer}" if isinstance(writer, str) else "writer unknown"


def _marker_text() -> str:
    return json.dumps({"format": DATA_FORMAT, "written_by": f"quorumstore {__version__}"}) + "\n"


def peer_format(metadata: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    """The data format a replication call's metadata names: 1 when it names none (a build
    older than the header), None when what it names is unreadable."""
    named = _named_format(metadata)
    if named is None:
        return 1
    return int(named) if named.isdigit() else None


def refusal_message(node: str, theirs: int | None) -> str:
    """Why `node` refuses a replication call in data format `theirs`."""
    shown = "an unreadable one" if theirs is None else str(theirs)
    return (
        f"node {node} reads data format {DATA_FORMAT}, but the call carries format {shown}: "
        "every node of a cluster must run a quorumstore version of one data format"
    )


class RefusalLog:
    """Warns when a follower refuses this node's replication for its data format, at most
    once a minute per follower: the calls are retried every few ticks."""

    INTERVAL_S = 60.0

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def note(self, follower: str, error: grpc.aio.AioRpcError) -> None:
        if error.code() is not grpc.StatusCode.FAILED_PRECONDITION:
            return
        theirs = _named_format(error.trailing_metadata())
        if theirs is None:
            return  # refused for another reason (a snapshot of a stale term, say)
        now = time.monotonic()
        if now - self._last.get(follower, -self.INTERVAL_S) < self.INTERVAL_S:
            return
        self._last[follower] = now
        log.warning(
            "follower %s reads data format %s, and this node replicates format %d: it gets no "
            "entries until it runs a quorumstore version of format %d",
            follower,
            theirs,
            DATA_FORMAT,
            DATA_FORMAT,
        )


def _named_format(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == METADATA_KEY:
            return value.decode() if isinstance(value, bytes) else value
    return None
