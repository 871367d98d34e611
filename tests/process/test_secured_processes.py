"""The TLS and token flags of the commands, on real processes: a 3-node cluster of
`quorumstore node` and `coordinator` processes with mutual TLS on the internal plane
(a CA made here, certificates in files), TLS on the client and status ports, and an
auth config; and the refusals a misconfiguration gets before anything serves.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster_harness import LocalCluster, run_cli
from quorumstore.client import AsyncClient, Unauthenticated
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.certificates import CLUSTER_SERVER_NAME, CertificateAuthority
from quorumstore.wire.tls import TlsConfig, TlsMaterial

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

TOKEN = "process-token-0123456789abcdef"


def _write(directory: Path, name: str, material: TlsMaterial) -> list[Path]:
    """cert, key and CA of `material` as files in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{name}-{part}.pem" for part in ("cert", "key", "ca")]
    for path, pem in zip(
        paths, (material.cert_chain, material.private_key, material.trusted_ca), strict=True
    ):
        assert pem is not None
        path.write_bytes(pem)
    return paths


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    root = tmp_path_factory.mktemp("secured")
    cluster_ca = CertificateAuthority.create()
    public_ca = CertificateAuthority.create("public")
    internal = _write(root / "tls", "internal", cluster_ca.issue("member", ["127.0.0.1"]))
    public = _write(root / "tls", "public", public_ca.issue("nodes", ["127.0.0.1"]))
    auth = root / "auth.json"
    auth.write_text(json.dumps({"tokens": {"app": TOKEN}}))
    auth.chmod(0o600)
    internal_flags = [
        "--internal-tls-cert-file", str(internal[0]),
        "--internal-tls-key-file", str(internal[1]),
        "--internal-tls-trusted-ca-file", str(internal[2]),
    ]  # fmt: skip
    public_flags = [
        "--tls-cert-file", str(public[0]),
        "--tls-key-file", str(public[1]),
        "--tls-trusted-ca-file", str(public[2]),
    ]  # fmt: skip
    cluster = LocalCluster(
        root,
        nodes=3,
        shards=2,
        fsync=False,
        node_args=[*internal_flags, *public_flags, "--auth-config", str(auth)],
        coordinator_args=[*internal_flags, *public_flags],
        public_tls=TlsConfig(TlsMaterial(trusted_ca=public_ca.cert)),
        internal_tls=TlsConfig(cluster_ca.issue("harness"), server_name=CLUSTER_SERVER_NAME),
    )
    try:
        cluster.start()
        yield cluster, public[2]
    finally:
        cluster.close()


def test_a_cluster_of_processes_with_tls_and_tokens(secured: tuple[LocalCluster, Path]) -> None:
    cluster, ca_file = secured
    tls = TlsConfig.from_files(None, None, ca_file)

    async def scenario() -> None:
        async with AsyncClient(cluster.nodes, tls=tls, token=TOKEN) as client:
            for i in range(20):
                await client.put(f"/k{i}", b"v")
            assert len(await client.list("/k", "/l")) == 20
        with pytest.raises(Unauthenticated):
            async with AsyncClient(cluster.nodes, tls=tls, connect_timeout_s=5):
                pass

    asyncio.run(scenario())
    # Every replica caught up over the mutual-TLS internal plane.
    for node in cluster.nodes:
        cluster.wait_rejoined(node)
    status = run_cli(
        "status", "--coordinator", cluster.admin_address, "--tls-trusted-ca-file", str(ca_file)
    )
    assert status.returncode == 0, status.stderr
    assert "shard" in status.stdout.lower()
    plain = run_cli("status", "--coordinator", cluster.admin_address, timeout_s=30)
    assert plain.returncode != 0


def test_tokens_are_not_taken_in_plaintext_off_loopback(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    ClusterSecret.generate().write_file(secret)
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": {"app": TOKEN}}))
    auth.chmod(0o600)
    result = run_cli(
        "node", "--host", "0.0.0.0", "--advertise-host", "198.18.0.9", "--port", "0",
        "--internal-port", "0", "--cluster-secret-file", str(secret),
        "--auth-config", str(auth), "--data-dir", str(tmp_path / "node"),
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "bearer tokens in plaintext" in result.stderr
    assert "Traceback" not in result.stderr


def test_unusable_tls_and_auth_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.pem").write_text("nothing here\n")
    cases = {
        (
            "--tls-cert-file",
            str(tmp_path / "missing.pem"),
            "--tls-key-file",
            str(tmp_path / "missing.pem"),
        ): "cannot read the TLS file",
        (
            "--tls-cert-file",
            str(tmp_path / "empty.pem"),
            "--tls-key-file",
            str(tmp_path / "empty.pem"),
        ): "holds no PEM data",
        ("--auth-config", str(tmp_path / "missing.json")): "cannot read the auth config",
    }
    for flags, message in cases.items():
        result = run_cli("standalone", "--port", "0", "--data-dir", str(tmp_path / "d"), *flags)
        assert result.returncode == 2, (flags, result.stderr)
        assert message in result.stderr, (flags, result.stderr)
        assert "Traceback" not in result.stderr
