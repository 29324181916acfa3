"""The ``autonat`` system actor: dials peers back so they learn whether they are reachable.

A peer calls ``check(addrs, nonce, avoid)``. We dial back only addresses on the IP address its
connection comes from (no amplification: we never dial a third party's address for anyone), from
a fresh port (a NAT that filters by port drops it, as it would drop any stranger). A NAT that
filters by address only lets through what comes from an address the peer already talks to, so we
also ask a helper — another peer we are connected to, at an address the peer has not contacted
(``avoid``) — to dial back too. A dial-back opens a stream carrying the peer's nonce: the peer
believes what arrives, not what we answer, so a server that lies cannot make it think it is public.

``check`` is open to strangers; ``dial_for`` (dial a third party back for a server) only to members
of our mesh, since a stranger could otherwise aim our dials at anyone. Every dial-back also counts
against a budget for the IP address dialed and one for the whole node.

libp2p peers ask with AutoNAT v2 (``/libp2p/autonat/2/dial-request``): we dial the first address
of theirs we are willing to (TCP or QUIC, at the IP their connection comes from, or at another
public IP once they sent ``DIAL_DATA`` bytes: the spec's amplification guard) and deliver the
nonce on ``/libp2p/autonat/2/dial-back``, within the same budgets. Older ones ask with AutoNAT v1
(``/libp2p/autonat/1.0.0``), which has no amplification guard: we dial only their addresses at
the IP their direct connection comes from, and answer with the address that worked.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from lattica._budget import Buckets
from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica._identity import PeerId
from lattica._interfaces import ip_of, is_loopback_ip, is_private_ip
from lattica._multiaddr import Multiaddr
from lattica._runtime import autonat_ref, current_caller
from lattica.errors import LatticaError, ProtocolError, StreamClosed, TransportError
from lattica.logging import get_logger
from lattica.nat import _autonat_v1_wire as v1
from lattica.nat import _autonat_v2_wire as v2
from lattica.nat._manager import DIALBACK

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._runtime.calls import Calls
    from lattica.transports.base import Connection, Stream

log = get_logger("lattica.autonat")

__all__ = ["AutoNatActor", "AutoNatServer", "autonat_ref", "DIALBACK"]

MAX_ADDRS = 4
NONCE_BYTES = 16
_DIAL_TIMEOUT = 4.0
_RATE = 2.0  # requests per second one peer may make (check or dial_for), sustained...
_BURST = 8.0  # ...and in a burst (a server asks helpers for every peer that checks with it)
_DIALS_RATE = 20.0  # dial-backs per second this node makes in all, sustained...
_DIALS_BURST = 40.0  # ...and in a burst
_IP_RATE = 1.0  # dial-backs per second to one IP address, for whoever asks (a CGNAT IP hosts many peers)...
_IP_BURST = 16.0  # ...and in a burst
_HELPERS = 2
_HELPER_BACKOFF = 60.0  # s a helper that failed to answer dial_for is not asked again...
_HELPER_FAILED_MAX = 256  # ...remembered for this many helpers at most (the oldest forgotten first)
_HELPER_SILENT = 40.0  # s without a byte from a peer (keepalives come every 15 s) before it is no helper
_DIAL_BACK_OPENS = 4  # streams a client may open on our dial-back connection (its identify, and room to spare)
DIAL_DATA = 40_000  # bytes a libp2p client sends before we dial an IP other than its own (the spec: 30-100 kB)
_V2_TIMEOUT = 15.0  # s for a whole AutoNAT v2 request, dial data and dial-back included
_DIAL_BACK_ANSWER = 0.5  # s we wait for a DialBackResponse (some clients send none)


class AutoNatServer:
    """The dialing side, on the node loop."""

    def __init__(self, runtime: Calls) -> None:
        self.rt = runtime
        self.host: HostView = runtime.host
        self._requests = Buckets(_RATE, _BURST)  # per requesting peer
        self._dials = Buckets(_DIALS_RATE, _DIALS_BURST, max_keys=1)  # the whole node
        self._per_ip = Buckets(_IP_RATE, _IP_BURST)  # per dialed IP
        self.v2_counts = {"requests": 0, "dialed": 0, "reached": 0, "refused": 0, "dial_data": 0}
        self.v1_counts = {"requests": 0, "dialed": 0, "reached": 0, "refused": 0}
        self._helper_failed: dict[PeerId, float] = {}  # helper -> loop time until which we skip it
        # (served, and so in our identify, while this service runs)
        self.host.set_handler(v2.DIAL_REQUEST, self._on_dial_request)
        self.host.set_handler(v1.PROTOCOL, self._on_v1_request)

    def _rate_ok(self, peer: PeerId) -> bool:
        return self._requests.take(peer)

    def _budget(self, targets: list[Multiaddr]) -> None:
        """Charge dialing ``targets`` (at one IP) to the budget of that IP and the node's (nobody
        makes us pound one address, whoever asks, however many identities they have); when
        spent, ProtocolError *before* dialing: a refusal says nothing of the peer's reachability,
        as a dial-back that never came would."""
        n = len(targets)
        if n and not (self._per_ip.take(ip_of(targets[0]), n) and self._dials.take(None, n)):
            raise ProtocolError("this autonat server is busy (its dial-back budget is spent): ask another")

    def _direct_conn_ip(self, peer: PeerId) -> str | None:
        for conn in self.host.conns_of.get(peer, ()):
            if not conn.is_closed and conn.transport in ("tcp", "quic"):
                return ip_of(conn.remote_addr)
        return None

    @staticmethod
    def _parse(addrs: Any, nonce: Any) -> list[Multiaddr]:
        if type(addrs) is not list or type(nonce) is not bytes or len(nonce) != NONCE_BYTES:
            raise ProtocolError(f"autonat requests carry a list of addresses and a {NONCE_BYTES}-byte nonce")
        out = []
        for a in addrs[:MAX_ADDRS]:
            try:
                m = Multiaddr(a) if type(a) is str else None
            except LatticaError:
                m = None
            if m is not None and v2.dialable(m) and m.without_peer_id() not in out:
                out.append(m.without_peer_id())
        return out

    async def check(self, peer: PeerId, addrs: Any, nonce: Any, avoid: Any) -> dict:
        ip = self._direct_conn_ip(peer)
        if ip is None:
            raise ProtocolError("autonat checks are answered over a direct connection only")
        if not self._rate_ok(peer):
            raise ProtocolError(f"too many autonat requests (at most {_RATE:g} per second)")
        targets = [a for a in self._parse(addrs, nonce) if ip_of(a) == ip]
        avoid_ips = {a for a in avoid[:64] if type(a) is str} if type(avoid) is list else set()
        if not targets:
            return {"ip": ip, "tried": [], "helper": None}
        self._budget(targets)
        helpers = self._pick_helpers(peer, avoid_ips | {ip})
        texts = [str(a) for a in targets]
        coros = [self.dial_back(peer, a, nonce) for a in targets]
        for helper in helpers:
            fut = self.rt.call(
                autonat_ref(helper), "dial_for", (peer.to_bytes(), texts, nonce), {}, timeout=_DIAL_TIMEOUT * 2
            )
            coros.append(fut)  # type: ignore[arg-type]
        results = await asyncio.gather(*coros, return_exceptions=True)
        answered = []  # helpers that dialed (whether or not they got through): the peer may count on them
        for helper, r in zip(helpers, results[len(targets) :]):
            if isinstance(r, BaseException):
                log.debug("autonat helper failed", helper=str(helper), reason=str(r))
                if isinstance(r, (TimeoutError, TransportError)):
                    # silent or gone: skipped a while. A refusal ("busy", "too many requests") is
                    # a live helper's answer, and a requester can make it say so at will: backing
                    # off then let a stranger bench our honest helpers (hostile review)
                    self._note_helper_failed(helper)
            else:
                answered.append(helper)
        return {"ip": ip, "tried": texts, "helper": str(answered[0]) if answered else None}

    def _note_helper_failed(self, helper: PeerId) -> None:
        """Skip ``helper`` for a while: a peer killed without a goodbye keeps a connection that looks
        open (QUIC's until its idle timeout), and every check that asked it would wait out the call."""
        failed = self._helper_failed
        failed.pop(helper, None)
        while len(failed) >= _HELPER_FAILED_MAX:
            del failed[next(iter(failed))]
        failed[helper] = asyncio.get_running_loop().time() + _HELPER_BACKOFF

    def _pick_helpers(self, peer: PeerId, avoid_ips: set[str]) -> list[PeerId]:
        """Live members of our mesh at addresses ``peer`` has not contacted (one per address) to
        dial it back: the most recently heard first, none that failed to help lately or has been
        silent too long. Never a stranger: it need not dial at all, and one that kept talking to
        us was asked first and named to the peer as its helper (hostile review)."""
        now = asyncio.get_running_loop().time()
        for other in [p for p, until in self._helper_failed.items() if until <= now]:
            del self._helper_failed[other]
        candidates: list[tuple[float, PeerId, str]] = []
        for other, conn in list(self.host.conns.items()):
            if other == peer or conn.is_closed or conn.transport not in ("tcp", "quic") or self.rt.node_down(other):
                continue
            if other in self._helper_failed or self.host.circle_of(other) == "stranger":
                continue
            info = self.host.info.get(conn)
            other_ip = ip_of(conn.remote_addr)
            if info is None or DIALBACK not in info.protocols or other_ip is None or other_ip in avoid_ips:
                continue
            heard = conn.last_received
            if heard is not None and now - heard > _HELPER_SILENT:
                continue
            candidates.append((heard if heard is not None else float("-inf"), other, other_ip))
        candidates.sort(key=lambda c: c[0], reverse=True)
        out: list[PeerId] = []
        ips: set[str] = set()
        for _, other, other_ip in candidates:
            if other_ip not in ips:
                out.append(other)
                ips.add(other_ip)
                if len(out) >= _HELPERS:
                    break
        return out

    async def dial_for(self, requester: PeerId, target: Any, addrs: Any, nonce: Any) -> list[str]:
        """A server asked us to dial ``target`` back (it checked the addresses are the target's)."""
        if not self._rate_ok(requester):
            raise ProtocolError(f"too many autonat requests (at most {_RATE:g} per second)")
        if type(target) is not bytes:
            raise ProtocolError("dial_for needs the target's PeerId bytes")
        peer = PeerId.from_bytes(target)
        targets = self._parse(addrs, nonce)
        if len({ip_of(a) for a in targets}) > 1:
            raise ProtocolError("dial_for names addresses at one IP address (the target's own)")
        self._budget(targets)
        ok = await asyncio.gather(*(self.dial_back(peer, a, nonce) for a in targets))
        return [str(a) for a, good in zip(targets, ok) if good]

    async def _connect_back(self, peer: PeerId, addr: Multiaddr, libp2p: bool = False) -> Connection:
        """A fresh connection to ``peer`` at ``addr`` from a fresh port (on libp2p's stack if
        ``libp2p``), for a dial-back: every protocol's dial-backs are made here. Raises
        TimeoutError, LatticaError or OSError when it cannot be made."""
        transport = self.host.transport_for(addr)
        if transport is None or peer == self.host.peer_id:
            raise ProtocolError(f"no dial-back to {addr}")
        async with asyncio.timeout(_DIAL_TIMEOUT):
            # (saying nothing of ourselves: the peer never identifies this connection, so it
            # never makes it its primary; the QUIC client says nothing in its handshake anyway)
            extra = {"say_who": False, "libp2p": libp2p} if transport.name == "tcp" else {}
            conn = await transport.dial(addr, peer, fresh_port=True, **extra)  # type: ignore[call-arg]
        # We own this connection, not the host, so we meter the peer's stream opens: a node's
        # transport holds them until its owner gives a gate, and the answer we wait for may come
        # behind the peer's own open (its identify). A few opens are let through and reset.
        opens = _DialBackOpens(conn)
        conn.set_stream_handler(opens.refuse)
        opens.metered = conn.meter_opens(opens.gate)
        return conn

    async def dial_back(self, peer: PeerId, addr: Multiaddr, nonce: bytes) -> bool:
        """Dial ``addr`` from a fresh port, expecting ``peer``; deliver the nonce; hang up."""
        conn = None
        try:
            conn = await self._connect_back(peer, addr)
            async with asyncio.timeout(_DIAL_TIMEOUT):
                stream = await self.host.open_stream_on(conn, DIALBACK)
                write_message(stream, {"nonce": nonce, "addr": str(addr)})
                # right behind it: this connection is not for use (the peer adopts it, and could
                # otherwise make it its primary and put calls on it before we hang up)
                conn.go_away()
                await stream.drain()
                answer = await read_message(stream, 256)
            return answer == {"ok": True}
        except (TimeoutError, LatticaError, OSError) as e:
            log.debug("autonat dial-back failed", peer=str(peer), addr=str(addr), reason=str(e) or "timeout")
            return False
        finally:
            if conn is not None:
                conn.abort("dial-back done")

    # -- AutoNAT v2, for libp2p peers ----------------------------------------------------------

    async def _on_dial_request(self, stream: Stream, conn: Connection) -> None:
        """One AutoNAT v2 request on its own stream, answered with a DialResponse."""
        self.v2_counts["requests"] += 1
        try:
            async with asyncio.timeout(_V2_TIMEOUT):
                answer = await self._serve_v2(stream, conn)
                write_delimited(stream, v2.encode(answer))
                await stream.close()
        except (TimeoutError, LatticaError) as e:
            log.info("AutoNAT v2 request dropped", peer=str(conn.remote_peer), reason=str(e) or "timeout")
            self.v2_counts["refused"] += 1
            stream.reset()

    async def _serve_v2(self, stream: Stream, conn: Connection) -> v2.DialResponse:
        msg = v2.decode(await read_delimited(stream, v2.MAX_MESSAGE))
        if not isinstance(msg, v2.DialRequest):
            raise ProtocolError("an AutoNAT v2 stream opens with a DialRequest")
        peer = conn.remote_peer
        observed = ip_of(conn.remote_addr) if conn.transport in ("tcp", "quic") else None
        if observed is None or not self._rate_ok(peer):  # (over a relay we cannot tell its IP)
            self.v2_counts["refused"] += 1
            return v2.DialResponse(v2.ResponseStatus.E_REQUEST_REJECTED)
        pick = _first_dialable(msg.addrs, observed)
        if pick is None:
            self.v2_counts["refused"] += 1
            return v2.DialResponse(v2.ResponseStatus.E_DIAL_REFUSED)
        index, addr = pick
        if ip_of(addr) != observed:
            await _take_dial_data(stream, index)
            self.v2_counts["dial_data"] += 1
        try:
            self._budget([addr])
        except ProtocolError:
            self.v2_counts["refused"] += 1
            return v2.DialResponse(v2.ResponseStatus.E_REQUEST_REJECTED)
        status = await self._dial_back_v2(peer, addr, msg.nonce, conn.libp2p)
        return v2.DialResponse(v2.ResponseStatus.OK, index, status)

    async def _dial_back_v2(self, peer: PeerId, addr: Multiaddr, nonce: int, libp2p: bool) -> v2.DialStatus:
        """Dial ``addr`` from a fresh port, deliver ``nonce`` on a dial-back stream, hang up."""
        self.v2_counts["dialed"] += 1
        try:
            conn = await self._connect_back(peer, addr, libp2p)
        except (TimeoutError, LatticaError, OSError) as e:
            log.debug("AutoNAT v2 dial-back failed", peer=str(peer), addr=str(addr), reason=str(e) or "timeout")
            return v2.DialStatus.E_DIAL_ERROR
        try:
            async with asyncio.timeout(_DIAL_TIMEOUT):
                stream = await self.host.open_stream_on(conn, v2.DIAL_BACK)
                write_delimited(stream, v2.encode_dial_back(nonce))
                await stream.drain()
            # the client's DialBackResponse, if it sends one (rust-libp2p 0.54's does not: it
            # takes the nonce and says nothing); only a refused or reset stream is an error
            with contextlib.suppress(TimeoutError, StreamClosed):
                async with asyncio.timeout(_DIAL_BACK_ANSWER):
                    await read_delimited(stream, 64)
            self.v2_counts["reached"] += 1
            return v2.DialStatus.OK
        except (TimeoutError, LatticaError) as e:
            log.debug("AutoNAT v2 dial-back stream failed", peer=str(peer), addr=str(addr), reason=str(e) or "timeout")
            return v2.DialStatus.E_DIAL_BACK_ERROR
        finally:
            conn.abort("dial-back done")

    # -- AutoNAT v1, for older libp2p peers ------------------------------------------------------

    async def _on_v1_request(self, stream: Stream, conn: Connection) -> None:
        """One AutoNAT v1 request (``Message{DIAL}``), answered with a ``DIAL_RESPONSE``. A
        message we cannot read is answered ``E_BAD_REQUEST``; one over the size cap, or that does
        not come within the time, resets the stream."""
        self.v1_counts["requests"] += 1
        try:
            async with asyncio.timeout(_V2_TIMEOUT):
                data = await read_delimited(stream, v1.MAX_MESSAGE)
                try:
                    answer = await self._serve_v1(v1.decode(data), conn)
                except ProtocolError as e:
                    answer = v1.DialResponse(v1.Status.E_BAD_REQUEST, str(e))
                if answer.status not in (v1.Status.OK, v1.Status.E_DIAL_ERROR):
                    self.v1_counts["refused"] += 1
                    log.info(
                        "AutoNAT v1 request refused",
                        peer=str(conn.remote_peer),
                        status=answer.status.name,
                        reason=answer.text,
                    )
                write_delimited(stream, v1.encode(answer))
                await stream.close()
        except (TimeoutError, LatticaError) as e:
            log.info("AutoNAT v1 request dropped", peer=str(conn.remote_peer), reason=str(e) or "timeout")
            self.v1_counts["refused"] += 1
            stream.reset()

    async def _serve_v1(self, msg: v1.Message, conn: Connection) -> v1.DialResponse:
        """Dial the requester back at its addresses at the IP its connection comes from (v1 has
        no amplification guard: no other IP, ever), over a direct connection only, within the
        budgets every dial-back of ours is charged to; OK with the address that worked."""
        if not isinstance(msg, v1.Dial):
            return v1.DialResponse(v1.Status.E_BAD_REQUEST, "an AutoNAT v1 request is a DIAL")
        peer = conn.remote_peer
        if msg.peer_id != peer.to_bytes():
            return v1.DialResponse(v1.Status.E_BAD_REQUEST, "the peer id is not the requester's")
        observed = ip_of(conn.remote_addr) if conn.transport in ("tcp", "quic") else None
        if observed is None:  # (over a relay we cannot tell its IP)
            return v1.DialResponse(v1.Status.E_DIAL_REFUSED, "dial-backs are made over a direct connection only")
        if not self._rate_ok(peer):
            return v1.DialResponse(v1.Status.E_DIAL_REFUSED, f"too many requests (at most {_RATE:g} per second)")
        targets: list[Multiaddr] = []
        for a in msg.addrs:
            a = a.without_peer_id()
            if v2.dialable(a) and ip_of(a) == observed and a not in targets:
                targets.append(a)
        targets = targets[:MAX_ADDRS]
        if not targets:
            return v1.DialResponse(v1.Status.E_DIAL_REFUSED, "no address at the IP your connection comes from")
        try:
            self._budget(targets)
        except ProtocolError as e:
            return v1.DialResponse(v1.Status.E_DIAL_REFUSED, str(e))
        self.v1_counts["dialed"] += len(targets)
        ok = await asyncio.gather(*(self._dial_back_v1(peer, a, conn.libp2p) for a in targets))
        for addr, good in zip(targets, ok):
            if good:
                self.v1_counts["reached"] += 1
                return v1.DialResponse(v1.Status.OK, addr=addr)
        return v1.DialResponse(v1.Status.E_DIAL_ERROR, "no dial-back got through")

    async def _dial_back_v1(self, peer: PeerId, addr: Multiaddr, libp2p: bool) -> bool:
        """A v1 dial-back is the connection itself (nothing is said on it): made, then closed."""
        try:
            conn = await self._connect_back(peer, addr, libp2p)
        except (TimeoutError, LatticaError, OSError) as e:
            log.debug("AutoNAT v1 dial-back failed", peer=str(peer), addr=str(addr), reason=str(e) or "timeout")
            return False
        conn.abort("dial-back done")
        return True


class _DialBackOpens:
    """The streams a client may open on our dial-back connection: each one reset, at most
    ``_DIAL_BACK_OPENS`` of them; past that the client misbehaves and the connection is aborted
    (its dial-back then fails, by its own doing). Unbounded, a flood of opens there held the
    node's loop for seconds (hostile review). Counted by the mux's gate where the transport
    meters opens (TCP), else as they reach the handler (QUIC, whose stream limit holds them)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.left = _DIAL_BACK_OPENS
        self.metered = False

    def gate(self, n: int) -> tuple[int, float]:
        granted = min(n, self.left)
        self.left -= granted
        if granted <= 0:
            self._too_many()
            return 0, 1.0
        return granted, 0.0

    def refuse(self, stream: Stream) -> None:
        stream.reset()
        if not self.metered:
            self.left -= 1
            if self.left < 0:
                self._too_many()

    def _too_many(self) -> None:
        if not self.conn.is_closed:
            self.conn.abort("the peer opened too many streams on a dial-back connection")


def _first_dialable(addrs: tuple[Multiaddr, ...], observed: str) -> tuple[int, Multiaddr] | None:
    """The first of a client's addresses we are willing to dial: TCP or QUIC, at the IP its
    connection comes from, or at another IP that is public (never a third party's LAN)."""
    for i, a in enumerate(addrs):
        if not v2.dialable(a):
            continue
        ip = ip_of(a)
        if ip is None:
            continue
        if ip == observed or not (is_private_ip(ip) or is_loopback_ip(ip)):
            return i, a.without_peer_id()
    return None


async def _take_dial_data(stream: Stream, index: int) -> None:
    """The amplification guard: ask for ``DIAL_DATA`` bytes, read them (in messages of at most
    4 KiB of data); ProtocolError if the client sends anything else."""
    write_delimited(stream, v2.encode(v2.DialDataRequest(index, DIAL_DATA)))
    await stream.drain()
    got = messages = 0
    while got < DIAL_DATA:
        messages += 1
        if messages > 4 * DIAL_DATA // v2.MAX_DIAL_DATA:  # (empty messages cost parses, not bytes)
            raise ProtocolError("an AutoNAT v2 client's dial data came in too many small messages")
        msg = v2.decode(await read_delimited(stream, v2.MAX_MESSAGE))
        if not isinstance(msg, v2.DialDataResponse):
            raise ProtocolError("an AutoNAT v2 client answered our DialDataRequest with something else")
        got += len(msg.data)


class AutoNatActor:
    """What peers call: ``check`` (dial me back) and ``dial_for`` (a server asks us to help)."""

    NAME = "autonat"

    def __init__(self, server: AutoNatServer) -> None:
        self._srv = server

    async def check(self, addrs: list, nonce: bytes, avoid: list) -> dict:
        """Dial the caller back on those of ``addrs`` at its own IP; returns what was tried."""
        caller = current_caller()
        assert caller is not None
        return await self._srv.check(caller, addrs, nonce, avoid)

    async def dial_for(self, target: bytes, addrs: list, nonce: bytes) -> list:
        caller = current_caller()
        assert caller is not None
        return await self._srv.dial_for(caller, target, addrs, nonce)
