"""What proves membership of a cluster on its internal plane, and the channels and
ports that use it.

Node control, replication and snapshots are served on each node's internal port and
called by the coordinator and the other nodes. A caller proves it is a member by
mutual TLS with the cluster's CA (`tls`), by carrying the cluster secret (`secret`),
or both; with neither, every internal address must be loopback (one machine, whose
users are trusted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from quorumstore.wire.auth import ClusterSecret, SecretCheck, SecretError, is_loopback
from quorumstore.wire.channels import PEER_CHANNEL_OPTIONS, listen
from quorumstore.wire.guards import RequestParsing
from quorumstore.wire.tls import TlsConfig, open_aio_channel


@dataclass(frozen=True)
class Membership:
    secret: ClusterSecret | None = None
    tls: TlsConfig | None = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The headers every internal call carries."""
        return () if self.secret is None else self.secret.metadata

    def require_off_loopback(self, hosts: list[str], what: str) -> None:
        """Refuses to run `what` reachable from other machines with nothing to keep them
        out."""
        if self.secret is not None or self.tls is not None:
            return
        exposed = [h for h in hosts if not is_loopback(h)]
        if exposed:
            raise SecretError(
                f"{what} would serve or call internal services on {', '.join(exposed)}, which "
                "other machines can reach, with nothing to tell members of the cluster from "
                "strangers; give it internal TLS (--internal-tls-cert-file, "
                "--internal-tls-key-file, --internal-tls-trusted-ca-file) or "
                "--cluster-secret-file (see docs/security.md), or listen on 127.0.0.1"
            )

    def server(
        self, options: Sequence[tuple[str, object]], server_name: Callable[[], str]
    ) -> grpc.aio.Server:
        """A server for internal services: calls without the secret, and requests that
        do not parse, end before any servicer sees them."""
        checks = [] if self.secret is None else [SecretCheck(self.secret, server_name)]
        return grpc.aio.server(options=options, interceptors=[*checks, RequestParsing()])

    def listen(self, server: grpc.aio.Server, host: str, port: int) -> int:
        """Binds the internal port: mutual TLS when configured."""
        credentials = (
            None if self.tls is None else self.tls.server_credentials(require_client_cert=True)
        )
        return listen(server, host, port, credentials)

    def channel(self, address: str) -> grpc.aio.Channel:
        """A channel to a member's internal port."""
        return open_aio_channel(address, PEER_CHANNEL_OPTIONS, self.tls)
