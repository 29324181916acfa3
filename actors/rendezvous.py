"""The ``rendezvous`` service: libp2p rendezvous (``/rendezvous/1.0.0``, issue 50), client and
rendezvous point (the wire: ``lattica.rendezvous._wire``; the point's registrations:
``lattica.rendezvous._registrations``, sans-IO).

**Client** (every node; ``lattica.rendezvous``). ``register(point, namespace, ttl)`` sends our
signed peer record (``lattica._envelope``, domain ``libp2p-peer-record``) of the addresses we
advertise (private ones only to a point we reach at a private IP); the point answers with the TTL
it grants. The registration is renewed at 3/4 of that TTL and when our addresses change, until
``unregister`` (``RendezvousConfig.refresh``). ``discover(point, namespace, limit, cookie)``
returns the registrations whose record verifies (signed by the peer it names; the point cannot
forge one), and files each peer's addresses in our address book under the peer itself.
One request a stream, as rust-libp2p's request-response codec does it.

**Rendezvous point** (``Node(rendezvous=RendezvousConfig(serve=True))``). A stream's requests in
turn, each read (at most 16 KiB, within 10 s), answered from the registrations and written, until
the client closes its side, then closed: ours and rust's send one a stream, js's
(@canvas-js/libp2p-rendezvous) a REGISTER and then a DISCOVER (go's and js's points serve several).
Bounds: a peer's requests a second (token bucket) and all strangers' together (``E_UNAVAILABLE``
beyond: the spec's "try later"), on one stream or many; 8 streams of one peer at once and 256 in
all (more are reset unread).
A message we cannot read is answered with its status when it is a REGISTER or a DISCOVER, and
loses its stream otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lattica._budget import Buckets, StrangersShare
from lattica._envelope import open_peer_record, seal_peer_record
from lattica._framing import read_delimited, write_delimited
from lattica._interfaces import addr_host_key, is_private, is_private_ip
from lattica.errors import LatticaError, ProtocolError, RendezvousError, StreamClosed, Timeout
from lattica.logging import get_logger
from lattica.rendezvous import _wire as w

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._identity import PeerId
    from lattica._multiaddr import Multiaddr
    from lattica.config import RendezvousConfig
    from lattica.rendezvous._registrations import Registrations
    from lattica.transports.base import Connection, Stream

__all__ = ["RendezvousService", "TIMEOUT", "registrations_of"]

log = get_logger("lattica.rendezvous")

TIMEOUT = 20.0  # s a request of ours may take, the dial included
READ_TIMEOUT = 10.0  # s a peer's request may take to arrive on the stream it opened
STREAMS_PER_PEER = 8  # requests of one peer a point serves at once
STREAMS = 256  # and of all peers
RETRY = 60.0  # s between tries of a renewal that failed
MAX_KEPT = 256  # registrations of ours renewed at once (the oldest beyond is left to expire)
_SETTLE = 1.0  # s our addresses may keep changing before renewals go out with the new ones
# a point's refusals that another try would not change: the registration is no longer renewed
_FINAL = {w.Status.E_INVALID_NAMESPACE, w.Status.E_INVALID_TTL, w.Status.E_NOT_AUTHORIZED}


@dataclass(slots=True)
class _Ours:
    """One registration of ours being renewed: the TTL asked (None: the point's default)."""

    ttl: int | None
    task: asyncio.Task | None = None


class RendezvousService:
    """Register with and discover from rendezvous points; serve as one when configured."""

    def __init__(self, host: HostView, cfg: RendezvousConfig) -> None:
        self.host = host
        self.cfg = cfg
        self.book: Registrations | None = None
        self._ours: dict[tuple[PeerId, str], _Ours] = {}
        self._settling: asyncio.Task | None = None
        self.served: Counter[str] = Counter()  # a point's answers, by status name (and "reset")
        if cfg.serve:
            # only a rendezvous point loads its registrations (and hashlib, for its cookies)
            from lattica.rendezvous._registrations import Registrations

            self.book = Registrations(cfg)
            self._rates = Buckets(cfg.request_rate, cfg.request_burst, max_keys=10_000)
            self._strangers = StrangersShare(cfg.stranger_rate, cfg.stranger_burst, self._is_stranger)
            self._streams: Counter[PeerId] = Counter()
            self._streams_all = 0
            host.set_handler(w.PROTOCOL, self._on_stream)
        host.events.addresses_changed.subscribe(self._on_addresses)

    def _is_stranger(self, peer: PeerId) -> bool:
        return self.host.circle_of(peer) == "stranger"

    # -- the client -------------------------------------------------------------------------------

    async def register(self, point: PeerId, namespace: str, ttl: int | None = None) -> int:
        """Register us in ``namespace`` at ``point``; the TTL it granted, in seconds.
        RendezvousError if it refused (its status says why)."""
        w.check_namespace(namespace)
        if ttl is not None and (type(ttl) is not int or not 0 < ttl < 1 << 63):
            raise ValueError(f"a registration's TTL is a whole number of seconds > 0, not {ttl!r}")
        granted = await self._register(point, namespace, ttl)
        if self.cfg.refresh:
            self._keep(point, namespace, ttl, _renew_after(granted))
        return granted

    async def _register(self, point: PeerId, namespace: str, ttl: int | None) -> int:
        answer = await self._request(point, lambda conn: w.Register(namespace, self._record(conn), ttl))
        if not isinstance(answer, w.RegisterResponse):
            raise ProtocolError(f"{point} answered a REGISTER with a {type(answer).__name__}")
        if answer.status != w.Status.OK:
            raise _refused(point, "registration", answer.status, answer.text)
        granted = answer.ttl if answer.ttl is not None else (ttl or w.DEFAULT_TTL)
        if granted <= 0:
            raise ProtocolError(f"{point} granted a registration a TTL of {granted} s")
        return granted

    async def _request(
        self, point: PeerId, make: Callable[[Connection | None], w.Message], reply: bool = True
    ) -> w.Message | None:
        """One request to ``point`` on a stream of its own (``make`` builds it once the connection
        is known); its answer (None without ``reply``). Timeout after TIMEOUT s, the dial included."""
        try:
            async with asyncio.timeout(TIMEOUT):
                stream = await self.host.open_stream(point, w.PROTOCOL)
                try:
                    return await self._exchange(stream, make(self.host.conns.get(point)), reply)
                except BaseException:
                    stream.reset()
                    raise
        except TimeoutError as e:
            if isinstance(e, Timeout):
                raise
            raise Timeout(f"the rendezvous point {point} did not answer within {TIMEOUT:.0f} s") from None

    def _record(self, conn: Connection | None) -> bytes:
        """Our signed peer record of the addresses we advertise: private ones only for a point
        we reach at a private IP (to others they would cost a dial timeout)."""
        addrs = [a.without_peer_id() for a in self.host.advertised_addrs()]
        if not _private_conn(conn):
            addrs = [a for a in addrs if not is_private(a)]
        if not addrs:
            raise RendezvousError("this node advertises no address a peer of the rendezvous point could dial", 0)
        return seal_peer_record(self.host.keypair, time.time_ns() // 1000, list(dict.fromkeys(addrs)))

    async def unregister(self, point: PeerId, namespace: str) -> None:
        """End our registration in ``namespace`` at ``point`` (and its renewals). The protocol
        has no answer: this returns once the point has read it and closed the stream (or after
        a few seconds)."""
        w.check_namespace(namespace)
        ours = self._ours.pop((point, namespace), None)
        if ours is not None and ours.task is not None:
            ours.task.cancel()
        await self._request(point, lambda conn: w.Unregister(namespace), reply=False)

    async def discover(
        self, point: PeerId, namespace: str | None = None, limit: int | None = None, cookie: bytes | None = None
    ) -> tuple[list[w.Registration], bytes]:
        """The registrations ``point`` holds in ``namespace`` (None: in every namespace), at most
        ``limit`` (None: as many as it gives, at most 1,000), those after ``cookie``; and the
        cookie to ask for what comes after them. Each peer's addresses are remembered."""
        if namespace is not None:
            w.check_namespace(namespace)
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ValueError(f"a discovery's limit is a whole number >= 1, not {limit!r}")
        wire_limit = None if limit is None else min(limit, (1 << 63) - 1)  # (the spec's int64)
        answer = await self._request(point, lambda conn: w.Discover(namespace, wire_limit, cookie))
        if not isinstance(answer, w.DiscoverResponse):
            raise ProtocolError(f"{point} answered a DISCOVER with a {type(answer).__name__}")
        if answer.status != w.Status.OK:
            raise _refused(point, "discovery", answer.status, answer.text)
        found = registrations_of(answer, namespace, limit or w.MAX_DISCOVER)
        for r in found:
            if r.peer != self.host.peer_id and r.addrs:
                self.host.remember_addrs(r.peer, r.addrs)  # (the peer signed them itself)
        return found, answer.cookie or b""

    async def _exchange(self, stream: Stream, msg: w.Message, reply: bool = True) -> w.Message | None:
        """Write ``msg``, half-close, read the answer (``reply``) or the point's end of the stream."""
        write_delimited(stream, w.encode(msg))
        await stream.drain()
        await stream.close()  # (half-close: one request a stream)
        if not reply:
            try:
                async with asyncio.timeout(5.0):
                    while await stream.read():
                        pass
            except (TimeoutError, LatticaError):
                pass  # (the point reset it, or took long: the request went out either way)
            return None
        try:
            data = await read_delimited(stream, w.MAX_MESSAGE)
        except StreamClosed:
            raise ProtocolError("the rendezvous point closed the stream without an answer") from None
        return w.decode(data)

    # -- renewing ours ------------------------------------------------------------------------------

    def _keep(self, point: PeerId, namespace: str, ttl: int | None, delay: float) -> None:
        key = (point, namespace)
        ours = self._ours.pop(key, None) or _Ours(ttl)
        ours.ttl = ttl
        if ours.task is not None:
            ours.task.cancel()
        ours.task = self.host.spawn(self._renew(point, namespace, delay))
        self._ours[key] = ours  # (last: the most recent)
        while len(self._ours) > MAX_KEPT:
            oldest = self._ours.pop(next(iter(self._ours)))
            if oldest.task is not None:
                oldest.task.cancel()

    async def _renew(self, point: PeerId, namespace: str, delay: float) -> None:
        while True:
            await asyncio.sleep(delay)
            ours = self._ours.get((point, namespace))
            if ours is None:
                return
            try:
                granted = await self._register(point, namespace, ours.ttl)
            except RendezvousError as e:
                log.info("rendezvous registration not renewed", point=str(point), namespace=namespace, reason=str(e))
                if e.status in _FINAL:
                    self._ours.pop((point, namespace), None)
                    return
                delay = RETRY
            except (LatticaError, OSError, TimeoutError) as e:
                log.info("rendezvous registration not renewed", point=str(point), namespace=namespace, reason=str(e))
                delay = RETRY
            else:
                delay = _renew_after(granted)

    def _on_addresses(self, addrs: list[Multiaddr]) -> None:
        """Our addresses changed: our registrations go out again with the new ones (once they settle)."""
        if self._ours and (self._settling is None or self._settling.done()):
            self._settling = self.host.spawn(self._renew_all())

    async def _renew_all(self) -> None:
        await asyncio.sleep(_SETTLE)
        for (point, namespace), ours in list(self._ours.items()):
            self._keep(point, namespace, ours.ttl, 0.0)

    def registered(self) -> list[tuple[PeerId, str]]:
        """Our registrations being renewed: (rendezvous point, namespace)."""
        return list(self._ours)

    async def aclose(self) -> None:
        """The node stops: our registrations end at the points we are still connected to."""
        ours = [key for key in self._ours if key[0] in self.host.conns]
        for o in self._ours.values():
            if o.task is not None:
                o.task.cancel()
        self._ours.clear()
        if ours:
            await asyncio.wait([self.host.spawn(self._quietly_unregister(p, ns)) for p, ns in ours], timeout=2.0)

    async def _quietly_unregister(self, point: PeerId, namespace: str) -> None:
        try:
            await self.unregister(point, namespace)
        except (LatticaError, OSError, TimeoutError):
            pass  # (it expires at the point by itself)

    def close(self) -> None:
        for o in self._ours.values():
            if o.task is not None:
                o.task.cancel()
        self._ours.clear()
        if self._settling is not None:
            self._settling.cancel()

    # -- the rendezvous point ------------------------------------------------------------------------

    async def _on_stream(self, stream: Stream, conn: Connection) -> None:
        """A client's stream: its requests read and answered, then closed (see the module
        docstring for the bounds)."""
        peer = conn.remote_peer
        if self._streams[peer] >= STREAMS_PER_PEER or self._streams_all >= STREAMS:
            self.served["reset"] += 1
            stream.reset()
            return
        self._streams[peer] += 1
        self._streams_all += 1
        try:
            await self._serve(stream, conn)
        finally:
            self._streams_all -= 1
            self._streams[peer] -= 1
            if not self._streams[peer]:
                del self._streams[peer]

    async def _serve(self, stream: Stream, conn: Connection) -> None:
        """Requests in turn until the client ends its side: ours and rust's send one and
        half-close; js's (@canvas-js) sends a REGISTER, then a DISCOVER on the same stream."""
        peer = conn.remote_peer
        answered = False
        while True:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    data = await read_delimited(stream, w.MAX_REQUEST)
            except StreamClosed:
                await stream.close()
                return
            except TimeoutError:
                if answered:  # (a client that keeps its stream open after its requests)
                    await stream.close()
                    return
                self.served["reset"] += 1
                stream.reset()
                return
            except LatticaError:  # more than a request's worth, or the stream broke
                self.served["reset"] += 1
                stream.reset()
                return
            try:
                answer = self.answer(peer, data, addr_host_key(conn.remote_addr))
            except ProtocolError:  # (unreadable, not a request, or over the budget: no answer due)
                self.served["reset"] += 1
                stream.reset()
                return
            answered = True
            if answer is None:  # (an UNREGISTER: no answer)
                continue
            self.served[w.status_name(getattr(answer, "status", 0))] += 1
            write_delimited(stream, w.encode(answer))
            try:
                async with asyncio.timeout(READ_TIMEOUT):  # (a peer that does not read its answer loses the stream)
                    await stream.drain()
            except (TimeoutError, LatticaError):
                stream.reset()
                return

    def answer(self, peer: PeerId, data: bytes, source: str | None) -> w.Message | None:
        """The answer to ``peer``'s request ``data`` (None: none is due). ProtocolError when the
        stream goes without one. ``source``: the address it came from."""
        assert self.book is not None
        try:
            msg = w.decode(data)
        except w.BadMessage as e:
            log.info("malformed rendezvous request", peer=str(peer), reason=str(e))
            if e.kind is w.MessageType.REGISTER:
                return w.RegisterResponse(e.status, str(e))
            if e.kind is w.MessageType.DISCOVER:
                return w.DiscoverResponse(status=e.status, text=str(e))
            raise
        if not isinstance(msg, (w.Register, w.Unregister, w.Discover)):
            raise ProtocolError(f"a rendezvous point takes requests, not a {type(msg).__name__}")
        if not self._rates.take(peer) or not self._strangers.take(peer):
            text = "too many requests: try again later"
            if isinstance(msg, w.Register):
                return w.RegisterResponse(w.Status.E_UNAVAILABLE, text)
            if isinstance(msg, w.Discover):
                return w.DiscoverResponse(status=w.Status.E_UNAVAILABLE, text=text)
            raise ProtocolError(f"{peer} is over its budget of rendezvous requests")
        stranger = self._is_stranger(peer)
        return self.book.handle(peer, msg, self.host.loop.time(), source if stranger else None)

    def stats(self) -> dict[str, object]:
        """What a point holds and has answered (for diagnostics)."""
        book = self.book
        return {
            "serving": book is not None,
            "registrations": len(book) if book is not None else 0,
            "namespaces": len(book.namespaces()) if book is not None else 0,
            "answers": dict(self.served),
            "ours": [(str(p), ns) for p, ns in self._ours],
        }


def registrations_of(answer: w.DiscoverResponse, namespace: str | None, limit: int) -> list[w.Registration]:
    """A discovery answer's registrations that hold: at most ``limit``, of ``namespace`` (when
    one was asked for), each a signed peer record that verifies; the addresses are the record's."""
    out: list[w.Registration] = []
    for reg in answer.registrations:
        if len(out) == limit:
            break
        if namespace is not None and reg.ns != namespace:
            continue
        try:
            peer, _, addrs = open_peer_record(reg.record)
        except ProtocolError as e:
            log.info("a discovered registration's record does not verify", namespace=reg.ns, reason=str(e))
            continue
        out.append(w.Registration(peer, list(addrs), reg.ns, reg.ttl or 0))
    return out


def _renew_after(granted: int) -> float:
    """Seconds until a registration granted ``granted`` s is renewed (3/4 of it; a point that
    grants more than the spec's 72 h is renewed as if it had granted that)."""
    return 0.75 * min(granted, w.MAX_TTL)


def _refused(point: PeerId, what: str, status: int, text: str) -> RendezvousError:
    why = f": {text}" if text else ""
    return RendezvousError(f"{point} refused the {what} ({w.status_name(status)}{why})", status)


def _private_conn(conn: Connection | None) -> bool:
    """``conn`` goes to a private IP directly (a peer there may dial our private addresses)."""
    if conn is None or conn.is_closed or conn.transport not in ("tcp", "quic"):
        return False
    try:
        return is_private_ip(conn.remote_addr.host_port()[0])
    except LatticaError:
        return False
