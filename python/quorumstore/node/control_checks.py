"""Checks of what arrives on a node's internal port, before any of it reaches a replica.

The internal port admits only callers with the cluster secret, but a member's message
is still checked: a namespace name becomes a directory name, a shard id one too, a term
is persisted and only ever rises, and a replication factor decides the commit quorum.
A message that fails a check is refused whole (INVALID_ARGUMENT) and changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from quorumstore.proto import replication_pb2 as pb

#: A namespace name: it names a directory under the node's data directory, so no
#: separators, and it never is `.` or `..` (the first character is a letter or digit).
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Shard ids are below this (the coordinator numbers them from 0).
SHARD_LIMIT = 1 << 31
#: Terms are below this: a replica never takes a term it could not rise above again,
#: and the coordinator counts up from 0 one election at a time.
TERM_LIMIT = 1 << 62
#: Ensembles are at most this big.
ENSEMBLE_LIMIT = 64
#: Clusters have at most this many nodes.
NODES_LIMIT = 4096


class InvalidControl(ValueError):
    """A control message that would harm the replica or escape the data directory."""


def check_shard(namespace: str, shard: int) -> None:
    if not NAMESPACE_PATTERN.fullmatch(namespace):
        raise InvalidControl(
            f"namespace {namespace!r} is not a valid name: 1 to 64 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    if not 0 <= shard < SHARD_LIMIT:
        raise InvalidControl(f"shard id {shard} is out of range (0 to {SHARD_LIMIT - 1})")


def check_term(term: int) -> None:
    if not 0 <= term < TERM_LIMIT:
        raise InvalidControl(
            f"term {term} is out of range (0 to {TERM_LIMIT - 1}); a replica fenced at such a "
            "term could never be led again"
        )


def check_address(address: str, what: str) -> None:
    """A node address, host:port."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidControl(f"{what} {address!r} is not a host:port address")


def check_new_term(request: pb.NewTermRequest) -> None:
    check_shard(request.namespace, request.shard)
    check_term(request.term)


def check_become_leader(request: pb.BecomeLeaderRequest, me: str) -> None:
    check_shard(request.namespace, request.shard)
    check_term(request.term)
    followers = list(request.follower_map)
    for follower in followers:
        check_address(follower, "follower")
    if me in request.follower_map:
        raise InvalidControl(f"the follower map names the new leader {me} itself")
    if not 1 <= request.replication_factor <= ENSEMBLE_LIMIT:
        raise InvalidControl(
            f"replication factor {request.replication_factor} is out of range (1 to {ENSEMBLE_LIMIT})"
        )
    if len(followers) >= request.replication_factor:
        raise InvalidControl(
            f"{len(followers)} followers do not fit an ensemble of {request.replication_factor} "
            "with the leader"
        )


def check_add_follower(request: pb.AddFollowerRequest, me: str) -> None:
    check_shard(request.namespace, request.shard)
    check_term(request.term)
    check_address(request.follower_name, "follower")
    if request.follower_name == me:
        raise InvalidControl(f"{me} cannot follow itself")


def check_assignments(update: pb.ShardAssignmentsUpdate) -> None:
    if update.version < 0:
        raise InvalidControl(f"assignments version {update.version} is negative")
    for namespace in update.namespaces:
        check_shard(namespace.namespace, 0)
        for shard in namespace.shards:
            check_shard(namespace.namespace, shard.shard)
            for address in [shard.leader, *shard.followers]:
                if address:
                    check_address(address, "shard member")


def check_internal_addresses(addresses: Mapping[str, str]) -> None:
    if len(addresses) > NODES_LIMIT:
        raise InvalidControl(f"{len(addresses)} internal addresses are more than any cluster has")
    for name, address in addresses.items():
        check_address(name, "node name")
        check_address(address, f"internal address of {name}")
