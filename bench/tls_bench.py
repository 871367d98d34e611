"""TLS benchmark: what TLS and bearer tokens cost, against the same cluster in plaintext.

Three clusters, one after another in the same run, each of 3 `quorumstore node`
processes and a coordinator on loopback (replication factor 3, WAL fsync on):

* plaintext: no TLS anywhere (the internal port admits loopback callers);
* TLS: mutual TLS on the internal plane (replication, node control), TLS on the
  client port, certificates from CAs made for the run;
* TLS + token: the same, and an auth config, so every call carries a bearer token that
  the node checks.

For each: puts per second of `--callers` asyncio tasks sharing one `AsyncClient`
(100-byte values over `--keys` keys), and the latency of single puts sent one at a
time by one caller (p50, p99). Ratios are against plaintext.

Usage: python bench/tls_bench.py [--seconds S] [--callers N] [--puts N] [--keys K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from client_bench import run_tasks
from replication_bench import QuorumstoreCluster

from quorumstore import AsyncClient
from quorumstore.wire.certificates import CertificateAuthority
from quorumstore.wire.tls import TlsConfig, TlsMaterial

TOKEN = "bench-token-0123456789abcdef0123"
VALUE_BYTES = 100
CONFIGS = ("plaintext", "TLS", "TLS + token")


class SecuredCluster(QuorumstoreCluster):
    """QuorumstoreCluster whose processes get `extra` flags (the coordinator: `internal`)."""

    def __init__(self, base_dir: Path, shards: int, nodes: list[str], internal: list[str]) -> None:
        super().__init__(base_dir, shards)
        self._node_flags = nodes
        self._coordinator_flags = internal

    def _argv(self, name: str) -> list[str]:
        extra = self._coordinator_flags if name == "coordinator" else self._node_flags
        return [*super()._argv(name), *extra]


def _pem_files(directory: Path, name: str, material: TlsMaterial) -> list[str]:
    paths = []
    for part, pem in zip(
        ("cert", "key", "ca"),
        (material.cert_chain, material.private_key, material.trusted_ca),
        strict=True,
    ):
        assert pem is not None
        path = directory / f"{name}-{part}.pem"
        path.write_bytes(pem)
        paths.append(str(path))
    return paths


def cluster_for(config: str, base: Path, shards: int) -> tuple[QuorumstoreCluster, dict[str, Any]]:
    """The cluster of `config`, and the options its client needs."""
    if config == "plaintext":
        return QuorumstoreCluster(base, shards), {}
    base.mkdir(parents=True, exist_ok=True)
    cluster_ca, public_ca = CertificateAuthority.create(), CertificateAuthority.create("public")
    cert, key, ca = _pem_files(base, "internal", cluster_ca.issue("member", ["127.0.0.1"]))
    internal = [f"--internal-tls-cert-file={cert}", f"--internal-tls-key-file={key}",
                f"--internal-tls-trusted-ca-file={ca}"]  # fmt: skip
    cert, key, ca = _pem_files(base, "public", public_ca.issue("nodes", ["127.0.0.1"]))
    nodes = [*internal, f"--tls-cert-file={cert}", f"--tls-key-file={key}",
             f"--tls-trusted-ca-file={ca}"]  # fmt: skip
    options: dict[str, Any] = {"tls": TlsConfig(TlsMaterial(trusted_ca=public_ca.cert))}
    if config == "TLS + token":
        auth = base / "auth.json"
        auth.write_text(json.dumps({"tokens": {"bench": TOKEN}}))
        auth.chmod(0o600)
        nodes.append(f"--auth-config={auth}")
        options["token"] = TOKEN
    return SecuredCluster(base, shards, nodes, internal), options


async def measure(
    addresses: list[str], options: dict[str, Any], args: argparse.Namespace
) -> dict[str, float]:
    keys = [f"/bench/{i:06d}" for i in range(args.keys)]
    async with AsyncClient(addresses, **options) as client:
        await client.put_many({key: os.urandom(VALUE_BYTES) for key in keys})
        puts_per_s = await run_tasks(client, keys, 0.0, args.callers, args.seconds)
        value = os.urandom(VALUE_BYTES)
        latencies = []
        for i in range(args.puts):
            started = time.perf_counter()
            await client.put(keys[i % len(keys)], value)
            latencies.append(time.perf_counter() - started)
    cuts = statistics.quantiles(latencies, n=100)
    return {"puts/s": puts_per_s, "p50 ms": cuts[49] * 1000, "p99 ms": cuts[98] * 1000}


def print_report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    print(
        f"3 nodes, replication factor 3, fsync on, {args.shards} shard(s); "
        f"{args.callers} callers for {args.seconds:g} s; {args.puts} single puts"
    )
    print(f"{'':14}{'puts/s':>12}{'ratio':>8}{'put p50 ms':>12}{'put p99 ms':>12}{'p50 ratio':>11}")
    plain = results["plaintext"]
    for config, row in results.items():
        print(
            f"{config:14}{row['puts/s']:>12,.0f}{row['puts/s'] / plain['puts/s']:>8.2f}"
            f"{row['p50 ms']:>12.2f}{row['p99 ms']:>12.2f}{row['p50 ms'] / plain['p50 ms']:>11.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="timed window of the puts/s run"
    )
    parser.add_argument("--callers", type=int, default=64, help="concurrent callers")
    parser.add_argument("--puts", type=int, default=500, help="single puts timed one at a time")
    parser.add_argument("--keys", type=int, default=1000, help="keys the puts overwrite")
    parser.add_argument("--shards", type=int, default=1, help="shards")
    args = parser.parse_args(argv)
    if min(args.seconds, args.callers, args.puts, args.keys, args.shards) <= 0:
        parser.error("every number must be positive")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="qs-tls-bench-") as work:
        for i, config in enumerate(CONFIGS):
            cluster, options = cluster_for(config, Path(work) / f"c{i}", args.shards)
            with cluster:
                results[config] = asyncio.run(measure(cluster.nodes, options, args))
    print_report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
