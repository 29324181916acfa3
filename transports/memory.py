"""In-memory transport: hundreds of nodes in one process, for tests and simulations.

Addresses are ``/memory/<n>``. Connections run the real multiplexer over an in-process byte pipe,
so stream semantics (credit windows, half-close, reset) are exactly those of TCP; only Noise is left
out, since both ends share one process and the registry hands each side the other's PeerId. All
nodes using one registry must run on the same event loop.
"""

from __future__ import annotations

import asyncio
import itertools

from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica.errors import PeerIdMismatch, PeerUnreachable, TransportError
from lattica.transports.base import Connection, ConnectionHandler, Listener, Transport
from lattica.transports.mux import MuxConfig
from lattica.transports.muxed import MuxedConnection

__all__ = ["MemoryTransport", "MemoryNetwork"]


class MemoryNetwork:
    """A registry of listening in-memory transports: one simulated network."""

    def __init__(self) -> None:
        self._listeners: dict[int, tuple[MemoryTransport, ConnectionHandler, asyncio.AbstractEventLoop]] = {}
        self._ports = itertools.count(1)
        self._side: dict[PeerId, int] = {}  # while partitioned: each peer's side
        self._pipes: list[
            tuple[_Pipe, _Pipe, PeerId, PeerId]
        ] = []  # open connections (dialer's end, listener's, their peers)
        self._prune_at = 64  # forget closed ones when this many are listed (twice the open ones after)

    def partition(self, sides: list[set[PeerId]]) -> None:
        """Cut the network into ``sides``: connections between two sides are lost and dials
        across fail until :meth:`heal` (a peer in no side is cut off from everyone)."""
        self._side = {p: i for i, side in enumerate(sides) for p in side}
        live = []
        for a, b, pa, pb in self._pipes:
            if a.is_closing() or b.is_closing():
                continue
            if self.cut(pa, pb):
                a.close()
                b.close()
            else:
                live.append((a, b, pa, pb))
        self._pipes = live

    def add_pipe(self, mine: _Pipe, theirs: _Pipe, a: PeerId, b: PeerId) -> None:
        """List a new connection (for :meth:`partition`); closed ones are forgotten as it grows,
        so a network outlives its connections without holding them (amortized: the list is
        pruned when it doubles)."""
        if len(self._pipes) >= self._prune_at:
            self._pipes = [t for t in self._pipes if not (t[0].is_closing() or t[1].is_closing())]
            self._prune_at = max(64, 2 * len(self._pipes))
        self._pipes.append((mine, theirs, a, b))

    def heal(self) -> None:
        """End the partition: every peer may dial every other again."""
        self._side = {}

    def cut(self, a: PeerId, b: PeerId) -> bool:
        """Whether the partition separates ``a`` and ``b``."""
        return bool(self._side) and self._side.get(a, -1) != self._side.get(b, -2)

    def _bind(self, port: int, transport: MemoryTransport, handler: ConnectionHandler) -> int:
        if port == 0:
            port = next(self._ports)
            while port in self._listeners:
                port = next(self._ports)
        if port in self._listeners:
            raise TransportError(f"/memory/{port} is already in use")
        self._listeners[port] = (transport, handler, asyncio.get_running_loop())
        return port


DEFAULT_NETWORK = MemoryNetwork()


class _Pipe:
    """One direction of an in-memory connection; delivers on the next loop iteration."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.peer: _Pipe | None = None
        self.conn: MuxedConnection | None = None
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.peer is None:
            return
        self._loop.call_soon(self.peer._deliver, bytes(data))

    def _deliver(self, data: bytes) -> None:
        if not self._closing and self.conn is not None:
            self.conn.data_received(data)

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            peer = self.peer
            if peer is not None:
                self._loop.call_soon(peer._lost)

    abort = close

    def _lost(self) -> None:
        self._closing = True
        if self.conn is not None:
            self.conn.connection_lost(None)

    def is_closing(self) -> bool:
        return self._closing

    def get_write_buffer_size(self) -> int:
        return 0  # delivery is immediate; the mux windows bound what is in flight


class _MemoryListener(Listener):
    def __init__(self, network: MemoryNetwork, port: int) -> None:
        self._network = network
        self._port = port
        self.addrs = [Multiaddr(f"/memory/{port}")]

    async def close(self) -> None:
        self._network._listeners.pop(self._port, None)


class MemoryTransport(Transport):
    name = "memory"

    def __init__(
        self,
        keypair: KeyPair,
        *,
        network: MemoryNetwork | None = None,
        mux_config: MuxConfig | None = None,
        keepalive_interval: float = 0.0,
    ) -> None:
        super().__init__(keypair)
        self.network = network or DEFAULT_NETWORK
        self.mux_config = mux_config or MuxConfig(window=256 * 1024)
        self.keepalive_interval = keepalive_interval
        self._dial_ports = itertools.count(1 << 32)

    def handles(self, addr: Multiaddr) -> bool:
        return addr.without_peer_id().protocols() == ["memory"]

    async def listen(self, addr: Multiaddr, on_connection: ConnectionHandler) -> Listener:
        port = self.network._bind(int(addr.value_for("memory") or 0), self, on_connection)
        listener = _MemoryListener(self.network, port)
        self._listeners.append(listener)
        return listener

    def _connection(
        self, pipe: _Pipe, direction: str, remote: PeerId, local_addr: Multiaddr, remote_addr: Multiaddr
    ) -> MuxedConnection:
        conn = MuxedConnection(
            pipe,
            transport="memory",
            direction=direction,
            local_peer=self.keypair.peer_id,
            remote_peer=remote,
            local_addr=local_addr,
            remote_addr=remote_addr,
            session=None,
            mux_config=self.mux_config,
            keepalive_interval=self.keepalive_interval,
        )
        pipe.conn = conn
        self._track(conn)
        return conn

    async def dial(self, addr: Multiaddr, peer_id: PeerId | None = None) -> Connection:
        port = int(addr.without_peer_id().value_for("memory") or 0)
        entry = self.network._listeners.get(port)
        if entry is None:
            raise PeerUnreachable(f"nothing listens on {addr}")
        remote, on_connection, remote_loop = entry
        if remote_loop is not asyncio.get_running_loop():
            raise TransportError(f"{addr} is served on another event loop; memory nodes must share the same event loop")
        expected = peer_id or addr.peer_id
        if expected is not None and remote.keypair.peer_id != expected:
            raise PeerIdMismatch(f"dialed {expected} but {addr} belongs to {remote.keypair.peer_id}")
        if self.network.cut(self.keypair.peer_id, remote.keypair.peer_id):
            raise PeerUnreachable(f"{addr} is on the other side of the partition")
        loop = asyncio.get_running_loop()
        mine, theirs = _Pipe(loop), _Pipe(loop)
        mine.peer, theirs.peer = theirs, mine
        listen_addr = Multiaddr(f"/memory/{port}")
        dial_addr = Multiaddr(f"/memory/{next(self._dial_ports)}")
        conn = self._connection(mine, "outbound", remote.keypair.peer_id, dial_addr, listen_addr)
        inbound = remote._connection(theirs, "inbound", self.keypair.peer_id, listen_addr, dial_addr)
        self.network.add_pipe(mine, theirs, self.keypair.peer_id, remote.keypair.peer_id)
        self._hand_over(inbound, on_connection)  # the listener's bug must not surface in the dialer
        return conn
