"""The flags several commands share: their value types, their groups, and the node
settings and child-process flags built from them. Defined once so that `standalone`,
`cluster` and `node` accept and pass on the same flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from quorumstore.cli.errors import CliError
from quorumstore.coordinator.failure_timeout import (
    DEFAULT_FAILURE_TIMEOUT_MS,
    check_failure_timeout,
)

if TYPE_CHECKING:
    from quorumstore.node.auth.check import AuthConfig
    from quorumstore.node.limits import RequestLimits
    from quorumstore.node.node import NodeConfig
    from quorumstore.node.wal_retention import WalRetention
    from quorumstore.wire.auth import ClusterSecret
    from quorumstore.wire.tls import TlsConfig

DEFAULT_CLIENT_PORT = 6648
#: A `node`'s internal port (node control, replication), as Oxia's.
DEFAULT_INTERNAL_PORT = 6649
#: Where `cluster` keeps the secret it hands to its processes, in its data directory.
CLUSTER_SECRET_FILE = "cluster-secret"


# ------------------------------------------------------------------ value types


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= `minimum`."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {number}")
        return number

    return parse


positive = whole_number(1)
non_negative = whole_number(0)


def positive_float(value: str) -> float:
    """An argparse type: a number of seconds > 0."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return number


def port(value: str) -> int:
    """An argparse type: a TCP port, 0 meaning any free one."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port must be within 0-65535, got {number}")
    return number


def address(value: str) -> str:
    """An argparse type: host:port."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {value!r}")
    return value


def failure_timeout(value: str) -> int:
    """An argparse type: a node failure timeout in milliseconds the coordinator can work with."""
    milliseconds = positive(value)
    try:
        check_failure_timeout(milliseconds)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return milliseconds


# ------------------------------------------------------------------ flag groups


def add_advertise_host_flag(p: argparse.ArgumentParser) -> None:
    """--advertise-host, of the commands that run a node."""
    p.add_argument(
        "--advertise-host",
        help="the name or address clients and other nodes reach this one by (default: --host; "
        "required when --host listens on every interface, e.g. 0.0.0.0)",
    )


def add_storage_flags(p: argparse.ArgumentParser) -> None:
    """WAL retention, KV memory and the relay timeout, of the commands that run nodes."""
    from quorumstore.node.oxia.relay import DEFAULT_RELAY_TIMEOUT_MS
    from quorumstore.node.wal_retention import WalRetention
    from quorumstore.storage.rocks_kv import DEFAULT_KV_MEMORY_BYTES

    defaults = WalRetention()
    p.add_argument(
        "--wal-keep-entries",
        type=non_negative,
        default=defaults.keep_entries,
        help=f"WAL entries kept below the applied offset for lagging followers (default {defaults.keep_entries})",
    )
    p.add_argument(
        "--wal-keep-bytes",
        type=non_negative,
        default=defaults.keep_bytes,
        help=f"at most this many bytes of those entries are kept (default {defaults.keep_bytes})",
    )
    p.add_argument(
        "--wal-trim-interval",
        type=positive_float,
        default=defaults.check_interval_s,
        help=f"seconds between WAL trims (default {defaults.check_interval_s:g})",
    )
    p.add_argument(
        "--wal-segment-bytes",
        type=positive,
        default=defaults.segment_bytes,
        help=f"WAL segment size, the unit of trimming (default {defaults.segment_bytes})",
    )
    p.add_argument(
        "--kv-memory",
        type=positive,
        default=DEFAULT_KV_MEMORY_BYTES,
        help="bytes of block cache and memtables that all of a node's shard stores share "
        f"(default {DEFAULT_KV_MEMORY_BYTES})",
    )
    p.add_argument(
        "--relay-timeout-ms",
        type=positive,
        default=DEFAULT_RELAY_TIMEOUT_MS,
        help="a call a node relays to a shard's leader for a gateway-mode client (the "
        "official Python client) is retried at a new leader, or fails, once the leader has "
        f"not answered for this long (default {DEFAULT_RELAY_TIMEOUT_MS})",
    )


def add_archive_flags(p: argparse.ArgumentParser, *, nodes: bool = True) -> None:
    """--archive-url, and with `nodes` how the nodes archive (docs/archive.md)."""
    from quorumstore.archive.shipper import ArchiveSettings

    p.add_argument(
        "--archive-url",
        help="archive committed entries, snapshots and the coordinator's metadata to this "
        "path or fsspec URL (s3://bucket/prefix needs quorumstore[s3]); a cluster started "
        "on it with no data restores from it (default: no archive)",
    )
    if not nodes:
        return
    defaults = ArchiveSettings()
    p.add_argument(
        "--archive-sync",
        action="store_true",
        help="answer a write only once its entry is archived (slower; no acknowledged "
        "write is missing from the archive)",
    )
    p.add_argument(
        "--archive-snapshot-entries",
        type=positive,
        default=defaults.snapshot_entries,
        help=f"entries archived between two KV snapshots (default {defaults.snapshot_entries})",
    )
    p.add_argument(
        "--archive-keep-snapshots",
        type=positive,
        default=defaults.keep_snapshots,
        help="snapshots kept in the archive, with the entries after the oldest "
        f"(default {defaults.keep_snapshots})",
    )


def archive_flags(args: argparse.Namespace, *, nodes: bool = True) -> list[str]:
    """The archive flags of `cluster`, passed on to its nodes (`nodes`) or coordinator."""
    if args.archive_url is None:
        return []
    flags = ["--archive-url", args.archive_url]
    if nodes:
        flags += ["--archive-snapshot-entries", str(args.archive_snapshot_entries)]
        flags += ["--archive-keep-snapshots", str(args.archive_keep_snapshots)]
        flags += ["--archive-sync"] if args.archive_sync else []
    return flags


def add_failure_timeout_flag(p: argparse.ArgumentParser) -> None:
    """--failure-timeout-ms, of the commands that run a coordinator."""
    p.add_argument(
        "--failure-timeout-ms",
        type=failure_timeout,
        default=DEFAULT_FAILURE_TIMEOUT_MS,
        help="a node silent this long is taken for failed and its shards get new leaders: "
        "raise it to ride out stalls, lower it to fail over sooner "
        f"(default {DEFAULT_FAILURE_TIMEOUT_MS})",
    )


def add_secret_file_flag(p: argparse.ArgumentParser) -> None:
    """--cluster-secret-file, of `node` and `coordinator`."""
    p.add_argument(
        "--cluster-secret-file",
        type=Path,
        help="file holding the cluster's secret (64 hex digits, readable by its owner only), "
        "which every internal call must carry; required unless every address is loopback. "
        "Make one with: python -c 'import secrets; print(secrets.token_hex(32))' > FILE; "
        "chmod 600 FILE",
    )


# ------------------------------------------------------------------ resource limits


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    """The --max-* flags of the client port's limits, of the commands that run nodes."""
    from quorumstore.node.limits import RequestLimits, limit_settings

    defaults = RequestLimits()
    group = p.add_argument_group(
        "resource limits of each node's client port (docs/limits.md); a call past one "
        "fails with RESOURCE_EXHAUSTED"
    )
    for name, setting in limit_settings().items():
        default = getattr(defaults, name)
        group.add_argument(
            setting.flag,
            dest=name,
            type=positive,
            default=default,
            metavar="BYTES" if setting.in_bytes else "N",
            help=f"{setting.help} (default {default})",
        )


def request_limits(args: argparse.Namespace) -> RequestLimits:
    """The limits of the --max-* flags."""
    from quorumstore.node.limits import RequestLimits, limit_settings

    try:
        return RequestLimits(**{name: getattr(args, name) for name in limit_settings()})
    except ValueError as e:
        raise CliError(str(e)) from None


def limit_flags(args: argparse.Namespace) -> list[str]:
    """The --max-* flags of `cluster`, passed on to its nodes."""
    from quorumstore.node.limits import limit_settings

    return [
        part
        for name, setting in limit_settings().items()
        for part in (setting.flag, str(getattr(args, name)))
    ]


def add_tls_flags(p: argparse.ArgumentParser, *, internal: bool) -> None:
    """The TLS flags: of the public port (client port, status port), and with `internal`
    of the internal plane (mutual TLS)."""
    planes = [("tls", "the client port (or status port)")]
    if internal:
        planes.append(
            ("internal-tls", "the internal port and calls to other members' (mutual TLS)")
        )
    for prefix, what in planes:
        p.add_argument(f"--{prefix}-cert-file", type=Path, help=f"PEM certificate chain of {what}")
        p.add_argument(f"--{prefix}-key-file", type=Path, help=f"PEM private key of {what}")
        p.add_argument(
            f"--{prefix}-trusted-ca-file",
            type=Path,
            help=f"PEM CA certificates that peers of {what} are checked against",
        )


def add_auth_flag(p: argparse.ArgumentParser) -> None:
    """--auth-config, of the commands that run a node."""
    p.add_argument(
        "--auth-config",
        type=Path,
        help="JSON file of bearer tokens (static ones, an OIDC issuer) and per-namespace "
        "grants; with it, every client call must carry a valid token (docs/security.md)",
    )


# ------------------------------------------------------------------ what the flags configure


def cluster_secret(args: argparse.Namespace) -> ClusterSecret | None:
    """The secret of --cluster-secret-file, if given."""
    from quorumstore.wire.auth import ClusterSecret, SecretError

    if args.cluster_secret_file is None:
        return None
    try:
        return ClusterSecret.from_file(args.cluster_secret_file.resolve())
    except SecretError as e:
        raise CliError(str(e)) from None


def tls_config(args: argparse.Namespace, prefix: str = "tls") -> TlsConfig | None:
    """The TLS of `--{prefix}-*` flags, if any is given."""
    from quorumstore.wire.tls import TlsConfig, TlsError

    attribute = prefix.replace("-", "_")
    files = [
        getattr(args, f"{attribute}_{part}_file", None) for part in ("cert", "key", "trusted_ca")
    ]
    if not any(files):
        return None
    try:
        return TlsConfig.from_files(*(None if f is None else f.resolve() for f in files))
    except TlsError as e:
        raise CliError(f"--{prefix}-*: {e}") from None


def auth_config(args: argparse.Namespace) -> AuthConfig | None:
    from quorumstore.node.auth.check import AuthConfig, AuthConfigError

    if args.auth_config is None:
        return None
    try:
        return AuthConfig.from_file(args.auth_config.resolve())
    except AuthConfigError as e:
        raise CliError(str(e)) from None


def security_flags(args: argparse.Namespace, *, with_auth: bool) -> list[str]:
    """The TLS flags given to `cluster` (and with `with_auth`, its auth config), passed
    on to its processes."""
    names = [
        f"{prefix}_{part}_file"
        for prefix in ("tls", "internal_tls")
        for part in ("cert", "key", "trusted_ca")
    ] + (["auth_config"] if with_auth else [])
    flags = []
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value.resolve())]
    return flags


def storage_flags(args: argparse.Namespace) -> list[str]:
    """The storage flags of `cluster` (WAL retention, KV memory, relay timeout), passed on
    to its nodes."""
    return [
        "--wal-keep-entries",
        str(args.wal_keep_entries),
        "--wal-keep-bytes",
        str(args.wal_keep_bytes),
        "--wal-trim-interval",
        str(args.wal_trim_interval),
        "--wal-segment-bytes",
        str(args.wal_segment_bytes),
        "--kv-memory",
        str(args.kv_memory),
        "--relay-timeout-ms",
        str(args.relay_timeout_ms),
    ]


def node_config(
    args: argparse.Namespace, data_dir: Path, secret: ClusterSecret | None
) -> NodeConfig:
    """The node of `standalone` or `node`, from their shared flags."""
    from quorumstore.archive.shipper import ArchiveSettings
    from quorumstore.node.node import NodeConfig

    return NodeConfig(
        data_dir,
        host=args.host,
        port=args.port,
        internal_port=args.internal_port,
        cluster_secret=secret,
        internal_tls=tls_config(args, "internal-tls"),
        tls=tls_config(args),
        auth=auth_config(args),
        advertise_host=_advertise_host(args),
        wal_sync=not args.no_fsync,
        wal_retention=_retention(args),
        kv_memory_bytes=args.kv_memory,
        relay_timeout_ms=args.relay_timeout_ms,
        limits=request_limits(args),
        archive_url=args.archive_url,
        archive=ArchiveSettings(
            sync=args.archive_sync,
            snapshot_entries=args.archive_snapshot_entries,
            keep_snapshots=args.archive_keep_snapshots,
        ),
    )


def _advertise_host(args: argparse.Namespace) -> str | None:
    """The host in the node's address, which other nodes and clients dial."""
    if args.advertise_host:
        return str(args.advertise_host)
    if args.host in ("0.0.0.0", "::", ""):
        raise CliError(
            f"--host {args.host!r} listens on every interface, so it is no address to "
            "dial; add --advertise-host with the name or address other machines reach this one by"
        )
    return None


def _retention(args: argparse.Namespace) -> WalRetention:
    from quorumstore.node.wal_retention import WalRetention

    return WalRetention(
        keep_entries=args.wal_keep_entries,
        keep_bytes=args.wal_keep_bytes,
        check_interval_s=args.wal_trim_interval,
        segment_bytes=args.wal_segment_bytes,
    )


def check_layout(data_dir: Path, mine: str, other: str, other_command: str) -> None:
    """`standalone` keeps its node in D/node, `cluster` in D/node0, D/node1, ...: started on
    the other's directory, a command would find its node's directory empty and serve an
    empty store next to the data it was meant to serve."""
    if (data_dir / other).is_dir() and not (data_dir / mine).exists():
        raise CliError(
            f"{data_dir} holds the data of `quorumstore {other_command}` ({data_dir / other}); "
            f"start it with `quorumstore {other_command}`, or give another --data-dir"
        )
