"""Checks of what arrives on a node's internal port, before any of it reaches a replica.

The internal port admits only callers with the cluster secret, but a member's message
is still checked: a namespace name becomes a directory name, a shard id one too, a term
is persisted and only ever rises, and a replication factor decides the commit quorum.
A message that fails a check is refused whole (INVALID_ARGUMENT) and changes nothing.
"""

from __future__ import annotations

import re

from quorumstore.proto import replication_pb2 as pb
from quorumstore.protocol.coordinator import ClusterMetadata
from quorumstore.wire.addresses import is_host_port

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
#: A node's member name: its client address (host:port) by default, or a name such as
#: ``node3``; printable, without spaces, of a sane length.
NODE_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\[\]-]{0,254}")


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
    if not is_host_port(address):
        raise InvalidControl(f"{what} {address!r} is not a host:port address")


def check_node_name(name: str, what: str) -> None:
    if not NODE_NAME_PATTERN.fullmatch(name):
        raise InvalidControl(
            f"{what} {name!r} is not a node name: 1 to 256 letters, digits, '.', '_', ':', "
            "'[', ']' or '-', starting with a letter or digit"
        )


def check_new_term(request: pb.NewTermRequest) -> None:
    check_shard(request.namespace, request.shard)
    check_term(request.term)


def check_become_leader(request: pb.BecomeLeaderRequest, me: str) -> None:
    check_shard(request.namespace, request.shard)
    check_term(request.term)
    followers = list(request.follower_map)
    for follower in followers:
        check_node_name(follower, "follower")
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
    check_node_name(request.follower_name, "follower")
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


def check_addresses(ping: pb.HealthPing) -> None:
    """The node addresses a health ping hands out."""
    for kind, addresses in (
        ("internal", ping.internal_addresses),
        ("client", ping.client_addresses),
    ):
        if len(addresses) > NODES_LIMIT:
            raise InvalidControl(f"{len(addresses)} {kind} addresses are more than any cluster has")
        for name, address in addresses.items():
            check_node_name(name, "node name")
            check_address(address, f"{kind} address of {name}")


def check_restore(metadata: ClusterMetadata) -> None:
    """A restore plan's shards (its plans name the same ones), whose names become
    directories, and their ensembles."""
    for key, meta in metadata.shards.items():
        check_shard(*key)
        check_term(meta.term)
        if not 1 <= len(meta.ensemble) <= ENSEMBLE_LIMIT:
            raise InvalidControl(f"shard {key[0]}/{key[1]} has an ensemble of {len(meta.ensemble)}")
        for member in meta.ensemble:
            check_node_name(member, "ensemble member")
