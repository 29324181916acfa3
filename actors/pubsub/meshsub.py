"""GossipSub's streams with libp2p peers (``/meshsub/1.2.0`` and ``/1.1.0``, issue 50): the
pub-sub service's router batches to and from peers that speak libp2p GossipSub instead of our
actor calls (go-, js- and rust-libp2p nodes, the Lattica SDK).

As libp2p does, each side writes its RPCs on one long-lived stream it opens (on the connection
there is: we never dial to send) and reads the other's on the stream the other opened. What we
send waits in the same bounded queue as a Lattica peer's batches (``lattica.pubsub._outbound``)
and leaves as RPCs within go's 1 MiB cap; what we read is held against the node's budget for
partly received messages, as an actor call's frames are. A stranger's RPC is charged before it
is decoded (``_decode``: its fields and ids against the strangers' share, a batch if it carries
no message; ``strangers``), and dropped undecoded beyond. Loaded with the router, at first use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from lattica._framing import write_delimited
from lattica.actors.pubsub.sending import BOUNDS
from lattica.errors import LatticaError, ProtocolError, StreamClosed
from lattica.logging import get_logger
from lattica.pubsub import _gossipsub_wire as gs
from lattica.pubsub._libp2p import Dialect, from_gossipsub, ids_read, to_gossipsub
from lattica.pubsub._outbound import Outbound

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._identity import PeerId
    from lattica._runtime.partials import PartialMessages
    from lattica.actors.pubsub.strangers import Strangers
    from lattica.config import PubSubConfig
    from lattica.pubsub._router import Rpc
    from lattica.transports.base import Connection, Stream

log = get_logger("lattica.pubsub")

__all__ = ["Meshsub", "PROTOCOLS", "speaks_meshsub"]

PROTOCOLS = (gs.MESHSUB_1_2, gs.MESHSUB_1_1)  # (ours, the newest first)
SEND_TIMEOUT = 30.0  # s an RPC may wait for the peer's window before our stream to it is reset
# what translating a message id costs a stranger's share, in protobuf fields (a field ~1 us to
# decode; an id ~12 us in rust's text form, ~2 us in go's and js's bytes)
ID_FIELDS = {Dialect.TEXT: 12, Dialect.BYTES: 2, Dialect.KEY: 2}


def speaks_meshsub(protocols: tuple[str, ...] | list[str]) -> str | None:
    """The newest GossipSub protocol both we and a peer (by its identify) speak, or None."""
    return next((p for p in PROTOCOLS if p in protocols), None)


class _Peer:
    """What we know of one libp2p peer: its protocol, how it writes ids, our stream to it."""

    __slots__ = ("protocol", "dialect", "stream", "queue")

    def __init__(self, protocol: str, dialect: Dialect) -> None:
        self.protocol = protocol
        self.dialect = dialect
        self.stream: Stream | None = None
        self.queue = Outbound(BOUNDS)


class Meshsub:
    """The streams to and from libp2p GossipSub peers (see the module docstring). ``drained``:
    set after each write; ``deliver``:
    the service's, given each RPC a peer sent as a router batch (and the topics of the messages
    in it that carried no author or an unusable seqno); ``misbehaved``: told of a peer whose
    stream we dropped for a malformed RPC; ``gone``: told when we can no longer send to a peer
    (its stream broke); ``heeded``: whether what a peer says is looked at now (a graylisted
    peer's RPCs are read and dropped undecoded); ``strangers``: the router's peers outside our
    mesh and what their RPCs may cost (None: every peer is taken as a member)."""

    def __init__(
        self,
        host: HostView,
        cfg: PubSubConfig,
        partials: PartialMessages,
        drained: asyncio.Event,
        deliver: Callable[[PeerId, Rpc, list[str]], None],
        misbehaved: Callable[[PeerId], None],
        gone: Callable[[PeerId], None],
        heeded: Callable[[PeerId], bool] = lambda peer: True,
        strangers: Strangers | None = None,
    ) -> None:
        self.host = host
        self.cfg = cfg
        self.partials = partials
        self.drained = drained  # (the service's: set after each write, for publishers waiting for room)
        self._deliver = deliver
        self._misbehaved = misbehaved
        self._gone = gone
        self._heeded = heeded
        self._strangers = strangers
        self.peers: dict[PeerId, _Peer] = {}

    def add(self, peer: PeerId, protocol: str, agent_version: str) -> None:
        """``peer`` speaks ``protocol`` (one of ``PROTOCOLS``) and says it runs ``agent_version``."""
        if peer not in self.peers:
            self.peers[peer] = _Peer(protocol, Dialect.of(agent_version))

    def identified(self, peer: PeerId, agent_version: str) -> None:
        """``peer``'s identify came after its first RPC: now we know how it writes ids."""
        p = self.peers.get(peer)
        if p is not None:
            p.dialect = Dialect.of(agent_version)

    def forget(self, peer: PeerId) -> None:
        """``peer`` is gone: our stream to it and what waited for it go."""
        p = self.peers.pop(peer, None)
        if p is not None and p.stream is not None:
            p.stream.reset()

    def dropped(self) -> int:
        return sum(p.queue.dropped for p in self.peers.values())

    def busy(self) -> bool:
        return any(p.queue.in_flight for p in self.peers.values())

    # -- sending ---------------------------------------------------------------------------------

    def send(self, peer: PeerId, rpc: Rpc) -> None:
        """Queue ``rpc`` for ``peer`` (shedding what is over its bounds) and send it."""
        p = self.peers.get(peer)
        if p is None:
            return
        p.queue.add(rpc, self.cfg.peer_queue, self.cfg.peer_queue_bytes)
        if not p.queue.in_flight:
            p.queue.in_flight = 1
            self.host.spawn(self._drain(peer, p))

    async def _drain(self, peer: PeerId, p: _Peer) -> None:
        ob = p.queue
        try:
            while ob.pending and self.peers.get(peer) is p:
                rpc = ob.take()
                try:
                    await self._write(peer, p, to_gossipsub(rpc, p.dialect, p.protocol == gs.MESHSUB_1_2))
                except (LatticaError, OSError, TimeoutError) as e:
                    ob.dropped += len(rpc.messages)
                    log.debug("GossipSub RPC not delivered", peer=str(peer), reason=str(e) or type(e).__name__)
                    self.forget(peer)
                    self._gone(peer)
                    return
                finally:
                    self.drained.set()
        finally:
            ob.in_flight = 0

    async def _write(self, peer: PeerId, p: _Peer, rpcs: list[gs.RPC]) -> None:
        if not rpcs:
            return
        stream = p.stream
        if stream is None or stream.aborted:
            conn = self.host.conns.get(peer)
            if conn is None or conn.is_closed:
                raise StreamClosed(f"no connection to {peer} to send GossipSub RPCs on")
            stream = p.stream = await self.host.open_stream_on(conn, p.protocol)
        try:
            for rpc in rpcs:
                write_delimited(stream, gs.encode(rpc))
            async with asyncio.timeout(SEND_TIMEOUT):  # (a peer that takes nothing loses the stream)
                await stream.drain()
        except BaseException:
            p.stream = None
            stream.reset()
            raise

    # -- receiving -------------------------------------------------------------------------------

    async def on_stream(self, stream: Stream, conn: Connection) -> None:
        """A peer's RPCs, one at a time, until the stream ends; a malformed one ends it."""
        peer = conn.remote_peer
        while True:
            try:
                raw = await self._read(stream, peer)
                if not self._heeded(peer):
                    continue  # (decoding it is looking at it: a graylisted peer's costs us its bytes only)
                decoded = self._decode(peer, raw)
                if decoded is None:
                    continue  # (a stranger's, over the strangers' share: dropped undecoded)
                rpc, bad = decoded
            except StreamClosed:
                await stream.close()
                return
            except (TimeoutError, LatticaError) as e:  # over 1 MiB or the budget, slow, or malformed
                log.info("GossipSub stream dropped", peer=str(peer), reason=str(e) or type(e).__name__)
                stream.reset()
                if isinstance(e, ProtocolError):
                    self._misbehaved(peer)
                return
            self._deliver(peer, rpc, bad)

    def _decode(self, peer: PeerId, raw: bytes) -> tuple[Rpc, list[str]] | None:
        """``peer``'s RPC as a router batch (see ``from_gossipsub``). A stranger's is charged
        before it is decoded (hostile review: every one was decoded, its ids translated, before
        any budget was taken): each protobuf field read, its top-level ones counted first to
        learn whether it carries messages, against the fields all strangers may make us read,
        and the ids to translate at their cost; one without messages takes a batch of the
        strangers' batch budgets (one with messages is charged by its new ones later, as go and
        js send one RPC a message). Past any of them it is dropped undecoded (None)."""
        p = self.peers.get(peer)  # (its dialect may come with identify, after the stream opened)
        dialect = p.dialect if p is not None else Dialect.BYTES
        strangers = self._strangers
        if strangers is None or peer not in strangers.peers:
            return from_gossipsub(gs.decode(raw), dialect)
        share = strangers.fields_left()
        rd = gs.Reader(share)
        ids = 0
        try:
            if not gs.skim(raw, rd) and not strangers.admit(peer):
                strangers.dropped_undecoded(peer, "over the strangers' batch budgets")
                return None
            msg = gs.decode(raw, rd)
            ids = ids_read(msg) * ID_FIELDS[dialect]
            if rd.read + ids > share:
                ids = 0  # (not translated: not charged)
                raise gs.Spent(f"its message ids would cost more than the {share} fields left to strangers")
        except gs.Spent as e:
            strangers.dropped_undecoded(peer, str(e))
            return None
        finally:
            strangers.fields_read(rd.read + ids)
        return from_gossipsub(msg, dialect)

    async def _read(self, stream: Stream, peer: PeerId) -> bytes:
        """One RPC: its length (the stream may idle as long as the connection lives), then its
        bytes, held against the node's budget for partly received messages."""
        return await self.partials.read_delimited(stream, peer, gs.MAX_RPC, "GossipSub RPC", self._stranger)

    def _stranger(self, peer: PeerId) -> bool:
        return self.host.circle_of(peer) == "stranger"
