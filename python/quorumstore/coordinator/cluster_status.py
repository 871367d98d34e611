"""Reading the coordinator's `ClusterStatus`: whether every replica serves, and the table
that `quorumstore status`, `quorumstore cluster` and the Spark-hosted cluster's
``status()`` print. A module of its own, beside the coordinator rather than in the
command line, because the Spark hosting reads the same message and the command line is
the top layer that nothing imports."""

from __future__ import annotations

from quorumstore.proto import replication_pb2 as pb


def all_replicas_serving(status: pb.ClusterStatus) -> bool:
    """Every shard has a leader and every replica follows it in the leader's term.

    ONLINE alone is not enough to hand out the client address: a replica still fenced
    in the new term does not know the leader yet, so its node answers clients (or relays
    for them) with "not leader" until the leader's first Append reaches it.
    """
    shards = {(m.namespace, m.shard): m for m in status.metadata.shards}
    if not shards or any(m.status != pb.ONLINE for m in shards.values()):
        return False
    serving = {
        (r.namespace, r.shard, r.node)
        for r in status.replicas
        if r.role in (pb.LEADER, pb.FOLLOWER)
        and (r.namespace, r.shard) in shards
        and r.term == shards[(r.namespace, r.shard)].term
    }
    return all(
        (m.namespace, m.shard, node) in serving for m in shards.values() for node in m.ensemble
    )


def archive_behind(status: pb.ClusterStatus) -> dict[str, int]:
    """Shard name -> committed entries its archive lacks, per its current leader's report
    (-1: no report of the archive yet); a shard whose archive is complete is left out."""
    leaders = {
        (r.namespace, r.shard, r.node, r.term): r for r in status.replicas if r.role == pb.LEADER
    }
    behind = {}
    for m in status.metadata.shards:
        report = leaders.get((m.namespace, m.shard, m.leader, m.term))
        if report is None or not report.HasField("archive"):
            behind[f"{m.namespace}/{m.shard}"] = -1
        elif report.archive.archived_offset < report.commit_offset:
            behind[f"{m.namespace}/{m.shard}"] = (
                report.commit_offset - report.archive.archived_offset
            )
    return behind


def format_status(status: pb.ClusterStatus) -> str:
    """One row per shard (state, term, leader, offsets, follower lag, eligible set, and
    with an archive how far it is behind), then the nodes the coordinator cannot reach."""
    state_names = {pb.ELECTION: "election", pb.ONLINE: "online", pb.OFFLINE: "OFFLINE"}
    # Keyed by node too: a leader that went down leaves its last report behind, and the
    # shard's current leader must not be hidden behind it.
    leaders = {
        (r.namespace, r.shard, r.node, r.term): r for r in status.replicas if r.role == pb.LEADER
    }
    alive = status.nodes_alive
    archived = any(r.HasField("archive") for r in leaders.values())
    header = ("shard", "state", "term", "leader", "head", "commit", "followers (lag)", "eligible")
    rows: list[tuple[str, ...]] = [header + (("archive lag",) if archived else ())]
    for m in status.metadata.shards:
        report = leaders.get((m.namespace, m.shard, m.leader, m.term))
        if report is not None:
            head, commit = str(report.head.offset), str(report.commit_offset)
            # A follower that is down keeps its last acked offset: say so beside its lag.
            followers = (
                ", ".join(
                    f"{f.name} ({max(0, report.commit_offset - f.acked_offset)}"
                    f"{'' if alive.get(f.name, True) else ', down'})"
                    for f in report.followers
                )
                or "-"
            )
        else:
            head, commit, followers = "?", "?", "-"
        row: tuple[str, ...] = (
            f"{m.namespace}/{m.shard}",
            state_names[m.status],
            str(m.term),
            m.leader or "-",
            head,
            commit,
            followers,
            ", ".join(m.eligible) or "-",
        )
        if archived:
            row += (_archive_lag(report),)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    addresses = status.node_addresses
    named = sorted(n for n in alive if addresses.get(n, n) != n)
    if named:
        lines.append(
            "nodes: "
            + ", ".join(
                f"{n} at {addresses[n]}" if n in addresses else f"{n} (not registered)"
                for n in named
            )
        )
    down = [n for n, up in sorted(alive.items()) if not up]
    if down:
        lines.append(f"unreachable nodes: {', '.join(down)}")
    return "\n".join(lines)


def _archive_lag(leader: pb.ShardStatus | None) -> str:
    """Entries and seconds the shard's archive is behind its commit offset, and why, if
    its last upload failed."""
    if leader is None or not leader.HasField("archive"):
        return "?"
    lag = leader.archive
    text = f"{lag.lag_entries} entries, {lag.lag_seconds:.1f} s"
    return f"{text} (failing: {lag.error})" if lag.error else text
