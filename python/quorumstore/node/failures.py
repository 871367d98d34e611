"""What stops a storage node on its own (kept light: the CLI imports it at start-up)."""


class ReplicaFailure(Exception):
    """A shard replica cannot go on: its storage failed (a full disk, an I/O error) or
    applying its log did. Its node must stop; restarted, it recovers the replica from
    what its files hold."""
