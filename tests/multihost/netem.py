"""A userspace netem: holds each packet of an NFQUEUE queue for a fixed delay, drops a share.

The kernel here has no `netem` qdisc, so `Hosts.delay` sends a host's outgoing packets to
an NFQUEUE queue (iptables) and runs this program inside the host to give their verdicts:
each packet is accepted `--delay-ms` after it arrived, or dropped with probability
`--loss-pct` / 100. It speaks nfnetlink_queue directly (no library), prints `ready` once it
is bound, and runs until killed; the kernel drops what it still holds when it exits.

Run as: python netem.py --queue N --delay-ms MS [--loss-pct PCT]
"""

from __future__ import annotations

import argparse
import collections
import errno
import random
import select
import socket
import struct
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NF_DROP = 0
NF_ACCEPT = 1

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_NLATTR = struct.Struct("=HH")  # length, type


def _attr(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _message(msg_type: int, flags: int, queue: int, attrs: bytes, seq: int = 0) -> bytes:
    # nfgenmsg: family, version, resource id (the queue number, big-endian).
    body = struct.pack("=BB", socket.AF_INET, 0) + struct.pack("!H", queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, flags, seq, 0) + body


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    """The (type, payload) of each netlink message in one datagram."""
    found = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, msg_type, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        found.append((msg_type, data[offset + _NLMSGHDR.size : offset + length]))
        offset += (length + 3) & ~3
    return found


def _packet_id(payload: bytes) -> int | None:
    """The packet id in an NFQNL_MSG_PACKET payload (after its 4-byte nfgenmsg)."""
    offset = 4
    while offset + _NLATTR.size <= len(payload):
        length, kind = _NLATTR.unpack_from(payload, offset)
        if length < _NLATTR.size:
            return None
        if kind & 0x3FFF == NFQA_PACKET_HDR:
            return int(struct.unpack_from("!I", payload, offset + _NLATTR.size)[0])
        offset += (length + 3) & ~3
    return None


class Queue:
    """One bound NFQUEUE queue: receives packet ids and sends verdicts."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((0, 0))
        command = struct.pack("=BB", NFQNL_CFG_CMD_BIND, 0) + struct.pack("!H", socket.AF_INET)
        self._configure(_attr(NFQA_CFG_CMD, command), seq=1)
        # Metadata only: a verdict needs the packet's id, never its bytes.
        self._configure(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)), seq=2)

    def _configure(self, attrs: bytes, seq: int) -> None:
        msg_type = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG
        self.sock.send(_message(msg_type, NLM_F_REQUEST | NLM_F_ACK, self.number, attrs, seq))
        for kind, payload in _messages(self.sock.recv(65536)):
            if kind == NLMSG_ERROR:
                (error,) = struct.unpack_from("=i", payload)
                if error:
                    raise OSError(-error, f"nfqueue config {seq}: {errno.errorcode.get(-error)}")

    def packet_ids(self) -> list[int]:
        """The ids of the packets in one read (possibly none)."""
        try:
            data = self.sock.recv(1 << 16)
        except OSError as error:
            if error.errno == errno.ENOBUFS:  # the kernel dropped some: keep going
                return []
            raise
        ids = []
        for kind, payload in _messages(data):
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                packet_id = _packet_id(payload)
                if packet_id is not None:
                    ids.append(packet_id)
        return ids

    def verdict(self, packet_id: int, verdict: int) -> None:
        attrs = _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id))
        msg_type = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT
        self.sock.send(_message(msg_type, NLM_F_REQUEST, self.number, attrs))


def serve(queue: Queue, delay_s: float, loss: float) -> None:
    """Releases each packet `delay_s` after it arrived, in arrival order, dropping a share."""
    held: collections.deque[tuple[float, int]] = collections.deque()
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        readable, _, _ = select.select([queue.sock], [], [], timeout)
        if readable:
            now = time.monotonic()
            for packet_id in queue.packet_ids():
                if random.random() < loss:
                    queue.verdict(packet_id, NF_DROP)
                else:
                    held.append((now + delay_s, packet_id))
        now = time.monotonic()
        while held and held[0][0] <= now:
            queue.verdict(held.popleft()[1], NF_ACCEPT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queue", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--loss-pct", type=float, default=0.0)
    args = parser.parse_args()
    queue = Queue(args.queue)
    print("ready", flush=True)
    serve(queue, args.delay_ms / 1000.0, args.loss_pct / 100.0)


if __name__ == "__main__":
    main()
