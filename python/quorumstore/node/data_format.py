"""The format marker of a node's data directory, checked before anything in it is read.

A node's data directory holds quorumstore's own binary formats: WAL records
(`storage/wal.py`), KV record heads and change-log batches (`storage/state_machine.py`,
`storage/change_log.py`), staged write pieces. A build reading another build's format
would misread it silently: wrong versions, wrong values, a corrupt log taken for a torn
tail. So the directory names its format in `MARKER_FILE`, and a node refuses a
directory in any other format than `DATA_FORMAT` before it opens a shard.

A build that changes any of those formats raises `DATA_FORMAT`. Directories written
before the marker existed (they hold a ``shards`` directory but no marker) are format 1,
and get the marker on their first start.
"""

from __future__ import annotations

import json
from pathlib import Path

from quorumstore import __version__
from quorumstore.storage.durable_files import replace_durably

#: The on-disk format this build reads and writes.
DATA_FORMAT = 1
MARKER_FILE = "quorumstore-format.json"


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
    found = _format_in(text, marker)
    if found != DATA_FORMAT:
        raise DataFormatError(
            f"{data_dir} holds node data in format {found} ({_written_by(text)}), but quorumstore "
            f"{__version__} reads only format {DATA_FORMAT}; run this node with the quorumstore "
            "version that wrote it (nothing in the directory was read or changed)"
        )


def _format_in(text: str, marker: Path) -> int:
    try:
        found = json.loads(text)["format"]
    except (ValueError, KeyError, TypeError):
        found = None
    if not isinstance(found, int) or isinstance(found, bool):
        raise DataFormatError(
            f"{marker} does not name a data format (a quorumstore node data directory holds "
            f'{{"format": {DATA_FORMAT}, ...}} there); if the directory holds quorumstore data '
            "written by this version, restore that content; otherwise give the node another "
            "data directory"
        )
    return found


def _written_by(text: str) -> str:
    written_by = json.loads(text).get("written_by")
    return f"written by {written_by}" if isinstance(written_by, str) else "writer unknown"


def _marker_text() -> str:
    return json.dumps({"format": DATA_FORMAT, "written_by": f"quorumstore {__version__}"}) + "\n"
