"""A cluster's own certificate authority: what authenticates its internal plane when
nobody handed it certificates.

A Spark-hosted cluster makes a CA when it starts and issues every node (and the
coordinator) a certificate from it; each process trusts that CA alone on its internal
port, so only processes started by this application get in. Every certificate carries
the one name `CLUSTER_SERVER_NAME` (peers are checked against it, not against the host
they dial, which executors change), plus the names it is given. Keys are EC P-256:
fast to make and to handshake with.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from quorumstore.wire.tls import TlsConfig, TlsMaterial

#: The name in every certificate a cluster CA issues, and the name peers check.
CLUSTER_SERVER_NAME = "quorumstore-cluster.internal"
#: A cluster CA and its certificates outlive any application run by far.
DEFAULT_VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA certificate and its key, in PEM."""

    cert: bytes
    key: bytes = field(repr=False)

    @classmethod
    def create(
        cls,
        common_name: str = "quorumstore cluster CA",
        validity: datetime.timedelta = DEFAULT_VALIDITY,
    ) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        cert = (
            _builder(name, name, key.public_key(), now, validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue(
        self,
        common_name: str,
        names: Sequence[str] = (),
        validity: datetime.timedelta = DEFAULT_VALIDITY,
    ) -> TlsMaterial:
        """A certificate for a server that is also a client (both ends of mutual TLS),
        valid for `CLUSTER_SERVER_NAME` and `names` (host names or IP addresses), with
        this CA as the trusted one."""
        ca_cert = x509.load_pem_x509_certificate(self.cert)
        ca_key = serialization.load_pem_private_key(self.key, password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            _builder(subject, ca_cert.subject, key.public_key(), _now(), validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.SubjectAlternativeName(
                    [_general_name(n) for n in dict.fromkeys([CLUSTER_SERVER_NAME, *names])]
                ),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        return TlsMaterial(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), self.cert)

    def internal_tls(self, common_name: str) -> TlsConfig:
        """The internal TLS of one member of the cluster: its certificate from this CA,
        trusting this CA only, peers checked against `CLUSTER_SERVER_NAME`."""
        return TlsConfig(self.issue(common_name), server_name=CLUSTER_SERVER_NAME)


def _now() -> datetime.datetime:
    # An hour back: hosts whose clocks run a little behind accept a new certificate.
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    not_before: datetime.datetime,
    validity: datetime.timedelta,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + validity)
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
