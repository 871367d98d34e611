"""gRPC channel and server options, and listening on an address.

Every process of a cluster (nodes, the coordinator, clients) sends messages of up to
the same size: a bulk write's entry travels to each follower in one message. A node's
client port alone receives less, its `max_request_bytes` (`client_port_options`).
"""

from __future__ import annotations

import socket

import grpc

from quorumstore.wire.addresses import host_port

#: Largest gRPC message any quorumstore process sends or accepts.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MESSAGE_SIZE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
#: A connection whose peer died or is paused (SIGSTOP, cut off) fails its calls with
#: UNAVAILABLE within about two seconds: a ping every second, answered within a second.
#: Clients set no long deadlines; these pings notice a peer that stopped answering.
_FAST_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
#: A restarted node is found again within a second, not after gRPC's default backoff,
#: which grows to two minutes.
_FAST_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
#: Channels between cluster members (replication, control, the data service).
#:
#: - Keepalive pings end a connection whose peer stopped answering within two seconds,
#:   so calls do not wait on it. A connection that lived through a partition otherwise
#:   stays open with its unacknowledged packets in TCP's retransmission backoff, which
#:   after a few seconds of loss resends only every few seconds: after the heal, an
#:   election's NewTerm to that node waited up to 1.4 s for the next resend while the
#:   node itself was answering (bench/availability_bench.py).
#: - A peer back from a partition or a pause is dialled again within a second. gRPC's
#:   defaults wait up to 20 s for a connection attempt to a host that drops packets,
#:   then back off up to two minutes.
PEER_CHANNEL_OPTIONS = [
    *MESSAGE_SIZE_OPTIONS,
    *_FAST_KEEPALIVE_OPTIONS,
    *_FAST_RECONNECT_OPTIONS,
    ("grpc.min_reconnect_backoff_ms", 1000),
]
#: Servers: no SO_REUSEPORT (gRPC sets it by default on Linux), so that a second
#: process on a node's port fails to start instead of taking half of its connections;
#: they accept their peers', clients' and relays' frequent keepalive pings rather than
#: answer them with GOAWAY "too_many_pings", and ping an idle client every 10 s.
SERVER_OPTIONS = [
    *MESSAGE_SIZE_OPTIONS,
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
]


def client_port_options(max_request_bytes: int) -> list[tuple[str, int]]:
    """The options of a node's client port: `SERVER_OPTIONS`, receiving requests of at
    most `max_request_bytes` (the internal port keeps MAX_MESSAGE_BYTES for replication's
    large entries). gRPC itself refuses a larger message: RESOURCE_EXHAUSTED, "Received
    message larger than max (<size> vs. <max_request_bytes>)"."""
    receive = "grpc.max_receive_message_length"
    return [
        *(option for option in SERVER_OPTIONS if option[0] != receive),
        (receive, max_request_bytes),
    ]


#: quorumstore's client: a channel of its own per address (gRPC otherwise shares
#: subchannels, and with them the reconnect backoff of a dead node, with every later
#: channel to it); retries are the client's own, never gRPC's.
CLIENT_CHANNEL_OPTIONS = [
    *MESSAGE_SIZE_OPTIONS,
    ("grpc.use_local_subchannel_pool", 1),
    *_FAST_RECONNECT_OPTIONS,
    *_FAST_KEEPALIVE_OPTIONS,
    ("grpc.enable_retries", 0),
]
#: A node relaying a call to a shard's leader: a leader that was down is retried soon
#: after it is back, and one that stops answering is noticed by keepalive.
RELAY_CHANNEL_OPTIONS = [
    *MESSAGE_SIZE_OPTIONS,
    *_FAST_RECONNECT_OPTIONS,
    ("grpc.min_reconnect_backoff_ms", 100),
    *_FAST_KEEPALIVE_OPTIONS,
]


def probe_port(host: str, port: int) -> None:
    """Binds and releases host:port as a server here binds (SO_REUSEADDR, no SO_REUSEPORT),
    raising bind's OSError: EADDRINUSE while anything listens there, EADDRNOTAVAIL for an
    address this machine does not own (socket.gaierror for a name that does not resolve).
    Lets a caller say which before starting anything."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM
    )[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)


def listen(
    server: grpc.aio.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """Binds `server` to host:port (0: any free port), over TLS with `credentials`; returns
    the port or raises OSError.

    A fixed port is probed first, so the error says why (in use, or not an address of
    this machine) and gRPC's C core logs nothing. grpcio reports a failed bind by
    returning 0 in some versions and by raising RuntimeError in others."""
    if port:
        try:
            probe_port(host, port)
        except OSError as e:
            raise OSError(f"cannot listen on {host_port(host, port)}: {e.strerror}") from None
    try:
        address = host_port(host, port)
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(
            f"cannot listen on {host_port(host, port)}: the port is taken, or {host} is not an address "
            "of this machine"
        )
    return bound
