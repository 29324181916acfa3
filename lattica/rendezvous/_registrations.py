"""A rendezvous point's registrations, sans-IO: what ``REGISTER``, ``UNREGISTER`` and ``DISCOVER``
do to them (``lattica.rendezvous._wire``'s messages in, answers out), given the time.

* **Who may register.** Only a peer itself: the signed peer record must verify (any libp2p key
  type, either signing convention: ``lattica._envelope``) and name the peer that sent it
  (``E_NOT_AUTHORIZED`` otherwise). Discovery gives the record as it came, so whoever reads it
  checks the signature again; the addresses are the record's, never anything else.
* **Lifetimes.** A registration lasts its TTL (default 2 h; outside ``[min_ttl, max_ttl]``:
  ``E_INVALID_TTL``); registering again replaces it (a new TTL, a new place in the order);
  ``UNREGISTER`` ends it. Expired ones are dropped on every request (a heap by expiry).
* **Bounds.** Registrations in all, per peer, per namespace, and per source address for peers
  outside our mesh (identities cost nothing; an address does): beyond, ``E_UNAVAILABLE``. A
  record is at most 4 KiB; a discovery answer holds at most ``max_discover`` registrations and
  stays under the 1 MiB a rust-libp2p client reads.
* **Cookies hold no state here.** Every registration gets the next number of a counter; an
  answer's cookie says "everything up to number N seen" and the namespace it was for:
  ``N`` (5 bytes) and a 3-byte MAC of ``N`` and the namespace under a key of this point's, then
  the namespace (rust-libp2p's cookie layout: 8 bytes, then the namespace, which its client
  checks). A cookie from another namespace, from before a restart, cut short or forged is
  ``E_INVALID_COOKIE``. Nothing is kept per cookie, so handing out many costs nothing.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import math
import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lattica._envelope import open_peer_record
from lattica.errors import ProtocolError
from lattica.rendezvous import _wire as w

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._multiaddr import Multiaddr
    from lattica.config import RendezvousConfig

__all__ = ["Registrations", "Held"]

_SEQ_BYTES = 5  # of a cookie's position (2^40 registrations before it would wrap)
_TAG_BYTES = 3  # of its MAC (rust's layout leaves 8 bytes for both)
_ANSWER_BYTES = w.MAX_MESSAGE - 4096  # registrations' bytes in one answer (the cookie and status fit in the rest)


@dataclass(slots=True)
class Held:
    """One registration: ``peer`` in ``namespace``, its record as it came and the addresses in it."""

    namespace: str
    peer: PeerId
    record: bytes
    addrs: tuple[Multiaddr, ...]
    ttl: int
    expires: float
    seq: int
    source: str | None  # the address it came from, for a stranger's (counted per address)


class Registrations:
    """The registrations of one rendezvous point (see the module docstring). Times are the
    caller's clock, in seconds."""

    def __init__(self, cfg: RendezvousConfig, key: bytes | None = None) -> None:
        self.cfg = cfg
        self._key = key if key is not None else os.urandom(32)
        self._all: dict[tuple[str, PeerId], Held] = {}  # in registration order (seq)
        self._by_ns: dict[str, dict[PeerId, Held]] = {}  # each in registration order
        self._per_peer: Counter[PeerId] = Counter()
        self._per_source: Counter[str] = Counter()
        self._expiry: list[tuple[float, int, str, PeerId]] = []  # (expires, seq, namespace, peer)
        self._seq = 0

    def __len__(self) -> int:
        return len(self._all)

    def namespaces(self) -> dict[str, int]:
        """Registrations held per namespace."""
        return {ns: len(held) for ns, held in self._by_ns.items()}

    def held(self, namespace: str, peer: PeerId) -> Held | None:
        return self._all.get((namespace, peer))

    def of_peer(self, peer: PeerId) -> int:
        return self._per_peer.get(peer, 0)

    # -- requests ---------------------------------------------------------------------------------

    def handle(self, peer: PeerId, msg: w.Message, now: float, source: str | None = None) -> w.Message | None:
        """The answer to ``peer``'s request (None: an UNREGISTER, which has none). ``source``: the
        address a stranger's request came from (None for a member: not limited per address).
        ProtocolError for a message that is not a request."""
        if isinstance(msg, w.Register):
            status, text, ttl = self.register(peer, msg, now, source)
            return w.RegisterResponse(status, text, ttl if status == w.Status.OK else None)
        if isinstance(msg, w.Unregister):
            self.unregister(peer, msg.ns)
            return None
        if isinstance(msg, w.Discover):
            return self.discover(msg, now)
        raise ProtocolError(f"a rendezvous point takes requests, not a {type(msg).__name__}")

    def register(self, peer: PeerId, msg: w.Register, now: float, source: str | None = None) -> tuple[int, str, int]:
        """(status, text, TTL granted) for ``peer``'s REGISTER."""
        self.expire(now)
        try:
            w.check_namespace(msg.ns)
        except ValueError as e:
            return w.Status.E_INVALID_NAMESPACE, str(e), 0
        if len(msg.record) > w.MAX_RECORD:
            return w.Status.E_INVALID_SIGNED_PEER_RECORD, f"a signed peer record of at most {w.MAX_RECORD} bytes", 0
        try:
            signer, _, addrs = open_peer_record(msg.record)
        except ProtocolError as e:
            return w.Status.E_INVALID_SIGNED_PEER_RECORD, str(e), 0
        if signer != peer:
            return w.Status.E_NOT_AUTHORIZED, "the signed peer record is another peer's", 0
        cfg = self.cfg
        ttl = w.DEFAULT_TTL if msg.ttl is None else msg.ttl
        if not cfg.min_ttl <= ttl <= cfg.max_ttl:
            return w.Status.E_INVALID_TTL, f"a TTL is {cfg.min_ttl} to {cfg.max_ttl} seconds, not {ttl}", 0
        key = (msg.ns, peer)
        old = self._all.get(key)
        if old is None:
            refused = self._full(msg.ns, peer, source)
            if refused:
                return w.Status.E_UNAVAILABLE, refused, 0
        else:
            self._drop(old)
        self._seq += 1
        held = Held(msg.ns, peer, msg.record, addrs, ttl, now + ttl, self._seq, source)
        self._all[key] = held
        self._by_ns.setdefault(msg.ns, {})[peer] = held
        self._per_peer[peer] += 1
        if source is not None:
            self._per_source[source] += 1
        heapq.heappush(self._expiry, (held.expires, held.seq, msg.ns, peer))
        if len(self._expiry) > 2 * len(self._all) + 64:  # (replaced ones' entries: swept)
            self._expiry = [(h.expires, h.seq, h.namespace, h.peer) for h in self._all.values()]
            heapq.heapify(self._expiry)
        return w.Status.OK, "", ttl

    def _full(self, ns: str, peer: PeerId, source: str | None) -> str:
        """Why a new registration does not fit ("" if it does)."""
        cfg = self.cfg
        if len(self._all) >= cfg.max_registrations:
            return f"this rendezvous point holds {cfg.max_registrations} registrations (its limit)"
        if self._per_peer.get(peer, 0) >= cfg.max_per_peer:
            return f"a peer may hold {cfg.max_per_peer} registrations here"
        if len(self._by_ns.get(ns, ())) >= cfg.max_per_namespace:
            return f"the namespace holds {cfg.max_per_namespace} registrations (its limit)"
        if source is not None and self._per_source.get(source, 0) >= cfg.max_per_address:
            return f"peers outside this node's mesh hold {cfg.max_per_address} registrations from {source}"
        return ""

    def unregister(self, peer: PeerId, ns: str) -> bool:
        """End ``peer``'s registration in ``ns`` (only its own); whether there was one."""
        held = self._all.get((ns, peer))
        if held is None:
            return False
        self._drop(held)
        return True

    def _drop(self, held: Held) -> None:
        del self._all[(held.namespace, held.peer)]
        in_ns = self._by_ns[held.namespace]
        del in_ns[held.peer]
        if not in_ns:
            del self._by_ns[held.namespace]
        self._per_peer[held.peer] -= 1
        if not self._per_peer[held.peer]:
            del self._per_peer[held.peer]
        if held.source is not None:
            self._per_source[held.source] -= 1
            if not self._per_source[held.source]:
                del self._per_source[held.source]

    def expire(self, now: float) -> int:
        """Drop the registrations whose TTL ran out by ``now``; how many."""
        n = 0
        heap = self._expiry
        while heap and heap[0][0] <= now:
            _, seq, ns, peer = heapq.heappop(heap)
            held = self._all.get((ns, peer))
            if held is not None and held.seq == seq:  # (else it was replaced or ended already)
                self._drop(held)
                n += 1
        return n

    def discover(self, msg: w.Discover, now: float) -> w.DiscoverResponse:
        """The registrations of ``msg.ns`` (or of every namespace) after its cookie's position,
        oldest first, at most ``min(limit, max_discover)`` and 1 MiB of them, with the cookie
        that continues from there."""
        self.expire(now)
        ns = msg.ns or None  # ("" is no namespace: registering under it is refused)
        if ns is not None:
            try:
                w.check_namespace(ns)
            except ValueError as e:
                return w.DiscoverResponse(status=w.Status.E_INVALID_NAMESPACE, text=str(e))
        after = 0
        if msg.cookie is not None:
            position = self._position(msg.cookie, ns)
            if position is None:
                return w.DiscoverResponse(
                    status=w.Status.E_INVALID_COOKIE,
                    text="the cookie is not one this rendezvous point gave for this namespace",
                )
            after = position
        cap = self.cfg.max_discover
        limit = cap if not msg.limit else min(msg.limit, cap)  # (0 or none: as many as an answer holds)
        pool = self._all.values() if ns is None else self._by_ns.get(ns, {}).values()
        out: list[w.Register] = []
        size = 0
        seen = after  # the last registration the answer holds
        cut = False
        for held in pool:
            if held.seq <= after:
                continue
            cost = len(held.record) + len(held.namespace) + 32
            if len(out) == limit or size + cost > _ANSWER_BYTES:
                cut = True
                break
            out.append(w.Register(held.namespace, held.record, max(1, math.ceil(held.expires - now))))
            seen = held.seq
            size += cost
        # an answer that holds all there is says so: the next one starts after everything now here
        return w.DiscoverResponse(tuple(out), self._cookie(seen if cut else self._seq, ns))

    # -- cookies ----------------------------------------------------------------------------------

    def _tag(self, position: bytes, ns: bytes) -> bytes:
        return hmac.new(self._key, position + ns, hashlib.sha256).digest()[:_TAG_BYTES]

    def _cookie(self, position: int, ns: str | None) -> bytes:
        raw_ns = ns.encode() if ns else b""
        head = (position % (1 << (8 * _SEQ_BYTES))).to_bytes(_SEQ_BYTES, "big")
        return head + self._tag(head, raw_ns) + raw_ns

    def _position(self, cookie: bytes, ns: str | None) -> int | None:
        """The position ``cookie`` continues from, or None unless this point gave it for ``ns``."""
        n = _SEQ_BYTES + _TAG_BYTES
        if len(cookie) < n or cookie[n:] != (ns.encode() if ns else b""):
            return None
        head = cookie[:_SEQ_BYTES]
        if not hmac.compare_digest(cookie[_SEQ_BYTES:n], self._tag(head, cookie[n:])):
            return None
        position = int.from_bytes(head, "big")
        return position if position <= self._seq else None
