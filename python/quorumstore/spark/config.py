"""Settings of a Spark-hosted cluster: `start()` arguments over `spark.quorumstore.*` over defaults.

One resolver serves both entry points, the PySpark call (`quorumstore.spark.start`) and
the spark-submit application (`coordinator_driver/app.py`, which lays the session's
settings over `conf/quorumstore.conf`), so they agree on names, defaults and validation. Values arrive as strings, as Spark settings do, and are checked
before anything starts: a bad value fails with the key's name, not deep in a task.

Keys (all under ``spark.quorumstore.``): ``nodes``, ``shards``, ``replicationFactor``,
``placement`` (``barrier`` or ``independent``), ``host`` and ``basePort`` (fixed addresses;
unset, each node binds its executor's host on free ports), ``dataDir`` (a path on every
host; unset, the executors' local directories), ``clusterName``, ``metadataUrl``, ``walSync``, ``kvMemory`` (``512m``), ``startTimeout`` (seconds; ``120``
or ``120s``), ``failureTimeout`` (``500ms``; how long a silent node is taken to be alive),
``relayTimeout`` (``1500ms``; how long a node relaying a gateway-mode client's call waits
for the shard's leader before it retries at a new one or fails),
``archiveUrl`` (a path or fsspec URL the nodes archive the committed state to, and the
coordinator its metadata; a cluster started with no metadata restores from it),
``archiveSync`` (``false``; answer a write only once it is archived),
``archiveSnapshotEntries`` and ``archiveKeepSnapshots`` (docs/archive.md),
``logLevel`` (of the storage nodes, in the executors' stderr), ``tls.certFile``,
``tls.keyFile`` and ``tls.trustedCaFile`` (PEM files read on the driver: the nodes'
client ports serve TLS with them), ``auth.config`` (a JSON auth config read on the
driver: every client call must carry a token; docs/security.md).

The resource limits of each node's client port have keys of their own (docs/limits.md):
``maxOpsPerRequest``, ``maxRequestBytes`` (``64m``), ``maxCallsPerConnection``,
``maxSessionsPerClient``, ``maxStreamsPerClient``, ``maxStagedBytesPerClient`` and
``maxStagedBytesTotal`` (``16g``).

>>> config = HostingConfig.resolve({"spark.quorumstore.nodes": "5"}, shards=4)
>>> (config.nodes, config.shards, config.node_names[:2])
(5, 4, ['node0', 'node1'])
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorumstore.archive.shipper import ArchiveSettings
from quorumstore.coordinator.failure_timeout import check_failure_timeout
from quorumstore.node.auth.check import AuthConfig, read_auth_file
from quorumstore.node.limits import RequestLimits, limit_settings
from quorumstore.node.oxia.relay import DEFAULT_RELAY_TIMEOUT_MS
from quorumstore.storage.rocks_kv import DEFAULT_KV_MEMORY_BYTES
from quorumstore.wire.tls import TlsConfig

PREFIX = "spark.quorumstore."
#: A cluster name: it names a directory on every host.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PLACEMENTS = ("barrier", "independent")
#: The bearer token that clients of the session present (Spark redacts `token` confs in
#: its UI and logs).
TOKEN_CONF = PREFIX + "auth.token"


def _seconds(value: str) -> float:
    """A duration as Spark writes them: seconds, with or without ``s``, or ``ms``."""
    text = value.strip().lower()
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    return float(text.removesuffix("s"))


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _bytes(value: str) -> int:
    """A size as Spark writes them: bytes, or a whole number with k, m or g (``512m``)."""
    text = value.strip().lower().removesuffix("b")
    number, unit = (text[:-1], text[-1]) if text[-1:] in _SIZE_UNITS else (text, "")
    if not number.isdigit():
        raise ValueError(value)
    return int(number) * _SIZE_UNITS[unit]


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(value)
    return lowered == "true"


#: field name -> (key after PREFIX, parser of the string form).
_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "nodes": ("nodes", int),
    "shards": ("shards", int),
    "replication_factor": ("replicationFactor", int),
    "placement": ("placement", str.strip),
    "host": ("host", str.strip),
    "base_port": ("basePort", int),
    "data_dir": ("dataDir", Path),
    "cluster_name": ("clusterName", str.strip),
    "metadata_url": ("metadataUrl", str.strip),
    "wal_sync": ("walSync", _boolean),
    "kv_memory_bytes": ("kvMemory", _bytes),
    "start_timeout_s": ("startTimeout", _seconds),
    "failure_timeout_s": ("failureTimeout", _seconds),
    "relay_timeout_s": ("relayTimeout", _seconds),
    "archive_url": ("archiveUrl", str.strip),
    "archive_sync": ("archiveSync", _boolean),
    "archive_snapshot_entries": ("archiveSnapshotEntries", int),
    "archive_keep_snapshots": ("archiveKeepSnapshots", int),
    "log_level": ("logLevel", str.strip),
    "tls_cert_file": ("tls.certFile", Path),
    "tls_key_file": ("tls.keyFile", Path),
    "tls_trusted_ca_file": ("tls.trustedCaFile", Path),
    "auth_config": ("auth.config", Path),
}
_PATHS = ("tls_cert_file", "tls_key_file", "tls_trusted_ca_file", "auth_config")


@dataclass(frozen=True)
class HostingConfig:
    """Where and how the storage nodes and the coordinator of one hosted cluster run.

    Node ``i`` is the member ``node<i>`` wherever it runs: it binds the address of its
    executor's host that routes to the driver (or `host`), on free ports (or, with
    `base_port`, client port ``base_port + i`` and internal port
    ``base_port + nodes + 1 + i``), and registers its addresses with the coordinator,
    which serves status on ``base_port + nodes`` and registrations on
    ``base_port + 2 * nodes + 1`` (free ports without `base_port`). It keeps its data in
    ``node<i>`` under `data_dir` on its host, by default under the executors' local
    directories (``<local dir>/quorumstore/<cluster_name>``); on local masters, whose
    executors share the driver's machine, under ``./quorumstore-data``.
    """

    nodes: int = 3
    shards: int = 8
    replication_factor: int = 3
    placement: str = "barrier"
    #: Every node's and the coordinator's address; None: each node its executor's host,
    #: the coordinator the driver's (127.0.0.1 on local masters).
    host: str | None = None
    #: First of the fixed ports; None: free ports.
    base_port: int | None = None
    #: Where each host keeps its nodes' data; None: see the class docstring.
    data_dir: Path | None = None
    #: Names the cluster's data under the executors' local directories, so that an
    #: application started again finds it.
    cluster_name: str = "default"
    #: Path or fsspec URL of the coordinator's metadata; "" means data_dir/coordinator/metadata.pb.
    metadata_url: str = ""
    wal_sync: bool = True
    #: What each node's RocksDB stores share: block cache and memtables.
    kv_memory_bytes: int = DEFAULT_KV_MEMORY_BYTES
    start_timeout_s: float = 120.0
    #: How long a node may send the coordinator no health report before it is taken for
    #: failed and its shards get new leaders.
    failure_timeout_s: float = 0.5
    #: How long a node relaying a gateway-mode client's call waits for the shard's leader
    #: (`NodeConfig.relay_timeout_ms`).
    relay_timeout_s: float = DEFAULT_RELAY_TIMEOUT_MS / 1000
    #: Where the nodes archive committed entries and snapshots and the coordinator its
    #: metadata (docs/archive.md); None: no archive.
    archive_url: str | None = None
    #: A write is answered only once its entry is archived.
    archive_sync: bool = False
    archive_snapshot_entries: int = ArchiveSettings.snapshot_entries
    archive_keep_snapshots: int = ArchiveSettings.keep_snapshots
    log_level: str = "WARNING"
    #: The resource limits of each node's client port (`NodeConfig.limits`), set by
    #: keys of their own (`_request_limits`).
    limits: RequestLimits = dataclasses.field(default_factory=RequestLimits)
    #: PEM files of the nodes' client-port TLS (None: plaintext), read on the driver.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_trusted_ca_file: Path | None = None
    #: JSON auth config (tokens, grants) of the nodes' client ports, read on the driver.
    auth_config: Path | None = None

    @classmethod
    def resolve(cls, conf: Mapping[str, str], **overrides: Any) -> HostingConfig:
        """Defaults, then ``spark.quorumstore.*`` entries of `conf`, then non-None `overrides`.

        `overrides` use the field names (``replication_factor=3``); the data directory is
        made absolute here, on the driver, because executors run in other directories.
        """
        unknown = set(overrides) - set(_KEYS)
        if unknown:
            raise TypeError(f"unknown quorumstore hosting option(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for name, (key, parse) in _KEYS.items():
            if overrides.get(name) is not None:
                values[name] = _checked_override(name, overrides[name])
            elif PREFIX + key in conf:
                raw = conf[PREFIX + key]
                try:
                    values[name] = parse(raw)
                except ValueError:
                    raise ValueError(
                        f"{PREFIX}{key}: cannot read {raw!r} as {_describe(name)}"
                    ) from None
        values["limits"] = _request_limits(conf)
        config = dataclasses.replace(cls(), **values)
        if config.data_dir is None and local_master(conf.get("spark.master", "local")):
            config = dataclasses.replace(config, data_dir=Path("quorumstore-data"))
        absolute: dict[str, Any] = {
            name: Path(os.path.abspath(Path(getattr(config, name)).expanduser()))
            for name in ("data_dir", *_PATHS)
            if getattr(config, name) is not None
        }
        if config.archive_url:
            # A local archive path is made absolute here too; a URL is left as given.
            url = os.fspath(config.archive_url)
            absolute["archive_url"] = (
                url if "://" in url else os.path.abspath(Path(url).expanduser())
            )
        config = dataclasses.replace(config, **absolute)
        if not config.metadata_url:
            # On the driver: beside the nodes' data on local masters, else in its own
            # directory (the coordinator rebuilds it from the replicas if it is lost).
            metadata = (
                Path(os.path.abspath("quorumstore-data")) / "coordinator" / config.cluster_name
                if config.data_dir is None
                else config.data_dir / "coordinator"
            ) / "metadata.pb"
            config = dataclasses.replace(config, metadata_url=str(metadata))
        config.validate()
        return config

    def validate(self) -> None:
        """Raises ValueError naming the setting that cannot work."""
        problems = []
        if self.nodes < 1:
            problems.append(f"{PREFIX}nodes must be at least 1, got {self.nodes}")
        if self.shards < 1:
            problems.append(f"{PREFIX}shards must be at least 1, got {self.shards}")
        if not 1 <= self.replication_factor <= self.nodes:
            problems.append(
                f"{PREFIX}replicationFactor must be between 1 and the number of nodes "
                f"({self.nodes}), got {self.replication_factor}"
            )
        if self.placement not in PLACEMENTS:
            problems.append(
                f"{PREFIX}placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}"
            )
        if self.host is not None and not self.host:
            problems.append(f"{PREFIX}host must not be empty")
        if self.base_port is not None and not 1 <= self.base_port <= 65535 - 2 * self.nodes - 1:
            problems.append(
                f"{PREFIX}basePort must leave room for {self.nodes} node ports, the coordinator's "
                f"two and {self.nodes} internal ports (1..{65535 - 2 * self.nodes - 1}), "
                f"got {self.base_port}"
            )
        if not NAME_PATTERN.fullmatch(self.cluster_name):
            problems.append(
                f"{PREFIX}clusterName must be 1 to 64 letters, digits, '.', '_' or '-', "
                f"starting with a letter or digit, got {self.cluster_name!r}"
            )
        if self.kv_memory_bytes < 1:
            problems.append(
                f"{PREFIX}kvMemory must be a positive size such as 512m, got {self.kv_memory_bytes}"
            )
        if not (math.isfinite(self.start_timeout_s) and self.start_timeout_s > 0):
            problems.append(
                f"{PREFIX}startTimeout must be a positive number of seconds, got {self.start_timeout_s}"
            )
        if not math.isfinite(self.failure_timeout_s):
            problems.append(
                f"{PREFIX}failureTimeout must be a duration such as 500ms, got {self.failure_timeout_s}"
            )
        else:
            try:
                check_failure_timeout(self.failure_timeout_ms)
            except ValueError as e:
                problems.append(f"{PREFIX}failureTimeout: {e}")
        if not (math.isfinite(self.relay_timeout_s) and self.relay_timeout_ms > 0):
            problems.append(
                f"{PREFIX}relayTimeout must be a positive duration such as 1500ms, "
                f"got {self.relay_timeout_s}"
            )
        if self.archive_url is not None and not self.archive_url:
            problems.append(f"{PREFIX}archiveUrl must not be empty")
        if self.archive_sync and self.archive_url is None:
            problems.append(f"{PREFIX}archiveSync needs {PREFIX}archiveUrl")
        if self.archive_snapshot_entries < 1 or self.archive_keep_snapshots < 1:
            problems.append(
                f"{PREFIX}archiveSnapshotEntries and {PREFIX}archiveKeepSnapshots must be at "
                f"least 1, got {self.archive_snapshot_entries} and {self.archive_keep_snapshots}"
            )
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            problems.append(
                f"{PREFIX}logLevel must be a logging level such as WARNING, got {self.log_level!r}"
            )
        try:
            self.public_tls  # noqa: B018 - reads the files, so that a bad one fails here
        except ValueError as e:
            problems.append(f"{PREFIX}tls.*: {e}")
        try:
            self.auth  # noqa: B018 - reads the file, so that a bad one fails here
        except ValueError as e:
            problems.append(f"{PREFIX}auth.config: {e}")
        if problems:
            raise ValueError("; ".join(problems))

    @functools.cached_property
    def public_tls(self) -> TlsConfig | None:
        """The client ports' TLS, its PEM read here (the driver) once, to travel to the
        nodes."""
        files = (self.tls_cert_file, self.tls_key_file, self.tls_trusted_ca_file)
        if not any(files):
            return None
        return TlsConfig(TlsConfig.from_files(*files).material)

    @functools.cached_property
    def auth(self) -> dict[str, Any] | None:
        """The auth config, checked and read here (the driver) once, to travel to the
        nodes, which build their verifiers from it."""
        if self.auth_config is None:
            return None
        raw = read_auth_file(self.auth_config)
        AuthConfig.parse(raw, str(self.auth_config))
        return raw

    @property
    def node_names(self) -> list[str]:
        """The nodes' member names, node ``i`` at index ``i``."""
        return [f"node{i}" for i in range(self.nodes)]

    def client_port(self, index: int) -> int:
        """Node `index`'s client port: fixed with `base_port`, else 0 (a free one)."""
        return 0 if self.base_port is None else self.base_port + index

    def internal_port(self, index: int) -> int:
        return 0 if self.base_port is None else self.base_port + self.nodes + 1 + index

    @property
    def admin_port(self) -> int:
        return 0 if self.base_port is None else self.base_port + self.nodes

    @property
    def registry_port(self) -> int:
        return 0 if self.base_port is None else self.base_port + 2 * self.nodes + 1

    @property
    def archive(self) -> ArchiveSettings:
        """How the nodes archive (`NodeConfig.archive`)."""
        return ArchiveSettings(
            sync=self.archive_sync,
            snapshot_entries=self.archive_snapshot_entries,
            keep_snapshots=self.archive_keep_snapshots,
        )

    @property
    def failure_timeout_ms(self) -> int:
        return round(self.failure_timeout_s * 1000)

    @property
    def relay_timeout_ms(self) -> int:
        return round(self.relay_timeout_s * 1000)


#: The types a keyword argument of `start` may have, per field (bool is no int here).
_OVERRIDE_TYPES: dict[str, tuple[type, ...]] = {
    "nodes": (int,),
    "shards": (int,),
    "replication_factor": (int,),
    "base_port": (int,),
    "start_timeout_s": (int, float),
    "failure_timeout_s": (int, float),
    "relay_timeout_s": (int, float),
    "wal_sync": (bool,),
    "archive_sync": (bool,),
    "archive_snapshot_entries": (int,),
    "archive_keep_snapshots": (int,),
    "archive_url": (str, os.PathLike),
    "kv_memory_bytes": (int,),
    "data_dir": (str, os.PathLike),
    **{name: (str, os.PathLike) for name in _PATHS},
}


def _request_limits(conf: Mapping[str, str]) -> RequestLimits:
    """The nodes' limits: defaults, then the entries of `conf` that set them."""
    values: dict[str, int] = {}
    for name, setting in limit_settings().items():
        raw = conf.get(setting.spark_conf)
        if raw is None:
            continue
        try:
            values[name] = _bytes(raw) if setting.in_bytes else int(raw)
        except ValueError:
            wanted = "a size such as 64m (bytes, or k, m, g)" if setting.in_bytes else "a number"
            raise ValueError(f"{setting.spark_conf}: cannot read {raw!r} as {wanted}") from None
    return RequestLimits(**values)


def _checked_override(name: str, value: Any) -> Any:
    """`value` if a keyword argument `name` may have it; TypeError naming both otherwise."""
    kinds = _OVERRIDE_TYPES.get(name, (str,))
    if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
        if isinstance(value, str) and _KEYS[name][1] is str.strip:
            return value.strip()  # as the same setting from the conf is
        return value
    wanted = " or ".join("path" if k is os.PathLike else k.__name__ for k in kinds)
    raise TypeError(f"{name} must be of type {wanted}, got {value!r} ({type(value).__name__})")


def local_master(master: str) -> bool:
    """Whether a master URL runs every executor on the driver's machine."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def node_path(data_dir: str | os.PathLike[str], index: int, suffix: str = "") -> Path:
    """Node `index`'s data directory, or with `suffix` (".pid", ".start-error") a file its
    task keeps beside it, which the driver reads on local masters."""
    return Path(data_dir) / f"node{index}{suffix}"


def _describe(name: str) -> str:
    return {
        "wal_sync": "true or false",
        "archive_sync": "true or false",
        "kv_memory_bytes": "a size such as 512m (bytes, or k, m, g)",
        "start_timeout_s": "a number of seconds",
        "failure_timeout_s": "a duration such as 500ms or 2s",
        "relay_timeout_s": "a duration such as 1500ms or 2s",
    }.get(name, "a whole number")
