"""TLS and bearer tokens end to end, in-process: three nodes whose internal plane is
mutual TLS with the cluster's own CA, whose client port is TLS with a certificate from
another CA, and which admit only calls with a valid token (static, or an OIDC JWT
from an issuer served here on loopback). Real certificates, a real HTTP issuer, real
gRPC: nothing is mocked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import jwt
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from in_process import until_online
from quorumstore.client import AsyncClient, PermissionDenied, TlsConfig, Unauthenticated
from quorumstore.client.data_service import DataClient, DataClientError
from quorumstore.coordinator.server import CoordinatorServer, CoordinatorServerConfig
from quorumstore.node.auth.check import AuthConfig, AuthConfigError
from quorumstore.node.node import Node, NodeConfig
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.proto import oxia_client_pb2_grpc
from quorumstore.proto import replication_pb2 as rpb
from quorumstore.proto import replication_pb2_grpc as rpb_grpc
from quorumstore.wire.auth import ClusterSecret
from quorumstore.wire.certificates import CLUSTER_SERVER_NAME, CertificateAuthority
from quorumstore.wire.metadata import ROUTING_METADATA_KEY, bearer_metadata
from quorumstore.wire.tls import TlsError, TlsMaterial, dial_credentials, open_aio_channel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ALICE = "alice-static-token-0123456789abcdef"
READER = "reader-static-token-0123456789abcdef"
AUDIENCE = "quorumstore"


class Issuer:
    """An OIDC issuer on loopback: a discovery document, a JWKS, and tokens it signs."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key()))
        jwk.update(kid="k1", use="sig", alg="ES256")
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                documents = {
                    "/.well-known/openid-configuration": {
                        "issuer": issuer.url,
                        "jwks_uri": issuer.url + "/jwks.json",
                    },
                    "/jwks.json": {"keys": [jwk]},
                }
                body = json.dumps(documents.get(self.path, {})).encode()
                self.send_response(200 if self.path in documents else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def token(self, subject: str, *, expires_in_s: float = 300, key: object = None) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": subject,
            "iat": now,
            "exp": now + int(expires_in_s),
        }
        return jwt.encode(claims, key or self.key, algorithm="ES256", headers={"kid": "k1"})

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    issuer = Issuer()
    yield issuer
    issuer.close()


@dataclass
class Secured:
    nodes: list[Node]
    coordinator: CoordinatorServer
    cluster_ca: CertificateAuthority
    public_ca: CertificateAuthority
    client_tls: TlsConfig
    public_dir: Path

    @property
    def addresses(self) -> list[str]:
        return [n.name for n in self.nodes]


def _write_public_tls(directory: Path, ca: CertificateAuthority) -> TlsConfig:
    """A public certificate for 127.0.0.1, and the CA that relays check other nodes'
    certificates against, in files (so that rotation can be tested)."""
    material = ca.issue("node", ["127.0.0.1", "localhost"])
    directory.mkdir(parents=True, exist_ok=True)
    assert material.cert_chain is not None and material.private_key is not None
    files = (directory / "cert.pem", directory / "key.pem", directory / "ca.pem")
    for path, pem in zip(files, (material.cert_chain, material.private_key, ca.cert), strict=True):
        path.write_bytes(pem)
    return TlsConfig.from_files(*files)


@asynccontextmanager
async def secured_cluster(data_dir: Path, issuer: Issuer) -> AsyncIterator[Secured]:
    cluster_ca = CertificateAuthority.create()
    public_ca = CertificateAuthority.create("public CA")
    public_tls = _write_public_tls(data_dir / "public", public_ca)
    auth = AuthConfig.parse(
        {
            "tokens": {"alice": ALICE, "reader": READER},
            "oidc": {"issuer": issuer.url, "audience": AUDIENCE},
            "grants": {
                "alice": {"*": "write"},
                "bob": {"*": "write"},
                "carol": {"default": "write"},
                "reader": {"default": "read"},
            },
        }
    )
    nodes = []
    for i in range(3):
        node = Node(
            NodeConfig(
                data_dir / f"node{i}",
                wal_sync=False,
                internal_tls=cluster_ca.internal_tls(f"node{i}"),
                tls=public_tls,
                auth=auth,
            )
        )
        await node.start()
        nodes.append(node)
    coordinator = CoordinatorServer(
        CoordinatorServerConfig(
            nodes=[n.name for n in nodes],
            metadata_url=str(data_dir / "coordinator" / "metadata.pb"),
            internal_addresses={n.name: n.internal_address for n in nodes},
            internal_tls=cluster_ca.internal_tls("coordinator"),
            replication_factor=3,
        )
    )
    await coordinator.start()
    try:
        await until_online(coordinator)
        client_tls = TlsConfig(TlsMaterial(trusted_ca=public_ca.cert))
        yield Secured(nodes, coordinator, cluster_ca, public_ca, client_tls, data_dir / "public")
    finally:
        await coordinator.stop()
        for node in nodes:
            await node.stop()


def test_tls_and_tokens_end_to_end(tmp_path: Path, issuer: Issuer) -> None:
    asyncio.run(_end_to_end(tmp_path, issuer))


async def _end_to_end(tmp_path: Path, issuer: Issuer) -> None:
    async with secured_cluster(tmp_path, issuer) as cluster:
        # A static token and an OIDC token both write and read, replicated over mutual TLS.
        for token in (ALICE, issuer.token("bob")):
            async with AsyncClient(cluster.addresses, tls=cluster.client_tls, token=token) as c:
                await c.put("/k", token[:5].encode())
                _, value, _ = await c.get("/k")
                assert value == token[:5].encode()

        # A token source called before each call (a renewing client) works too.
        async with AsyncClient(
            cluster.addresses, tls=cluster.client_tls, token=lambda: issuer.token("carol")
        ) as c:
            await c.put("/renewed", b"1")

        # The reader may read `default`, not write it.
        async with AsyncClient(cluster.addresses, tls=cluster.client_tls, token=READER) as c:
            assert (await c.get("/k"))[1] is not None
            with pytest.raises(PermissionDenied, match="'reader' may not write to namespace"):
                await c.put("/k", b"no")

        # Missing, unknown, forged and expired tokens are refused at connect.
        forger = ec.generate_private_key(ec.SECP256R1())
        refused = {
            None: "carries no bearer token",
            "not-a-token-at-all-0123456789": "not one of the configured tokens",
            issuer.token("mallory", key=forger): "not valid",
            issuer.token("bob", expires_in_s=-120): "expired",
        }
        for token, reason in refused.items():
            with pytest.raises(Unauthenticated, match=reason):
                async with AsyncClient(
                    cluster.addresses, tls=cluster.client_tls, token=token, connect_timeout_s=5
                ):
                    pass

        # The data service: Arrow writes and scans with TLS and a token, from a thread.
        def data_round_trip() -> list[str]:
            with DataClient(",".join(cluster.addresses), tls=cluster.client_tls, token=ALICE) as d:
                rows = pa.table({"key": ["/a1", "/a2"], "value": [b"x", b"y"]})
                for shard, part in d.route(rows).items():
                    d.write(shard, part)
                return [
                    key
                    for shard in d.shards()
                    for batch, _ in d.scan(shard.shard)
                    for key in batch.column(0).to_pylist()
                ]

        assert {"/a1", "/a2"} <= set(await asyncio.to_thread(data_round_trip))

        def data_without_token() -> None:
            with DataClient(",".join(cluster.addresses), tls=cluster.client_tls) as d:
                d.shards()

        with pytest.raises(DataClientError, match="UNAUTHENTICATED|bearer token"):
            await asyncio.to_thread(data_without_token)

        await _gateway_relay_carries_the_token(cluster)
        await _plaintext_and_strangers_refused(cluster)
        await _rotated_certificate_served(cluster)


async def _gateway_relay_carries_the_token(cluster: Secured) -> None:
    """A gateway-mode call to a follower is relayed to the leader with the caller's
    token (the leader checks it too)."""
    assert cluster.coordinator.engine is not None
    shard = next(iter(cluster.coordinator.engine.metadata.shards.values()))
    follower = next(a for a in cluster.addresses if a != shard.leader)
    channel = open_aio_channel(follower, [], cluster.client_tls)
    stub = oxia_client_pb2_grpc.OxiaClientStub(channel)
    gateway = ((ROUTING_METADATA_KEY, "gateway"),)
    request = pb.WriteRequest(
        shard=shard.shard[1], puts=[pb.PutRequest(key="/relayed", value=b"r")]
    )
    try:
        response = await stub.Write(request, metadata=gateway + bearer_metadata(ALICE), timeout=10)
        assert response.puts[0].status == pb.OK
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Write(request, metadata=gateway, timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await channel.close()


async def _plaintext_and_strangers_refused(cluster: Secured) -> None:
    """Plaintext to the client port, and anything but a member's certificate on the
    internal port, gets no further than the handshake."""
    plain = grpc.aio.insecure_channel(cluster.addresses[0])
    try:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await (
                oxia_client_pb2_grpc.OxiaClientStub(plain)
                .GetShardAssignments(
                    pb.ShardAssignmentsRequest(), metadata=bearer_metadata(ALICE), timeout=3
                )
                .read()
            )
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        await plain.close()
    internal = cluster.nodes[0].internal_address
    strangers = {
        "another CA": CertificateAuthority.create().internal_tls("intruder"),
        "no certificate": TlsConfig(
            TlsMaterial(trusted_ca=cluster.cluster_ca.cert), server_name=CLUSTER_SERVER_NAME
        ),
    }
    for name, tls in strangers.items():
        channel = open_aio_channel(internal, [], tls)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await rpb_grpc.NodeControlStub(channel).NewTerm(
                    rpb.NewTermRequest(namespace="default", shard=0, term=10**15), timeout=3
                )
            assert failed.value.code() is grpc.StatusCode.UNAVAILABLE, name
        finally:
            await channel.close()


async def _rotated_certificate_served(cluster: Secured) -> None:
    """Certificate files replaced while the nodes run: new connections get the new
    certificate (a client trusting only the new CA connects), no restart."""
    new_ca = CertificateAuthority.create("renewed public CA")
    _write_public_tls(cluster.public_dir, new_ca)
    renewed = TlsConfig(TlsMaterial(trusted_ca=new_ca.cert))
    async with AsyncClient(cluster.addresses, tls=renewed, token=ALICE, connect_timeout_s=10) as c:
        await c.put("/after-rotation", b"1")


def test_a_token_is_never_sent_in_plaintext_off_loopback() -> None:
    with pytest.raises(TlsError, match="sent only over TLS"):
        dial_credentials("198.18.0.7:6648", None, ALICE)
    assert dial_credentials("127.0.0.1:6648", None, ALICE) is not None


def test_auth_configs_that_cannot_work_are_refused(tmp_path: Path) -> None:
    cases = {
        '{"grants": {}}': "names no",
        '{"tokens": {"a": "short"}}': "at least 16 characters",
        '{"tokens": {"a": "0123456789abcdef0"}, "grants": {"a": {"*": "admin"}}}': '"read" or "write"',
        '{"oidc": {"audience": "x"}}': "needs an issuer",
        '{"tokens": {"a": "0123456789abcdef0"}, "extra": 1}': "unknown settings",
        "[1]": "JSON object",
    }
    for text, message in cases.items():
        path = tmp_path / "auth.json"
        path.write_text(text)
        path.chmod(0o600)
        with pytest.raises(AuthConfigError, match=message):
            AuthConfig.from_file(path)
    path.write_text('{"tokens": {"a": "0123456789abcdef0"}}')
    path.chmod(0o644)
    with pytest.raises(AuthConfigError, match="chmod 600"):
        AuthConfig.from_file(path)


def test_plaintext_beyond_loopback_warns_and_tokens_there_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node listening on every interface without TLS logs a warning; with an auth
    config it refuses to start, since clients would send their tokens in the clear."""

    async def scenario() -> None:
        exposed = {"host": "0.0.0.0", "advertise_host": "198.18.0.9", "wal_sync": False}
        secret = ClusterSecret.generate()
        tokens = AuthConfig.parse({"tokens": {"alice": ALICE}})
        refused = Node(NodeConfig(tmp_path / "a", cluster_secret=secret, auth=tokens, **exposed))
        with pytest.raises(TlsError, match="bearer tokens in plaintext on 0.0.0.0, 198.18.0.9"):
            await refused.start()
        warned = Node(NodeConfig(tmp_path / "b", cluster_secret=secret, **exposed))
        with caplog.at_level(logging.WARNING, logger="quorumstore.wire.tls"):
            await warned.start()
        try:
            assert "listens on 0.0.0.0, 198.18.0.9 without TLS" in caplog.text
        finally:
            await warned.stop()

    asyncio.run(scenario())
