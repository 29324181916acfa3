"""The client side of libp2p AutoNAT v1 (libp2p/specs ``autonat/autonat-v1.md``), sans-IO.

Older libp2p nodes (go-libp2p before 0.36, the hivemind daemon's included, and IPFS peers of
that age) serve only v1: we send ``Dial{peer{our id, addrs}}`` and the server dials us back at
those addresses on the IP our connection comes from (and at the address it observes), then
answers ``OK`` with the address that worked or ``E_DIAL_ERROR``. v1 has no nonce: the dial-back
is a bare connection from a throw-away identity, which it may close before the handshake is over
on our side. So, as with v2, what counts is what arrives: an ``OK`` is believed only when a dial
from the server's IP, over the transport of the address it names, reached our listener while the
request was open (a TCP connection accepted, a QUIC Initial that decrypted: packets from that IP
get through to us there), and only for an address we asked about
(so a server cannot have us advertise an address of its choosing). A server that says it could
not connect is a failed try; anything else proves nothing.
"""

from __future__ import annotations

from lattica._multiaddr import Multiaddr
from lattica.errors import ProtocolError
from lattica.nat import _autonat_v1_wire as v1
from lattica.nat._autonat_v2_client import Outcome, Verdict
from lattica.nat._autonat_v2_wire import transport_of

__all__ = ["V1Request"]

_MAX_ARRIVALS = 4  # connections from the server's IP kept per request


class V1Request:
    """One ``Dial`` to a v1 server at ``server_ip``, from what we send to what it proves."""

    def __init__(self, peer_id: bytes, addrs: tuple[Multiaddr, ...], server_ip: str) -> None:
        if not addrs:
            raise ProtocolError("no address of ours is worth asking this server about")
        self.peer_id = peer_id
        self.addrs = tuple(a.without_peer_id() for a in addrs[: v1.MAX_ADDRS])
        self.server_ip = server_ip
        self.response: v1.DialResponse | None = None
        self.arrivals: list[str] = []  # transports of the dials from the server's IP that reached us

    def opening(self) -> bytes:
        """The one message we send: our ``Dial``."""
        return v1.encode(v1.Dial(self.peer_id, self.addrs))

    @property
    def answered(self) -> bool:
        return self.response is not None

    def receive(self, msg: v1.Message) -> list[bytes]:
        """The server's message (nothing to send back); ProtocolError unless it is its (first)
        ``DialResponse``."""
        if self.response is not None:
            raise ProtocolError("an AutoNAT v1 server went on after its DialResponse")
        if not isinstance(msg, v1.DialResponse):
            raise ProtocolError("an AutoNAT v1 server sent a Dial")
        self.response = msg
        return []

    def dialed_in(self, transport: str, ip: str) -> bool:
        """A dial reached one of our listeners while the request was open: one from the server's
        IP over TCP or QUIC counts as a dial-back (True)."""
        if ip == self.server_ip and transport in ("tcp", "quic") and len(self.arrivals) < _MAX_ARRIVALS:
            self.arrivals.append(transport)
            return True
        return False

    def _named(self) -> Multiaddr | None:
        r = self.response
        if r is None or r.status != v1.Status.OK or r.addr is None:
            return None
        addr = r.addr.without_peer_id()
        return addr if addr in self.addrs else None

    def awaits_dial_back(self) -> bool:
        """The server says it got through at an address of ours and no dial of its has reached us
        yet (its packets may trail its answer)."""
        addr = self._named()
        return addr is not None and transport_of(addr) not in self.arrivals

    def verdict(self, failure: str | None = None) -> Verdict:
        if failure is not None:
            return Verdict(Outcome.NOTHING, reason=f"abandoned: {failure}")
        r = self.response
        if r is None:
            return Verdict(Outcome.NOTHING, reason="no answer")
        if r.status == v1.Status.E_DIAL_ERROR:
            return Verdict(Outcome.FAILED, self.addrs[0], reason=f"the server could not connect ({r.text})")
        if r.status != v1.Status.OK:
            return Verdict(Outcome.NOTHING, reason=f"the server did not check us ({r.status.name}: {r.text})")
        addr = self._named()
        if addr is None:
            return Verdict(Outcome.NOTHING, reason="an answer that names no address we asked about")
        if transport_of(addr) in self.arrivals:
            return Verdict(Outcome.REACHED, addr, self.server_ip, transport_of(addr) or "", "its dial-back arrived")
        return Verdict(Outcome.NOTHING, addr, reason="the server says it dialed us back, but no connection came")
