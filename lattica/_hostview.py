"""What a system service may see and do of its node's host: the narrow, typed :class:`HostView`
and the :class:`HostEvents` it subscribes to, instead of the host object itself.

The host implements the view; services (``lattica/services.py``) are written against it, so a new
service knows from this one module everything the node offers it, and the host can change
inside without touching them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._identify import PeerInfo
    from lattica._identity import KeyPair, PeerId
    from lattica._multiaddr import Multiaddr
    from lattica.nat._manager import NatManager
    from lattica.transports.base import Connection, Stream, Transport
    from lattica.trust import Trust

__all__ = ["Signal", "HostEvents", "HostView"]

log = get_logger("lattica.hostview")


class Signal:
    """One kind of event: subscribers are called in order with the event's arguments; one that
    raises is logged and the others still run."""

    __slots__ = ("name", "_subscribers")

    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: list[Callable[..., object]] = []

    def subscribe(self, fn: Callable[..., object]) -> Callable[[], None]:
        """Call ``fn`` on every event from now on; returns the function that unsubscribes it."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    def emit(self, *args: Any) -> None:
        for fn in tuple(self._subscribers):
            try:
                fn(*args)
            except Exception:
                log.exception("event subscriber failed", signal=self.name)


class HostEvents:
    """What happens on a node that services react to."""

    __slots__ = ("identified", "connected", "dialed_in", "disconnected", "addresses_changed", "membership_changed")

    def __init__(self) -> None:
        self.identified = Signal("identified")  # (PeerInfo): a peer told us who it is (each connection)
        self.connected = Signal("connected")  # (Connection): a new connection is in use
        self.dialed_in = Signal("dialed_in")  # (transport name, remote IP): a dial reached a listener, not yet up
        self.disconnected = Signal("disconnected")  # (PeerId, Connection): a peer's last connection closed
        self.addresses_changed = Signal("addresses_changed")  # (list[Multiaddr]): what we advertise changed
        self.membership_changed = Signal("membership_changed")  # (event): a membership verdict (up, changed, down)


class HostView(Protocol):
    """The node as a service sees it. Everything here runs on the node loop."""

    peer_id: PeerId
    keypair: KeyPair
    loop: asyncio.AbstractEventLoop
    thread_id: int  # the node loop's thread
    events: HostEvents

    @property
    def closing(self) -> bool:
        """The node is stopping: start nothing new."""

    @property
    def conns(self) -> Mapping[PeerId, Connection]:
        """The connection new streams to each peer use."""

    @property
    def conns_of(self) -> Mapping[PeerId, set[Connection]]:
        """Every live connection, by peer."""

    @property
    def info(self) -> Mapping[Connection, PeerInfo]:
        """What each identified connection's peer told us about itself."""

    @property
    def peer_addrs(self) -> Mapping[PeerId, list[Multiaddr]]:
        """The address book: where each known peer listens."""

    @property
    def trust(self) -> Trust:
        """Who is a member of our mesh: our certificates, and the rule that judges a peer's."""

    def circle_of(self, peer: PeerId) -> str:
        """What ``peer`` is to us ("self", "member" or "stranger"), from its identify."""

    def circle_reason(self, peer: PeerId) -> str:
        """Why ``peer`` is in its circle (what made it a member, or why it is a stranger)."""

    def is_admin(self, peer: PeerId) -> bool:
        """Whether ``peer`` administers our mesh (this node does), from its identify."""

    def peers(self) -> list[PeerInfo]:
        """Every connected peer, as its primary connection's identify described it."""

    async def ping(self, peer: PeerId, count: int, timeout: float) -> list[float]:
        """``count`` round trips to ``peer``, in seconds (Timeout after ``timeout``)."""

    async def peer_info(self, conn: Connection, timeout: float) -> PeerInfo | None:
        """What ``conn``'s peer told us in identify, waiting up to ``timeout`` s on a fresh one."""

    @property
    def nat(self) -> NatManager | None:
        """Our NAT situation: observed addresses, candidates to punch from, the mapping type."""

    @property
    def transports(self) -> list[Transport]:
        """The transports this node dials and listens with."""

    @property
    def listen_addrs(self) -> list[Multiaddr]:
        """Our dialable listen addresses (wildcards expanded per interface)."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``coro`` as a task the node cancels when it stops."""

    def set_handler(self, protocol: str, handler: Callable[[Stream, Connection], Awaitable[None]]) -> None:
        """Serve inbound streams of ``protocol`` with ``handler(stream, conn)``."""

    async def open_stream(self, peer: PeerId, protocol: str) -> Stream:
        """A new stream to ``peer`` (dialing it first if needed)."""

    async def open_stream_on(self, conn: Connection, protocol: str) -> Stream:
        """A new stream on this very connection."""

    async def get_connection(self, peer: PeerId, limited: bool = False) -> Connection:
        """A connection to ``peer``: the current one, else dial what we know (and the DHT); a
        libp2p relay's limited circuit only if ``limited``."""

    async def dial_addrs(self, peer: PeerId, addrs: list[Multiaddr]) -> Connection:
        """Dial ``peer`` at these addresses only, racing them; the winner is adopted."""

    def set_peer_routing(self, routing: Any) -> None:
        """Where the dialer finds a peer it has no address for (``find_peer(peer, fresh)``)."""

    def set_puncher(self, puncher: Any) -> None:
        """What punches a direct path to a relayed peer (``punch(conn)``, ``punch_tcp(conn)``)."""

    def adopt(self, conn: Connection) -> None:
        """Take a connection made outside the dialer (a hole punch) into use."""

    def transport_for(self, addr: Multiaddr) -> Transport | None:
        """The transport that dials ``addr``."""

    def tcp_transport(self) -> Any:
        """The TCP transport, or None."""

    def quic_transport(self) -> Any:
        """The QUIC transport (started on first use), or None."""

    def remember_addrs(self, peer: PeerId, addrs: Iterable[Multiaddr], hint: bool = False) -> None:
        """Add ``addrs`` to the address book entry of ``peer`` (``hint``: another peer said so:
        kept apart, dialed under a budget per destination, never passed on)."""

    def hinted_addrs(self, peer: PeerId, addrs: list[Multiaddr]) -> list[Multiaddr]:
        """Of ``addrs`` another peer gave for ``peer``, what may be dialed now (PeerUnreachable if none)."""

    def advertised_addrs(self) -> list[Multiaddr]:
        """The addresses we tell peers to reach us at."""

    def protect(self, peer: PeerId, why: str) -> None:
        """Keep connections to ``peer`` open while idle, for ``why``."""

    def unprotect(self, peer: PeerId, why: str) -> None:
        """Drop one reason to keep ``peer``'s connections open."""

    def note_contact(self, ip: str, transport: str) -> None:
        """``transport``'s listening socket just sent a packet to ``ip`` (it opens cone NAT filters)."""
