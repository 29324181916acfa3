"""What one node's DHT holds (configuration, routing table, record store, the addresses of table
peers, misbehaving peers), how the table learns peers, and the requests to peers' dht actors."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from lattica import _context as context
from lattica._future import Future
from lattica._identity import PeerId
from lattica._interfaces import is_private, is_private_ip
from lattica._membership import MemberDown
from lattica._multiaddr import Multiaddr
from lattica._runtime import current_caller
from lattica.actors.dht.actor import MAX_ADDRS_IN_ANSWER, dht_ref
from lattica.config import DhtConfig
from lattica.dht._kademlia import RoutingTable
from lattica.dht._records import RecordStore
from lattica.errors import LatticaError, PeerUnreachable
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._runtime.calls import Calls

log = get_logger("lattica.dht")


def on_our_lan(host: HostView, peer: PeerId) -> bool:
    """We are connected to ``peer`` directly at a private IP: its private addresses work for us
    (and for the other peers on this network), so answers to it may carry them."""
    conn = host.conns.get(peer)
    if conn is None or conn.is_closed or conn.transport not in ("tcp", "quic"):
        return False
    try:
        return is_private_ip(conn.remote_addr.host_port()[0])
    except LatticaError:
        return False


class DhtState:
    """The routing table and record store of one node, and its requests to other nodes.

    A node id is ``sha256(PeerId bytes)`` and a peer enters the routing table only after it
    answered one of our requests, or called us on an authenticated connection while having
    listen addresses others can dial: a public one, or any if it is on our own private network.
    A peer membership declares dead or departed leaves the table at once."""

    def __init__(self, runtime: Calls, config: DhtConfig | None = None) -> None:
        self.rt = runtime
        self.host: HostView = runtime.host
        self.cfg = config or DhtConfig()
        self.peer_id = runtime.peer_id
        self.keypair = runtime.host.keypair
        self.table = RoutingTable(self.peer_id, self.cfg.k, ping_after=self.cfg.ping_after)
        # (peers that store are connected: their circle is known; strangers get a share)
        self.store = RecordStore(self.cfg.limits, local=self.peer_id, member=self.is_member)
        self.misbehaved: collections.OrderedDict[PeerId, list[str]] = collections.OrderedDict()
        self.rejected = 0  # stores we refused
        self._pinging: set[PeerId] = set()
        self._addrs: dict[PeerId, list[Multiaddr]] = {}  # how we reached the peers in our table
        self._public: dict[PeerId, list[Multiaddr]] = {}  # ... less private ones, for peers off our LAN

    # -- routing table upkeep ---------------------------------------------------------------------

    def on_identified(self, info: Any) -> None:
        if "/lattica/rpc/1" not in info.protocols:
            return
        if self._serves(info):
            self.seen(info.peer_id)
        else:
            self.drop(info.peer_id)

    @staticmethod
    def _serves(info: Any) -> bool:
        """By its own (identify) word the peer is dialable directly: it has listen addresses and
        no relay circuits (a private peer queries the DHT but serves no part of it: others would
        reach it only through a relay)."""
        return bool(info.listen_addrs) and not any(a.is_circuit for a in info.listen_addrs)

    def on_membership(self, event: Any) -> None:
        """A member declared dead or departed leaves the table: lookups and the peers we answer
        must not wait on it (the table's own eviction takes a failed request or a refresh)."""
        if isinstance(event, MemberDown):
            try:
                self.drop(PeerId.from_string(event.member.id))
            except LatticaError:
                pass

    def is_member(self, peer: PeerId) -> bool:
        """``peer`` is this node or a member of its mesh, as far as we know: its identify on a
        connection said so, or membership (which admits members' statements only) holds it alive."""
        return self.host.circle_of(peer) != "stranger" or self.rt.node_alive(peer)

    def on_our_lan(self, peer: PeerId) -> bool:
        return on_our_lan(self.host, peer)

    def _routable(self, peer: PeerId, addrs: Any) -> bool:
        """Peers that ask us could dial ``peer``: it has a public (or non-IP) address, or it is on
        our private network. A peer behind a NAT advertising only its LAN address is not."""
        return any(not is_private(a) for a in addrs or ()) or self.on_our_lan(peer)

    def seen(self, peer: PeerId) -> None:
        if peer in self.misbehaved:
            return  # it answered garbage: it does not come back by calling us
        addrs = self.host.peer_addrs.get(peer)
        if addrs and not self._routable(peer, addrs):
            self.drop(peer)
            return
        if addrs:
            addrs = list(addrs)[:MAX_ADDRS_IN_ANSWER]
            if addrs != self._addrs.get(peer):
                self._addrs[peer] = addrs
                self._public[peer] = [a for a in addrs if not is_private(a)]
        oldest = self.table.seen(peer)
        if oldest is not None and oldest not in self._pinging:
            self._pinging.add(oldest)
            self.host.spawn(self._check_oldest(oldest))

    async def _check_oldest(self, peer: PeerId) -> None:
        alive = False
        try:
            await self.call(peer, "ping")
            alive = True
        except LatticaError:
            pass
        finally:
            self._pinging.discard(peer)
        self.table.ping_result(peer, alive)
        if not alive:
            self._addrs.pop(peer, None)
            self._public.pop(peer, None)

    def drop(self, peer: PeerId) -> None:
        self.table.remove(peer)
        self._addrs.pop(peer, None)
        self._public.pop(peer, None)

    def mark_misbehaved(self, peer: PeerId, reason: str) -> None:
        log.info("DHT peer misbehaved", peer=str(peer), reason=reason)
        self.drop(peer)
        reasons = self.misbehaved.pop(peer, [])
        reasons = (reasons + [reason])[-8:]
        self.misbehaved[peer] = reasons
        while len(self.misbehaved) > 1024:
            self.misbehaved.popitem(last=False)

    def caller_seen(self) -> PeerId:
        caller = current_caller()
        assert caller is not None
        if caller != self.peer_id and caller not in self.table:
            conn = self.host.conns.get(caller)
            info = self.host.info.get(conn) if conn is not None else None
            if info is not None and self._serves(info):
                self.seen(caller)
        elif caller in self.table:
            self.seen(caller)
        return caller

    # -- wire helpers ------------------------------------------------------------------------

    def peers_wire(self, peers: list[PeerId], to: PeerId | None = None) -> list:
        """``[[PeerId, [Multiaddr, ...]], ...]`` for an answer to ``to``: a peer not on our private
        network gets no private addresses (they would only cost it a dial timeout)."""
        lan = to is None or self.on_our_lan(to)
        out = []
        for p in peers:
            addrs = self._addrs.get(p)
            if addrs is not None:
                if not lan:
                    addrs = self._public[p]
            else:
                addrs = self.host.peer_addrs.get(p, [])
                if not lan:
                    addrs = [a for a in addrs if not is_private(a)]
            if addrs:
                out.append([p, addrs[:MAX_ADDRS_IN_ANSWER]])
        return out

    def reachable(self, peer: PeerId, hints: dict[PeerId, list[Multiaddr]] | None = None) -> None:
        """Make sure the node can dial ``peer``: its table address, else the hint, unless the
        address book already has one (hints never displace what a peer said about itself)."""
        if self.host.peer_addrs.get(peer):
            return
        addrs = self._addrs.get(peer)
        if addrs:
            self.host.remember_addrs(peer, addrs)
        elif (hints or {}).get(peer):
            self.host.remember_addrs(peer, hints[peer], hint=True)  # type: ignore[index]

    def request(self, peer: PeerId, method: str, args: tuple) -> Any:
        """Call ``method`` on ``peer``'s dht actor; returns its Future. A dial this starts never
        asks the DHT where the peer went: failing DHT requests would start lookups that fail
        more requests, a cascade when many peers are gone at once."""
        if self.rt.node_down(peer):  # membership holds it suspect or dead: do not wait on it
            fut = Future(self.rt.loop)
            state = self.rt.membership.state_of(peer) if self.rt.membership is not None else None
            fut._reject(PeerUnreachable(f"{peer} is {state} in the membership view"))
            return fut
        timeout = self.cfg.request_timeout
        if peer not in self.table:
            conn = self.host.conns.get(peer)
            if conn is None or conn.is_closed:  # never answered us and not connected: maybe long gone
                timeout = min(timeout, self.cfg.first_contact_timeout)
        token = context.NO_DHT_DIAL_LOOKUP.set(True)
        try:
            return self.rt.call(dht_ref(peer), method, args, {}, timeout=timeout)
        finally:
            context.NO_DHT_DIAL_LOOKUP.reset(token)

    async def call(self, peer: PeerId, method: str, *args: Any) -> Any:
        self.reachable(peer)
        return await self.request(peer, method, args)
