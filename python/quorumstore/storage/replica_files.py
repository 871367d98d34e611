"""Where a node keeps a shard replica, and the replica's small files: one place that the
node and the archive's restore (which writes replica directories) both follow."""

from __future__ import annotations

import uuid
from pathlib import Path

from quorumstore.protocol.messages import ShardKey
from quorumstore.storage.durable_files import replace_durably

#: The file in a replica's directory that holds its incarnation (see `load_incarnation`).
INCARNATION_FILE = "incarnation"
#: The file that holds the replica's current term.
TERM_FILE = "term"


def replica_dir(node_dir: Path, shard: ShardKey) -> Path:
    return node_dir / "shards" / shard[0] / str(shard[1])


def load_incarnation(directory: Path) -> str:
    """The identity of the replica's data in `directory`, made the first time the replica
    opens it: a replica whose directory was lost (a disk replaced, a node moved to another
    host) reports another one, which tells the coordinator that the data it counted on
    is gone (docs/protocol.md, "Replicas that lose their disk"). A directory made before
    incarnations existed gets one here and is taken as the data it always held."""
    path = directory / INCARNATION_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return new_incarnation(directory)


def new_incarnation(directory: Path) -> str:
    """Gives the replica data in `directory` a new identity, durably."""
    incarnation = uuid.uuid4().hex
    replace_durably(directory / INCARNATION_FILE, incarnation.encode())
    return incarnation


def save_term(directory: Path, term: int) -> None:
    replace_durably(directory / TERM_FILE, str(term).encode())
