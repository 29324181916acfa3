"""Asking libp2p peers whether we are reachable: the client side of AutoNAT v2, and of v1 for
servers that speak only that (go-libp2p before 0.36).

The reachability round (``lattica/nat/_manager.py``) asks connected libp2p peers that serve
``/libp2p/autonat/2/dial-request`` or ``/libp2p/autonat/1.0.0`` (and not our own protocol) with
:meth:`LibP2PAutoNatClient.check`:
one request per server on a stream of its own, naming one of our candidate addresses (the
servers of a round, and the rounds, take turns over them) with a fresh nonce; dial data sent
when the server asks for it within bounds; the nonce received on ``/libp2p/autonat/2/dial-back``.
One address a request, not a list: the spec's server dials exactly one anyway, and js-libp2p's
(``@libp2p/autonat-v2`` 2.x) answers every address of a list in turn, a refusal first included.
A v1 server's dial-back carries no nonce: it is any dial from the server's IP that reaches our
listeners while the request is open. The protocol state is sans-IO (``lattica/nat/_autonat_v2_client.py``,
``_autonat_v1_client.py``); this is the asyncio around it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from lattica._framing import read_delimited, write_delimited
from lattica._interfaces import ip_of
from lattica.errors import LatticaError, ProtocolError
from lattica.logging import get_logger
from lattica.nat import _autonat_v1_wire as v1
from lattica.nat import _autonat_v2_wire as v2
from lattica.nat._autonat_v1_client import V1Request
from lattica.nat._autonat_v2_client import MAX_PENDING, Outcome, Requests, Verdict, addrs_to_ask

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._identity import PeerId
    from lattica._multiaddr import Multiaddr
    from lattica.transports.base import Connection, Stream

log = get_logger("lattica.autonat")

M = TypeVar("M", contravariant=True)


class _Exchange(Protocol[M]):
    """A request's protocol state, as ``_exchange`` plays it (v2's ``Request``, v1's ``V1Request``)."""

    @property
    def answered(self) -> bool: ...

    def opening(self) -> bytes: ...

    def receive(self, msg: M) -> list[bytes]: ...

    def awaits_dial_back(self) -> bool: ...


__all__ = ["LibP2PAutoNatClient"]

_TIMEOUT = 30.0  # s for one request, dial data included (go-libp2p's server gives a dial 15 s)
_TRAILING = 1.0  # s a dial-back may come after the server's DialResponse
_READ_DIAL_BACK = 5.0  # s for a dial-back stream to deliver its nonce


class LibP2PAutoNatClient:
    """Our AutoNAT requests to libp2p servers (v2, else v1), and the dial-backs they send us."""

    def __init__(self, host: HostView, requests: Requests | None = None) -> None:
        self.host = host
        self.requests = requests or Requests()
        self._arrival: dict[int, asyncio.Event] = {}  # nonce -> set when its dial-back came
        self._v1: dict[V1Request, asyncio.Event] = {}  # v1 requests open -> set when a dial-back came
        self.v1_counts = {o.value: 0 for o in Outcome} | {"asked": 0, "unconfirmed": 0}
        self._turn = 0  # which candidate the next round's first server is asked about
        host.set_handler(v2.DIAL_BACK, self._on_dial_back)
        host.events.dialed_in.subscribe(self._on_dialed_in)

    async def check(self, servers: list[PeerId], cands: list[Multiaddr]) -> list[Verdict]:
        """Ask each of ``servers`` (at once) to dial one of ``cands``; what each came to."""
        turn, self._turn = self._turn, self._turn + 1
        return list(await asyncio.gather(*(self.ask(p, cands, turn + i) for i, p in enumerate(servers))))

    async def ask(self, peer: PeerId, cands: list[Multiaddr], turn: int = 0) -> Verdict:
        """Ask ``peer`` to dial one of ``cands`` (the ``turn``-th of those worth asking it about)."""
        conn = self.host.conns.get(peer)
        if conn is None or conn.is_closed or conn.transport not in ("tcp", "quic"):
            return Verdict(Outcome.NOTHING, reason="no direct connection to the server")
        worth = addrs_to_ask(cands, ip_of(conn.remote_addr))
        pick = worth[turn % len(worth) :][:1] if worth else ()
        info = self.host.info.get(conn)
        if info is not None and v2.DIAL_REQUEST not in info.protocols and v1.PROTOCOL in info.protocols:
            return await self._ask_v1(conn, pick)
        try:
            req = self.requests.start(pick)
        except ProtocolError as e:
            return Verdict(Outcome.NOTHING, reason=str(e))
        arrived = self._arrival[req.nonce] = asyncio.Event()
        failure: str | None = "cancelled"
        try:
            failure = await self._exchange(conn, v2.DIAL_REQUEST, req, v2.decode, v2.MAX_MESSAGE, arrived)
        finally:
            self._arrival.pop(req.nonce, None)
            verdict = self.requests.finish(req, failure)  # (its nonce forgotten whatever happened)
        if failure is not None:
            log.info("AutoNAT v2 request abandoned", server=str(peer), reason=failure)
        else:
            log.debug("AutoNAT v2 answer", server=str(peer), outcome=verdict.outcome.value, reason=verdict.reason)
        return verdict

    async def _ask_v1(self, conn: Connection, addrs: tuple[Multiaddr, ...]) -> Verdict:
        """One AutoNAT v1 ``Dial`` to the server at the other end of ``conn``."""
        if len(self._v1) >= MAX_PENDING:
            return Verdict(Outcome.NOTHING, reason=f"{MAX_PENDING} AutoNAT v1 requests in flight already")
        try:
            req = V1Request(self.host.peer_id.to_bytes(), addrs, ip_of(conn.remote_addr) or "")
        except ProtocolError as e:
            return Verdict(Outcome.NOTHING, reason=str(e))
        arrived = self._v1[req] = asyncio.Event()
        self.v1_counts["asked"] += 1
        try:
            failure = await self._exchange(conn, v1.PROTOCOL, req, v1.decode, v1.MAX_MESSAGE, arrived)
        finally:
            del self._v1[req]
        verdict = req.verdict(failure)
        self.v1_counts[verdict.outcome.value] += 1
        if failure is None and req.awaits_dial_back():
            self.v1_counts["unconfirmed"] += 1  # (it said it got through; nothing came)
        log.debug(
            "AutoNAT v1 answer", server=str(conn.remote_peer), outcome=verdict.outcome.value, reason=verdict.reason
        )
        return verdict

    async def _exchange(
        self,
        conn: Connection,
        protocol: str,
        req: _Exchange[M],
        decode: Callable[[bytes], M],
        max_message: int,
        arrived: asyncio.Event,
    ) -> str | None:
        """Play ``req`` against the server on a new ``protocol`` stream, then give its dial-back
        up to ``_TRAILING`` to arrive (``arrived`` is set at each that may be it); why it was
        abandoned, or None."""
        stream: Stream | None = None
        try:
            async with asyncio.timeout(_TIMEOUT):
                stream = await self.host.open_stream_on(conn, protocol)
                write_delimited(stream, req.opening())
                await stream.drain()
                while not req.answered:
                    for out in req.receive(decode(await read_delimited(stream, max_message))):
                        write_delimited(stream, out)
                        await stream.drain()
            with contextlib.suppress(LatticaError):
                await stream.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TRAILING):
                    while req.awaits_dial_back():
                        arrived.clear()
                        await arrived.wait()
        except (TimeoutError, LatticaError) as e:
            if stream is not None:
                stream.reset()
            return str(e) or "timeout"
        return None

    def _on_dialed_in(self, transport: str, ip: str) -> None:
        """A v1 dial-back is a dial from the server's IP: offered to every v1 request open."""
        for req, event in self._v1.items():
            if req.dialed_in(transport, ip):
                event.set()

    async def _on_dial_back(self, stream: Stream, conn: Connection) -> None:
        """A server delivers a nonce: ours (in flight, on a connection it opened) is answered OK;
        anything else is reset."""
        try:
            async with asyncio.timeout(_READ_DIAL_BACK):
                nonce = v2.decode_dial_back(await read_delimited(stream, 64))
        except (TimeoutError, LatticaError) as e:
            log.info("AutoNAT v2 dial-back dropped", peer=str(conn.remote_peer), reason=str(e) or "timeout")
            stream.reset()
            return
        ip = ip_of(conn.remote_addr) if conn.transport in ("tcp", "quic") else None
        if not self.requests.dial_back(nonce, conn.transport, ip, conn.direction == "inbound"):
            log.info("AutoNAT v2 dial-back refused: not a nonce of ours in flight", peer=str(conn.remote_peer))
            stream.reset()
            return
        event = self._arrival.get(nonce)
        if event is not None:
            event.set()
        write_delimited(stream, v2.DIAL_BACK_OK)
        with contextlib.suppress(LatticaError):
            await stream.close()
