"""QUIC's constants (ALPN, versions, error codes, socket and batch sizes) and UDP address
helpers shared by the other modules."""

from __future__ import annotations

import datetime
import ipaddress
import socket

from aioquic.buffer import Buffer, BufferReadError
from aioquic.quic.configuration import QuicConfiguration

from lattica._multiaddr import Multiaddr
from lattica.errors import (
    MultiaddrError,
)

ALPN = "libp2p"  # what a libp2p peer offers and accepts: the standard stack
LATTICA_ALPN = "lattica"  # offered first, between Lattica nodes: our stream headers and identify
ALPNS = (LATTICA_ALPN, ALPN)  # our preference, as client and as server
CID_LEN = 8
SUPPORTED_VERSIONS = frozenset(QuicConfiguration(is_client=False).supported_versions)  # v1, v2
MIN_INITIAL = 1200  # RFC 9000 14.1: a client Initial datagram is at least this large
ERR_NO_ERROR = 0x0
ERR_INTERNAL = 0x1
ERR_BAD_CERTIFICATE = 0x100 + 42  # CRYPTO_ERROR + TLS bad_certificate alert (RFC 9001 4.8)
FRAME_CRYPTO = 0x06
SOCK_BUF = 4 * 1024 * 1024
# a connection's receive window (MAX_DATA) while its peer is not trusted (Transport.narrow_windows):
# what a stranger's unread bytes may pin of ours on one connection, whatever its streams' windows
NARROW_WINDOW = 1024 * 1024


RECVERR_V4 = 11  # <linux/in.h>; not exported by the socket module


RECVERR_V6 = 25  # <linux/in6.h>
CERT_RENEW_BEFORE = datetime.timedelta(days=1)
MAX_DATAGRAM = 65000  # under the 65,507-byte UDP payload limit of IPv4
GSO_SEGMENTS = 64  # datagrams one GSO send carries at most (the kernel's UDP_MAX_SEGMENTS since 4.18)
READ_BATCH = 63  # extra datagrams read per readiness event
READ_BATCH_BYTES = 1 << 20  # ... and at most about this many bytes (acks and credit go out after a batch)
RECV_SIZE = 65535
# Each side may open one unidirectional stream, its control stream: a Lattica extension (libp2p
# uses bidirectional streams only). It carries one message and ends: GOAWAY, then how many
# bidirectional streams the sender opened (a QUIC varint): it opens no more, and the receiver
# knows which of its streams are still on their way (QUIC does not order streams between them).
CONTROL_GOAWAY = 0x00
MAX_CONTROL = 16


def encode_goaway(opened: int) -> bytes:
    buf = Buffer(capacity=MAX_CONTROL)
    buf.push_uint8(CONTROL_GOAWAY)
    buf.push_uint_var(opened)
    return buf.data


def decode_goaway(data: bytes) -> int | None:
    """The stream count of a control stream's GOAWAY; None if it is not one."""
    try:
        buf = Buffer(data=data)
        if buf.pull_uint8() != CONTROL_GOAWAY:
            return None
        opened = buf.pull_uint_var()
    except BufferReadError:
        return None
    return opened if buf.eof() else None


def split_addr(addr: Multiaddr) -> tuple[str, int, socket.AddressFamily]:
    """(ip, port, family) of ``/ip4|ip6/<ip>/udp/<port>/quic-v1[/p2p/..]``."""
    protos = addr.protocols()
    if protos and protos[-1] == "p2p":
        protos = protos[:-1]
    if protos not in (["ip4", "udp", "quic-v1"], ["ip6", "udp", "quic-v1"]):
        raise MultiaddrError(f"not a QUIC address: {addr}")
    host, port = addr.host_port()
    ip = ipaddress.ip_address(host)
    return str(ip), port, socket.AF_INET6 if ip.version == 6 else socket.AF_INET


def sockaddr(ip: str, port: int, family: socket.AddressFamily) -> tuple:
    # recvfrom on an AF_INET6 socket yields 4-tuples; aioquic compares peer addresses for
    # equality, so a dialed address must have the same shape.
    return (ip, port, 0, 0) if family == socket.AF_INET6 else (ip, port)
