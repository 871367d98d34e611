"""A TCP echo probe the multi-host tests run inside hosts: does A reach B, and how fast?

`serve ADDRESS PORT` echoes every byte it receives on each connection and prints `ready`
once it listens. `connect ADDRESS PORT TIMEOUT ROUNDS` connects, sends ROUNDS one-byte
echoes and prints the round trips as JSON (`{"rtt_ms": [...]}`), or exits 1 with the error
when the connection or an echo takes longer than TIMEOUT seconds.

One way, with no answer that could be lost on the way back: `udp-receive ADDRESS PORT
TIMEOUT` prints `ready` once bound, then `{"received": true}` at the first datagram or
`{"received": false}` after TIMEOUT seconds; `udp-send ADDRESS PORT ROUNDS` sends ROUNDS
datagrams 50 ms apart.

Run as: python probe.py serve|connect|udp-receive|udp-send ...
"""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import time


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := self.request.recv(4096):
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def serve(address: str, port: int) -> None:
    with _Server((address, port), _Echo) as server:
        print("ready", flush=True)
        server.serve_forever()


def connect(address: str, port: int, timeout: float, rounds: int) -> int:
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rtts = []
            for _ in range(rounds):
                start = time.perf_counter()
                sock.sendall(b"x")
                if sock.recv(1) != b"x":
                    raise ConnectionError("the echo server closed the connection")
                rtts.append((time.perf_counter() - start) * 1000.0)
    except OSError as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
        return 1
    print(json.dumps({"rtt_ms": rtts}), flush=True)
    return 0


def udp_receive(address: str, port: int, timeout: float) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((address, port))
        sock.settimeout(timeout)
        print("ready", flush=True)
        try:
            sock.recv(64)
        except TimeoutError:
            print(json.dumps({"received": False}), flush=True)
            return 0
    print(json.dumps({"received": True}), flush=True)
    return 0


def udp_send(address: str, port: int, rounds: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(rounds):
            sock.sendto(b"x", (address, port))
            time.sleep(0.05)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 3:
        serve(argv[1], int(argv[2]))
        return 0
    if argv[:1] == ["connect"] and len(argv) == 5:
        return connect(argv[1], int(argv[2]), float(argv[3]), int(argv[4]))
    if argv[:1] == ["udp-receive"] and len(argv) == 4:
        return udp_receive(argv[1], int(argv[2]), float(argv[3]))
    if argv[:1] == ["udp-send"] and len(argv) == 4:
        return udp_send(argv[1], int(argv[2]), int(argv[3]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
