"""Small files replaced whole, durably: a crash leaves the old content or the new, never a mix."""

from __future__ import annotations

import os
from pathlib import Path


def replace_durably(path: Path, data: bytes) -> None:
    """Writes `data` beside `path`, fsyncs it, renames it over `path` and fsyncs the directory
    (without that last fsync the rename itself may be lost in a crash)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
