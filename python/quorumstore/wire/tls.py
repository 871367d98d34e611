"""TLS of every channel: the PEM material a process serves and dials with.

A process has up to two TLS settings. Its *public* TLS covers the client port (the Oxia
API and the data service) and the coordinator's status port: the server proves who it
is, and clients authenticate with bearer tokens (`node/authentication.py`), not
certificates. Its *internal* TLS covers node control, replication and snapshots: both
ends present a certificate issued by the cluster's own CA (mutual TLS), so only members
of the cluster get in.

Material read from files is read again when a file changes: a server presents a
renewed certificate to every connection made after the renewal (gRPC asks for it at
each handshake), and no restart is needed to rotate certificates.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from quorumstore.wire.auth import is_loopback
from quorumstore.wire.metadata import bearer_metadata

log = logging.getLogger(__name__)

#: gRPC channel option naming the name a server's certificate is checked against, when
#: it is not the host dialed (every node of a Spark-hosted cluster has one certificate
#: name; see `certificates.py`).
_SERVER_NAME_OPTION = "grpc.ssl_target_name_override"


class TlsError(ValueError):
    """TLS settings that cannot work: a file missing or unreadable, a key without its
    certificate, no CA to check peers against."""


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes: a certificate chain and its private key (what this side presents), and
    the CA certificates it checks the other side against."""

    cert_chain: bytes | None = None
    private_key: bytes | None = field(default=None, repr=False)
    trusted_ca: bytes | None = None

    def __post_init__(self) -> None:
        if (self.cert_chain is None) != (self.private_key is None):
            raise TlsError("a TLS certificate needs its private key, and a key its certificate")


@dataclass(frozen=True)
class TlsConfig:
    """One TLS setting: where its material comes from, and the name peers' certificates
    carry when it is not the host dialed."""

    material: TlsMaterial
    #: Files the material was read from (cert, key, trusted CA), read again on change.
    files: tuple[Path | None, Path | None, Path | None] | None = None
    server_name: str | None = None

    @classmethod
    def from_files(
        cls,
        cert_file: Path | None,
        key_file: Path | None,
        trusted_ca_file: Path | None,
        server_name: str | None = None,
    ) -> TlsConfig:
        files = (cert_file, key_file, trusted_ca_file)
        return cls(_read_material(files), files, server_name)

    def current(self) -> TlsMaterial:
        """The material now: read again from its files, if it came from files."""
        return self.material if self.files is None else _read_material(self.files)

    # ------------------------------------------------------------ serving

    def server_credentials(self, *, require_client_cert: bool) -> grpc.ServerCredentials:
        """Credentials of a server port; with `require_client_cert`, a caller must present
        a certificate issued by the trusted CA (mutual TLS)."""
        material = self.material
        if material.cert_chain is None or material.private_key is None:
            raise TlsError("serving TLS needs a certificate and its private key")
        if require_client_cert and material.trusted_ca is None:
            raise TlsError("mutual TLS needs the CA that issues the peers' certificates")
        initial = _server_configuration(material)
        if self.files is None:
            return grpc.dynamic_ssl_server_credentials(
                initial, lambda: None, require_client_authentication=require_client_cert
            )
        return grpc.dynamic_ssl_server_credentials(
            initial,
            _Reloader(self.files, material).fetch,
            require_client_authentication=require_client_cert,
        )

    # ------------------------------------------------------------ dialing

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials of a channel: the server checked against the trusted CA (the
        system's roots when none is given), this side's certificate presented if it has
        one."""
        material = self.current()
        return grpc.ssl_channel_credentials(
            root_certificates=material.trusted_ca,
            private_key=material.private_key,
            certificate_chain=material.cert_chain,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        return [] if self.server_name is None else [(_SERVER_NAME_OPTION, self.server_name)]


def _server_configuration(material: TlsMaterial) -> object:
    assert material.private_key is not None and material.cert_chain is not None
    return grpc.ssl_server_certificate_configuration(
        [(material.private_key, material.cert_chain)], root_certificates=material.trusted_ca
    )


def _read_material(files: tuple[Path | None, Path | None, Path | None]) -> TlsMaterial:
    cert, key, ca = (None if path is None else _read(path) for path in files)
    return TlsMaterial(cert, key, ca)


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TlsError(f"cannot read the TLS file {path}: {e.strerror}") from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"{path} holds no PEM data (a certificate or key in PEM form is expected)")
    return data


def _mtimes(files: tuple[Path | None, ...]) -> tuple[int, ...]:
    stamps = []
    for path in files:
        try:
            stamps.append(0 if path is None else os.stat(path).st_mtime_ns)
        except OSError:
            stamps.append(-1)
    return tuple(stamps)


class _Reloader:
    """gRPC's certificate fetcher of a server: the files' material once they change."""

    def __init__(self, files: tuple[Path | None, Path | None, Path | None], first: TlsMaterial):
        self._files = files
        self._stamps = _mtimes(files)
        self._material = first

    def fetch(self) -> object | None:
        stamps = _mtimes(self._files)
        if stamps == self._stamps:
            return None
        try:
            material = _read_material(self._files)
            configuration = _server_configuration(material)
        except TlsError as e:
            # A renewal half written (the key before its certificate) is looked at again
            # at the next handshake; meanwhile the last good material serves.
            log.warning(
                "TLS files changed but cannot be used yet (%s); still serving the old ones", e
            )
            return None
        self._stamps = stamps
        self._material = material
        log.info("TLS: serving the renewed certificate of %s", self._files[0])
        return configuration


#: A bearer token, or a function that returns the current one (asked before each call,
#: so that a token that expires can be renewed).
TokenSource = str | Callable[[], str]


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: TokenSource) -> None:
        self._token = token

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        try:
            token = self._token if isinstance(self._token, str) else self._token()
        except Exception as e:  # noqa: BLE001 - the call fails with the token source's error
            callback((), e)
            return
        callback(bearer_metadata(token), None)


def dial_credentials(
    address: str, tls: TlsConfig | None, token: TokenSource | None
) -> grpc.ChannelCredentials | None:
    """How a channel to `address` is secured and what it presents; None: plaintext.

    A token is sent over TLS only, or over loopback (gRPC's local credentials, which
    refuse any other peer), so that it never crosses a network in plaintext."""
    if token is None:
        return None if tls is None else tls.channel_credentials()
    if tls is not None:
        base = tls.channel_credentials()
    elif is_loopback(address.rpartition(":")[0]):
        base = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    else:
        raise TlsError(
            f"a bearer token is sent only over TLS, and {address} is not a loopback address; "
            "give the client TLS settings (a trusted CA at least)"
        )
    return grpc.composite_channel_credentials(
        base, grpc.metadata_call_credentials(_BearerToken(token))
    )


def open_aio_channel(
    address: str,
    options: Sequence[tuple[str, object]],
    tls: TlsConfig | None,
    token: TokenSource | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to `address`: over TLS when `tls` is given, presenting `token`
    on every call when given."""
    credentials = dial_credentials(address, tls, token)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    extra = [] if tls is None else tls.channel_options()
    return grpc.aio.secure_channel(address, credentials, options=[*options, *extra])


def open_channel(
    address: str,
    options: Sequence[tuple[str, object]],
    tls: TlsConfig | None,
    token: TokenSource | None = None,
) -> grpc.Channel:
    """A blocking channel to `address` (see `open_aio_channel`)."""
    credentials = dial_credentials(address, tls, token)
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    extra = [] if tls is None else tls.channel_options()
    return grpc.secure_channel(address, credentials, options=[*options, *extra])


def server_credentials(tls: TlsConfig | None) -> grpc.ServerCredentials | None:
    """Credentials of a public port (no client certificate asked); None: plaintext."""
    return None if tls is None else tls.server_credentials(require_client_cert=False)


def check_plaintext_exposure(
    hosts: Sequence[str], tls: TlsConfig | None, what: str, *, tokens: bool = False
) -> None:
    """`what` reachable from other machines in plaintext: a warning, or with `tokens`
    (clients would send their tokens in the clear) a TlsError."""
    exposed = list(dict.fromkeys(h for h in hosts if not is_loopback(h)))
    if tls is not None or not exposed:
        return
    if tokens:
        raise TlsError(
            f"{what} would take bearer tokens in plaintext on {', '.join(exposed)}; give it "
            "--tls-cert-file and --tls-key-file, or listen on 127.0.0.1 (docs/security.md)"
        )
    log.warning(
        "%s listens on %s without TLS: data crosses the network in plaintext; give it "
        "--tls-cert-file and --tls-key-file (docs/security.md)",
        what,
        ", ".join(exposed),
    )
