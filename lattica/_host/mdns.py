"""mDNS discovery on the local network, as libp2p does it.

Nodes on one LAN find each other with no bootstrap address: a node multicasts a DNS question for
``_p2p._udp.local`` (PTR); every node that hears it answers with a PTR record naming itself and TXT
records ``dnsaddr=<multiaddr>/p2p/<PeerId>``, one per listen address. Whoever hears an answer learns
the peer's addresses and dials it (the dial authenticates the PeerId; mDNS only suggests).

``MdnsProtocol`` is the sans-IO part: DNS messages in, answers and discovered peers out.
``MdnsService`` is the asyncio glue on the node loop: one UDP socket on 224.0.0.251:5353 (shared
with other responders on the host), a query at start and every ``interval`` seconds.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lattica._identity import PeerId
from lattica._interfaces import interface_ips, is_loopback
from lattica._multiaddr import Multiaddr
from lattica.errors import LatticaError, ProtocolError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._hostview import HostView

log = get_logger("lattica.host.mdns")

__all__ = ["SERVICE", "MdnsProtocol", "MdnsService", "Discovered", "build_query", "build_response", "parse"]

SERVICE = "_p2p._udp.local"
GROUP = "224.0.0.251"
PORT = 5353
_PTR, _TXT, _IN = 12, 16, 1
_HDR = struct.Struct(">HHHHHH")
_RR = struct.Struct(">HHIH")
_TTL = 120
_MAX_PACKET = 9000  # mDNS allows up to 9000 bytes; anything larger is not ours
_MAX_RECORDS = 128
_MAX_ADDRS = 32  # per peer and answer


@dataclass(frozen=True)
class Discovered:
    peer: PeerId
    addrs: tuple[Multiaddr, ...]


@dataclass(frozen=True)
class _Record:
    name: str
    rtype: int
    data: bytes  # raw rdata, or the decoded target name for PTR (utf-8)


def _name(name: str) -> bytes:
    out = bytearray()
    for label in name.split("."):
        raw = label.encode()
        if not 0 < len(raw) < 64:
            raise ValueError(f"bad DNS label in {name!r}")
        out += bytes([len(raw)]) + raw
    return bytes(out + b"\x00")


def build_query() -> bytes:
    """A question for every libp2p peer on the link."""
    return _HDR.pack(0, 0, 1, 0, 0, 0) + _name(SERVICE) + struct.pack(">HH", _PTR, _IN)


def build_response(instance: str, addrs: list[Multiaddr]) -> bytes:
    """Our answer: a PTR to ``instance`` and one ``dnsaddr=`` TXT record per address
    (each ``addrs`` entry must end in /p2p/<our PeerId>)."""
    full = f"{instance}.{SERVICE}"
    ptr = _name(full)
    out = bytearray(_HDR.pack(0, 0x8400, 0, 1, 0, len(addrs)))
    out += _name(SERVICE) + _RR.pack(_PTR, _IN, _TTL, len(ptr)) + ptr
    for a in addrs:
        txt = f"dnsaddr={a}".encode()
        if len(txt) > 255:
            continue
        rdata = bytes([len(txt)]) + txt
        out += _name(full) + _RR.pack(_TXT, _IN, _TTL, len(rdata)) + rdata
    return bytes(out)


def _read_name(buf: bytes, pos: int) -> tuple[str, int]:
    """A (possibly compressed) name at ``pos``; returns it and the position after it."""
    labels: list[str] = []
    end = None
    jumps = 0
    while True:
        if pos >= len(buf):
            raise ProtocolError("DNS name runs past the packet")
        n = buf[pos]
        if n & 0xC0 == 0xC0:
            if pos + 1 >= len(buf):
                raise ProtocolError("DNS name pointer runs past the packet")
            if end is None:
                end = pos + 2
            jumps += 1
            if jumps > 16:
                raise ProtocolError("DNS name pointers loop")
            pos = ((n & 0x3F) << 8) | buf[pos + 1]
            continue
        if n & 0xC0:
            raise ProtocolError("DNS name with a reserved label type")
        if n == 0:
            return ".".join(labels), (end if end is not None else pos + 1)
        label = buf[pos + 1 : pos + 1 + n]
        if len(label) != n:
            raise ProtocolError("DNS label runs past the packet")
        labels.append(label.decode("utf-8", "replace"))
        if len(labels) > 64:
            raise ProtocolError("DNS name with too many labels")
        pos += 1 + n


def parse(packet: bytes) -> tuple[bool, list[tuple[str, int]], list[_Record]]:
    """``(is_response, questions, records)`` of a DNS message; raises ProtocolError."""
    if len(packet) > _MAX_PACKET:
        raise ProtocolError("mDNS packet too large")
    if len(packet) < _HDR.size:
        raise ProtocolError("mDNS packet shorter than its header")
    _, flags, qd, an, ns, ar = _HDR.unpack_from(packet)
    if qd + an + ns + ar > _MAX_RECORDS:
        raise ProtocolError("mDNS packet with too many records")
    pos = _HDR.size
    questions = []
    for _ in range(qd):
        name, pos = _read_name(packet, pos)
        if pos + 4 > len(packet):
            raise ProtocolError("DNS question runs past the packet")
        qtype, _qclass = struct.unpack_from(">HH", packet, pos)
        pos += 4
        questions.append((name.lower(), qtype))
    records = []
    for _ in range(an + ns + ar):
        name, pos = _read_name(packet, pos)
        if pos + _RR.size > len(packet):
            raise ProtocolError("DNS record runs past the packet")
        rtype, _rclass, _ttl, rdlen = _RR.unpack_from(packet, pos)
        pos += _RR.size
        if pos + rdlen > len(packet):
            raise ProtocolError("DNS record data runs past the packet")
        if rtype == _PTR:
            target, _ = _read_name(packet, pos)
            records.append(_Record(name.lower(), rtype, target.encode()))
        elif rtype == _TXT:
            records.append(_Record(name.lower(), rtype, packet[pos : pos + rdlen]))
        pos += rdlen
    return bool(flags & 0x8000), questions, records


def _txt_strings(rdata: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(rdata):
        n = rdata[pos]
        out.append(rdata[pos + 1 : pos + 1 + n])
        pos += 1 + n
    return out


class MdnsProtocol:
    """Our side of libp2p mDNS, without sockets: feed packets, get answers and peers."""

    def __init__(self, peer_id: PeerId, instance: str | None = None) -> None:
        self.peer_id = peer_id
        self.instance = instance or os.urandom(16).hex()  # a random name, as libp2p does: no PeerId leak in the PTR

    def query(self) -> bytes:
        return build_query()

    def receive(self, packet: bytes, addrs: list[Multiaddr]) -> tuple[bytes | None, list[Discovered]]:
        """``(answer to send or None, peers found)`` for one received packet; ``addrs`` are ours
        (dialable, each ending in /p2p/<our id>). Raises ProtocolError for a malformed packet."""
        is_response, questions, records = parse(packet)
        if not is_response:
            asked = any(name == SERVICE and qtype in (_PTR, 255) for name, qtype in questions)
            return (build_response(self.instance, addrs) if asked and addrs else None), []
        instances = {r.data.decode().lower() for r in records if r.rtype == _PTR and r.name == SERVICE}
        found: dict[PeerId, list[Multiaddr]] = {}
        for r in records:
            if r.rtype != _TXT or r.name not in instances:
                continue
            for s in _txt_strings(r.data):
                if not s.startswith(b"dnsaddr="):
                    continue
                try:
                    addr = Multiaddr(s[8:].decode())
                except (LatticaError, UnicodeDecodeError, ValueError):
                    continue
                peer = addr.peer_id
                if peer is None or peer == self.peer_id:
                    continue
                lst = found.setdefault(peer, [])
                if len(lst) < _MAX_ADDRS:
                    lst.append(addr.without_peer_id())
        return None, [Discovered(p, tuple(a)) for p, a in found.items()]


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, service: MdnsService) -> None:
        self.service = service

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.service._received(data)

    def error_received(self, exc: Exception) -> None:
        log.debug("mdns socket error", reason=str(exc))


class MdnsService:
    """Runs ``MdnsProtocol`` on the node loop and dials the peers it finds."""

    def __init__(self, host: HostView, interval: float = 60.0, port: int = PORT) -> None:
        self.host: HostView = host
        self.proto = MdnsProtocol(host.peer_id)
        self.interval = interval
        self.port = port
        self.transport: asyncio.DatagramTransport | None = None
        self.found: dict[PeerId, float] = {}  # peer -> when we last tried to dial it
        self._last_answer = 0.0
        self._task: asyncio.Task | None = None

    async def astart(self) -> None:
        """The node listens: start (mDNS stays off, logged, where the socket cannot be opened)."""
        await self.start()

    async def aclose(self) -> None:
        """Stop querying and answering before the node's connections close."""
        self.close()

    async def start(self) -> bool:
        """Open the socket and start querying; False (logged) if this host cannot do mDNS."""
        try:
            sock = self._socket()
        except OSError as e:
            log.info("mdns off: cannot open the multicast socket", reason=e.strerror or str(e))
            return False
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(self), sock=sock)
        self._task = self.host.spawn(self._query_loop())
        return True

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("", self.port))
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)  # nodes on one host see each other
            joined = 0
            for ip in interface_ips(4):
                if ip.startswith("127."):
                    continue
                try:
                    sock.setsockopt(
                        socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(GROUP) + socket.inet_aton(ip)
                    )
                    joined += 1
                except OSError:
                    continue  # an interface without multicast
            if not joined:
                raise OSError("no interface could join the mDNS group")
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _addrs(self) -> list[Multiaddr]:
        return [
            a.with_peer_id(self.host.peer_id) for a in self.host.listen_addrs if not a.is_circuit and not is_loopback(a)
        ]

    async def _query_loop(self) -> None:
        delays = [0.0, 1.0, 2.0]  # a short burst at start (packets get lost), then every interval
        while True:
            await asyncio.sleep(delays.pop(0) if delays else self.interval)
            self._send(self.proto.query())

    def _send(self, packet: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(packet, (GROUP, self.port))

    def _received(self, packet: bytes) -> None:
        try:
            answer, found = self.proto.receive(packet, self._addrs())
        except ProtocolError as e:
            log.debug("ignoring a malformed mDNS packet", reason=str(e))
            return
        now = self.host.loop.time()
        if answer is not None and now - self._last_answer >= 0.5:  # one answer per burst of questions
            self._last_answer = now
            self._send(answer)
        for d in found:
            self._found(d, now)

    def _found(self, d: Discovered, now: float) -> None:
        self.host.remember_addrs(d.peer, list(d.addrs))
        if d.peer in self.host.conns or now - self.found.get(d.peer, -1e9) < 30.0:
            return
        self.found[d.peer] = now
        if len(self.found) > 1024:
            del self.found[next(iter(self.found))]
        log.debug("mdns found a peer", peer=str(d.peer), addrs=[str(a) for a in d.addrs])
        self.host.spawn(self._dial(d))

    async def _dial(self, d: Discovered) -> None:
        try:
            await self.host.get_connection(d.peer)
        except LatticaError as e:
            log.debug("mdns peer not reachable", peer=str(d.peer), reason=str(e))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.close()
