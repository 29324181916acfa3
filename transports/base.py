"""The one interface every transport implements: Transport → Connection → Stream (asyncio).

A Transport listens and dials; a Connection is authenticated to one PeerId and carries many
Streams; a Stream is a reliable, ordered, flow-controlled byte pipe with half-close and reset.
Everything here runs on the node loop; nothing is thread-safe by design.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica.errors import StreamClosed
from lattica.logging import get_logger

log = get_logger("lattica.transport")

__all__ = ["Stream", "Connection", "Listener", "Transport", "StreamHandler", "ConnectionHandler"]


class Stream(abc.ABC):
    """A bidirectional byte stream inside a connection."""

    __slots__ = ()
    stream_id: int

    @abc.abstractmethod
    async def read(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` once the peer closed its side. Raises StreamReset."""

    async def readexactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; raises StreamClosed if the peer ends the stream first."""
        chunks = []
        while n > 0:
            chunk = await self.read(n)
            if not chunk:
                raise StreamClosed(f"stream ended {n} bytes short")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    @abc.abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` for sending (never blocks); pair with ``await drain()`` for backpressure."""

    @abc.abstractmethod
    async def drain(self) -> None:
        """Wait until the queued data is within the peer's flow-control window."""

    @abc.abstractmethod
    def write_buffer_size(self) -> int:
        """Bytes written to this stream and not yet handed to the network (or acknowledged)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Half-close: send everything queued, then end our side. Reading stays possible."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Abort both directions at once; the peer sees StreamReset."""

    @property
    def aborted(self) -> bool:
        """The stream was reset, by either side, or its connection is gone: nothing more comes
        or goes on it (what waits to serve it may give up)."""
        return False

    async def write_all(self, data: bytes | bytearray | memoryview) -> None:
        self.write(data)
        await self.drain()


StreamHandler = Callable[[Stream], None]
# Asked for up to ``n`` stream opens by a peer: how many it may make now (charged), and when
# none, the seconds until it may make one.
OpenGate = Callable[[int], "tuple[int, float]"]


class Connection(abc.ABC):
    """An authenticated, multiplexed connection to one peer."""

    transport: str  # "tcp" | "quic" | "memory"
    direction: str  # "inbound" | "outbound"
    local_peer: PeerId
    remote_peer: PeerId
    local_addr: Multiaddr
    remote_addr: Multiaddr  # the peer's transport address as seen by us (no /p2p suffix)
    # True once either side closed the connection on purpose (we called close(), or the peer said
    # goodbye); False when it was lost (reset, EOF without goodbye, timeout, protocol error)
    ended_cleanly: bool = False
    # what the peer said of itself inside the handshake (its identify), when both sides sent theirs
    # there: the peer then read ours too, and neither needs to say it again on a stream
    early_data: bytes | None = None
    # we already told the peer who we are (in the handshake, or on a stream before it ended)
    said_early: bool = False
    # a relayed connection carried inside a stream: the connection to the relay that stream is on
    # (when that one goes away, so does this one, before its grace period would cut it)
    carrier: Connection | None = None
    # called once, on the loop, when the connection starts going away (see ``go_away``), whichever
    # side began it; set by the connection's owner
    on_going_away: Callable[[Connection], None] | None = None
    # a circuit a libp2p relay limits: (seconds, bytes each way; 0: no limit). It carries what
    # coordinates a direct path (identify, ping, DCUtR), not calls: it ends when a limit is hit
    relay_limit: tuple[int, int] | None = None
    # the peer speaks the standard libp2p stack (not a Lattica node's): its streams open with
    # multistream-select and it identifies on /ipfs/id/1.0.0
    libp2p: bool = False

    @abc.abstractmethod
    async def open_stream(self) -> Stream:
        """Open a new outbound stream. Raises StreamLimit or ConnectionClosed."""

    @abc.abstractmethod
    def set_stream_handler(self, handler: StreamHandler) -> None:
        """Called (synchronously, on the loop) for every inbound stream the peer opens."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Graceful close: tell the peer we are going away, then tear down."""

    @abc.abstractmethod
    def abort(self, reason: str) -> None:
        """Close immediately (no goodbye); open streams see ConnectionClosed."""

    @abc.abstractmethod
    def go_away(self) -> None:
        """Retire the connection gently: open no new stream on it and tell the peer, who then
        does the same; streams already open go on, and once both sides have said so and every
        stream has ended, the connection closes by itself (``close`` ends it sooner). When the
        peer says it first, we answer in kind at once. Streams the peer opened before it heard
        us are still taken: nothing in flight is refused."""

    @property
    @abc.abstractmethod
    def going_away(self) -> bool:
        """True once either side said ``go_away``: no new stream may be opened here."""

    _told_away = False  # on_going_away was called

    def _went_away(self) -> None:
        """Either side said go-away: tell the owner once, and close if nothing is left."""
        if not self._told_away:
            self._told_away = True
            if self.on_going_away is not None:
                self.on_going_away(self)
        self._close_if_drained()

    @abc.abstractmethod
    def _close_if_drained(self) -> None:
        """Close (gently) once both sides said go-away and no stream is left."""

    @property
    @abc.abstractmethod
    def is_closed(self) -> bool: ...

    @property
    @abc.abstractmethod
    def num_streams(self) -> int:
        """Streams currently open on this connection (for idle detection and limits)."""

    @abc.abstractmethod
    def add_close_callback(self, cb: Callable[[Connection], None]) -> None:
        """Call ``cb(conn)`` once, on the loop, when the connection closes for any reason."""

    @abc.abstractmethod
    async def wait_closed(self) -> None: ...

    @property
    def last_received(self) -> float | None:
        """Loop time at which bytes from the peer last arrived (None: not tracked)."""
        return None

    def path_stats(self) -> dict[str, float] | None:
        """What the transport measures of the path, read when asked: ``rtt_ms`` and, where known,
        ``bytes_sent`` / ``bytes_received`` (None: it measures nothing)."""
        return None

    def meter_opens(self, gate: OpenGate) -> bool:
        """Let the peer open streams only as ``gate`` allows, holding the rest of its bytes
        unread meanwhile (flow control then slows it at no cost to us). False: this transport
        cannot, and its owner checks each inbound stream itself."""
        return False

    @property
    def peer_streams(self) -> int:
        """Streams the peer opened that are open now (transports that cannot tell: all)."""
        return self.num_streams

    @property
    def opens_granted(self) -> int:
        """Streams a metered peer may still open without asking the gate (0: not metered)."""
        return 0

    def widen_windows(self) -> None:
        """The peer is trusted now (a member): the streams it opens get this transport's full
        receive window, not only the protocol's minimum (transports without the difference
        ignore it)."""

    def probe(self, timeout: float) -> None:
        """Make sure the peer still answers: without any answer within ``timeout`` s the
        connection is dead (a NAT forgot it, the peer froze) and is aborted. Transports that
        notice this on their own (QUIC follows address changes) need not do anything."""


PROBE_TIMEOUT = 5.0  # seconds a probed connection has to answer
GOAWAY_ANSWER = 5.0  # seconds a peer has to answer our go-away with its own (then it is taken as said)


ConnectionHandler = Callable[[Connection], None]


class Listener(abc.ABC):
    addrs: list[Multiaddr]  # actually bound addresses (port 0 resolved), no /p2p suffix

    @abc.abstractmethod
    async def close(self) -> None: ...


class Transport(abc.ABC):
    """Listens and dials one family of addresses; every connection it makes is authenticated."""

    name: str

    def __init__(self, keypair: KeyPair) -> None:
        self.keypair = keypair
        self._listeners: list[Listener] = []
        self._conns: set[Connection] = set()  # every live connection, for close()
        # what to say of ourselves inside a handshake, for a peer at the given address (the host's
        # identify: see Connection.early_data); None: nothing, the host says it on a stream later
        self.early_data: Callable[[Multiaddr], bytes | None] | None = None
        # the connections' owner meters the peer's stream opens (Connection.meter_opens): a
        # connection holds them from its first byte until it is given its gate (a node's
        # transports; a bare transport's connections take every open as it comes)
        self.hold_opens = False
        # the streams a peer opens get only a small receive window until the owner trusts the
        # peer (Connection.widen_windows): what a stranger's unread bytes pin stays small
        self.narrow_windows = False
        # called with a connection that carries streams before its handshake ends (a QUIC
        # server's half-round-trip data), so the host can say who we are on it at once
        self.early_push: Callable[[Connection], None] | None = None
        # called with (this transport's name, the remote IP) when a peer's dial reaches one of our
        # listeners, before its handshake: an AutoNAT v1 dial-back is a bare connection that its
        # dialer may close before it is up here, and its arrival is what proves us reachable
        self.dialed_in: Callable[[str, str], None] | None = None

    def note_dialed_in(self, ip: str) -> None:
        """Tell ``dialed_in`` (if set) that a dial from ``ip`` reached one of our listeners."""
        if self.dialed_in is not None:
            try:
                self.dialed_in(self.name, ip)
            except Exception:
                log.error("dialed_in callback failed", exc_info=True)

    @property
    def listening(self) -> bool:
        """True while at least one of this transport's listeners is open."""
        return bool(self._listeners)

    def _track(self, conn: Connection) -> None:
        self._conns.add(conn)
        conn.add_close_callback(self._conns.discard)

    @staticmethod
    def _hand_over(conn: Connection, on_connection: ConnectionHandler) -> None:
        """Give an inbound connection to its listener's owner; a failing handler loses only it."""
        try:
            on_connection(conn)
        except Exception as e:
            log.error("connection handler failed", peer=str(conn.remote_peer), exc_info=True)
            conn.abort(f"connection handler failed: {e}")

    @abc.abstractmethod
    def handles(self, addr: Multiaddr) -> bool:
        """True if this transport can listen on / dial ``addr``."""

    @abc.abstractmethod
    async def listen(self, addr: Multiaddr, on_connection: ConnectionHandler) -> Listener:
        """Bind ``addr``; ``on_connection`` is called on the loop for every authenticated inbound
        connection, before any of its streams is delivered."""

    @abc.abstractmethod
    async def dial(self, addr: Multiaddr, peer_id: PeerId | None = None) -> Connection:
        """Connect and authenticate. If ``peer_id`` is given and the remote key does not match it,
        raise PeerIdMismatch."""

    async def close(self) -> None:
        """Close listeners and every connection this transport made."""
        for listener in self._listeners:
            await listener.close()
        self._listeners.clear()
        for conn in list(self._conns):
            conn.abort("transport closed")
