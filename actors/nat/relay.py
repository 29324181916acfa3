"""The ``relay`` system actor: reservations for private peers and circuits that carry their traffic.

A private peer calls ``relay.reserve()`` over a direct connection; while the reservation lives
(renewed before it expires, dropped when the peer disconnects) anyone may open a ``hop`` stream
to this node asking for a circuit to it. The relay opens a ``stop`` stream to the reserved peer and
copies bytes between the two streams under the circuit's limits, with backpressure both ways
(a slow reader slows the writer; nothing is buffered without bound). It never sees plaintext: the
two ends run Noise between themselves (``transports/circuit.py``).

Limits default to carrying real traffic (no byte or time cap per circuit); what is bounded is how
many reservations and circuits exist, per peer, per IP address and in total.

libp2p nodes use the same book through circuit relay v2 (``/libp2p/circuit/relay/0.2.0/hop``):
RESERVE (answered with a signed voucher and the circuit's limits) and CONNECT, relayed to the
target's ``stop`` stream in the same protocol. A circuit to a peer that reserved that way runs
circuit relay v2's stop protocol whoever asks, so its two ends speak libp2p's stack end to end;
splicing stays between Lattica nodes.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from lattica import _ping as ping
from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica._identity import KeyPair, PeerId
from lattica._interfaces import addr_host_key
from lattica._membership import MemberDown
from lattica._runtime import current_caller, relay_ref
from lattica.config import RelayConfig
from lattica.errors import LatticaError, ProtocolError, RelayRefused
from lattica.logging import get_logger
from lattica.transports import circuit_v2 as v2
from lattica.transports.base import Connection, Stream
from lattica.transports.circuit import HOP, MAX_MESSAGE, STOP, check_answer, limit_wire, parse_connect, refusal
from lattica.transports.splice import TOKEN_LEN, Splice

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._runtime.calls import Calls
    from lattica.transports.tcp import TcpTransport

log = get_logger("lattica.relay")

__all__ = ["RelayConfig", "RelayService", "RelayActor", "relay_ref"]

_CHUNK = 1 << 20
_TIMEOUT = 10.0  # seconds for the stop side to answer
_SPLICE_WAIT = 5.0  # seconds for both ends' spliced sockets to arrive (the dialer then falls back)
_HOLDER_PING = 2.0  # seconds a holder membership holds down has to answer a ping on its connection


@dataclass(slots=True)
class _Reservation:
    expires: float  # wall clock (sent to the peer)
    ip: str
    libp2p: bool = False  # made with circuit relay v2: circuits to the peer use its stop protocol
    stranger: bool = False  # held by a peer outside our mesh (strangers together hold at most half)


# our refusal codes as circuit relay v2's statuses
_V2_STATUS = {
    "PERMISSION_DENIED": v2.Status.PERMISSION_DENIED,
    "MALFORMED": v2.Status.MALFORMED_MESSAGE,
    "NO_RESERVATION": v2.Status.NO_RESERVATION,
    "RESOURCE_LIMIT": v2.Status.RESOURCE_LIMIT_EXCEEDED,
    "CONNECTION_FAILED": v2.Status.CONNECTION_FAILED,
    "RESERVATION_REFUSED": v2.Status.RESERVATION_REFUSED,
}


def _v2_limit(duration: float | None, data: int | None) -> v2.Limit:
    return v2.Limit(int(duration or 0), int(data or 0))


def _tighter(a: Any, b: Any) -> Any:
    """The smaller of two limits, None meaning unlimited."""
    return b if a is None else a if b is None else min(a, b)


def _may_splice(conn: Connection) -> bool:
    """The peer may reach our TCP listener for a spliced socket: it dialed it, or it reached us over
    QUIC (it then tries our TCP address on the same IP, and declines or falls back if it cannot)."""
    return (conn.transport == "tcp" and conn.direction == "inbound") or conn.transport == "quic"


class RelayService:
    """Reservations and circuits on the node loop."""

    def __init__(self, runtime: Calls, config: RelayConfig | None = None, keypair: KeyPair | None = None) -> None:
        self.rt = runtime
        self.host: HostView = runtime.host
        self.cfg = config or RelayConfig()
        self.keypair = keypair  # signs circuit relay v2's vouchers (None: libp2p nodes cannot reserve)
        self.reservations: dict[PeerId, _Reservation] = {}
        self.circuits: dict[PeerId, int] = {}
        self.total_circuits = 0
        self.stranger_circuits = 0  # opened by peers outside our mesh (at most half of max_circuits)
        # strangers' circuits: by the stranger that opened them, by the host it came from
        # (("from", IP)), and by target (("to", PeerId): strangers get half of a target's share)
        self._opened_by: dict[Any, int] = {}
        self.spliced_circuits = 0  # of total_circuits: those on their own sockets
        self.bytes_relayed = 0
        self._pending_splices: dict[bytes, Splice] = {}  # token -> splice waiting for that end's socket
        self.host.set_handler(HOP, self._on_hop)
        if keypair is not None:
            self.host.set_handler(v2.HOP, self._on_hop_v2)
        self.host.events.disconnected.subscribe(self._on_disconnect)
        self.host.events.membership_changed.subscribe(self._on_membership)

    # -- reservations ---------------------------------------------------------------------------

    def _direct_conn(self, peer: PeerId) -> Connection | None:
        # the primary one first: when a peer dials us again while an older connection looks open
        # (its NAT forgot the mapping: the old one is dead but we cannot know yet), new streams
        # belong on the newer one
        primary = self.host.conns.get(peer)
        if primary is not None and not primary.is_closed and primary.transport != "relay":
            return primary
        for conn in self.host.conns_of.get(peer, ()):
            if not conn.is_closed and not conn.going_away and conn.transport != "relay":
                return conn
        return None

    def reserve(self, peer: PeerId, libp2p: bool = False) -> dict:
        """Grant or renew ``peer``'s reservation (``libp2p``: through circuit relay v2); raises
        RelayRefused."""
        conn = self._direct_conn(peer)
        why = self._refuse_reservation(peer, conn)
        if why is not None:
            raise RelayRefused(why[1])
        assert conn is not None
        expires = self._grant(peer, conn, libp2p)
        addrs = [str(a) for a in self.host.advertised_addrs() if not a.is_circuit]
        return {"expires": expires, "addrs": addrs, "limit": limit_wire(*self._limits(peer, peer))}  # between strangers

    def _grant(self, peer: PeerId, conn: Connection, libp2p: bool) -> float:
        """Record ``peer``'s reservation (checked by ``_refuse_reservation``); when it expires."""
        expires = time.time() + self.cfg.reservation_ttl
        stranger = self.host.circle_of(peer) == "stranger"
        self.reservations[peer] = _Reservation(expires, addr_host_key(conn.remote_addr), libp2p, stranger)
        self.host.protect(peer, "relay-reservation")
        return expires

    def _refuse_reservation(self, peer: PeerId, conn: Connection | None) -> tuple[str, str] | None:
        if conn is None:
            return "RESERVATION_REFUSED", "reservations are made over a direct connection to the relay"
        self._sweep()
        ip, cfg = addr_host_key(conn.remote_addr), self.cfg
        held = self.reservations.get(peer)
        if held is None:
            if len(self.reservations) >= cfg.max_reservations:
                return "RESOURCE_LIMIT", f"this relay holds its maximum of {cfg.max_reservations} reservations"
            strangers = sum(1 for r in self.reservations.values() if r.stranger)
            if self.host.circle_of(peer) == "stranger" and strangers >= cfg.max_reservations // 2:
                return (
                    "RESOURCE_LIMIT",
                    "peers outside this relay's mesh hold half of its reservations (the rest is kept for members)",
                )
        if held is None or held.ip != ip:  # (a renewal from another address counts there)
            same_ip = sum(1 for p, r in self.reservations.items() if r.ip == ip and p != peer)
            if same_ip >= cfg.max_reservations_per_ip:
                return "RESOURCE_LIMIT", f"{ip} already holds {same_ip} reservations here (the limit per address)"
        return None

    def _drop(self, peer: PeerId) -> None:
        if self.reservations.pop(peer, None) is not None:
            self.host.unprotect(peer, "relay-reservation")

    def _sweep(self) -> None:
        now = time.time()
        for peer, r in list(self.reservations.items()):
            if r.expires <= now or self._direct_conn(peer) is None:
                self._drop(peer)

    def _on_disconnect(self, peer: PeerId, conn: Connection) -> None:
        self._drop(peer)

    def _on_membership(self, event: Any) -> None:
        # a holder declared dead or gone: circuits to it would wait on a connection nobody closed
        # (a frozen peer's, or a SIGKILLed peer's QUIC connection until its idle timeout). The
        # verdict is hearsay any member can spread, so the holder is asked before it loses anything.
        if isinstance(event, MemberDown):
            try:
                peer = PeerId.from_string(event.member.id)
            except LatticaError:
                return
            if peer in self.reservations:
                self.host.spawn(self._check_holder(peer))

    async def _check_holder(self, peer: PeerId) -> None:
        """Keep ``peer``'s reservation if it answers one ping on its connection within
        ``_HOLDER_PING`` seconds, else drop it."""
        conn = self._direct_conn(peer)
        if conn is not None:
            try:
                async with asyncio.timeout(_HOLDER_PING):
                    stream = await self.host.open_stream_on(conn, ping.PROTOCOL)
                    try:
                        await ping.measure(stream, 1)
                    finally:
                        stream.reset()
                return
            except (LatticaError, TimeoutError) as e:
                log.info(
                    "dropping the reservation of a holder held down",
                    peer=str(peer),
                    reason=str(e) or "no answer to a ping",
                )
        self._drop(peer)

    def has_reservation(self, peer: PeerId) -> bool:
        r = self.reservations.get(peer)
        return r is not None and r.expires > time.time()

    def status(self) -> dict:
        self._sweep()
        return {
            "reservations": len(self.reservations),
            "circuits": self.total_circuits,
            "spliced": self.spliced_circuits,
            "bytes_relayed": self.bytes_relayed,
            "limit": limit_wire(self.cfg.circuit_duration, self.cfg.circuit_bytes),
        }

    # -- circuits -------------------------------------------------------------------------------

    async def _on_hop(self, stream: Stream, conn: Connection) -> None:
        src = conn.remote_peer
        try:
            async with asyncio.timeout(_TIMEOUT):
                msg = await read_message(stream, MAX_MESSAGE)
                target = parse_connect(msg)
        except (TimeoutError, LatticaError) as e:
            log.info("bad hop request", peer=str(src), reason=str(e) or "timeout")
            stream.reset()
            return
        await self.host.peer_info(conn, _TIMEOUT)  # its circle sets the circuit's limits
        stranger = self.host.circle_of(src) == "stranger"
        why = self._refuse(src, target, conn)
        if why is not None:
            await self._answer(stream, refusal(*why))
            return
        ip = addr_host_key(conn.remote_addr)
        self._count(src, target, +1, stranger, ip)
        duration, budget = self._limits(src, target)
        splice = self.cfg.splice and msg.get("splice") is True and _may_splice(conn) and self._take_spliced_sockets()
        try:
            other, target_token, libp2p = await self._connect_target(src, target, splice, (duration, budget))
        except (TimeoutError, LatticaError) as e:
            self._count(src, target, -1, stranger, ip)
            await self._answer(
                stream, refusal("CONNECTION_FAILED", f"{target} did not take the circuit: {e or 'timeout'}")
            )
            return
        try:
            answer = {"ok": True, "limit": limit_wire(duration, budget)}
            if libp2p:
                answer["libp2p"] = True  # the target speaks libp2p's stack on the circuit: so must the source
            if target_token is None:
                write_message(stream, answer)
                await self._splice(stream, other, duration, budget)
                return
            source_token = os.urandom(TOKEN_LEN)
            write_message(stream, {**answer, "splice": source_token})
            await self._run_spliced(duration, budget, source_token, target_token)
        finally:
            self._count(src, target, -1, stranger, ip)
            if target_token is not None:
                stream.reset()
                other.reset()

    async def _run_spliced(self, duration: float | None, budget: int | None, *tokens: bytes) -> None:
        """Wait for both ends' sockets (up to the timeout), then copy between them until it ends."""
        done = asyncio.get_running_loop().create_future()

        def on_bytes(n: int) -> None:
            self.bytes_relayed += n

        def on_end(why: str) -> None:
            log.debug("spliced circuit ended", reason=why)
            if not done.done():
                done.set_result(why)

        splice = Splice(budget=budget, duration=duration, on_bytes=on_bytes, on_end=on_end)
        for t in tokens:
            self._pending_splices[t] = splice
        self.spliced_circuits += 1
        try:
            try:
                await asyncio.wait_for(splice.wait_joined(), _SPLICE_WAIT)
            except TimeoutError:
                splice.close("an end never connected")
            await done
        finally:
            self.spliced_circuits -= 1
            for t in tokens:
                self._pending_splices.pop(t, None)
            splice.close("relay stopped")

    def _take_spliced_sockets(self) -> bool:
        """Have our TCP transport hand us the sockets that open with a splice preamble."""
        tcp = next((t for t in self.host.transports if t.name == "tcp"), None)
        if tcp is None:
            return False
        cast("TcpTransport", tcp).on_splice = self._on_spliced_socket  # the transport named "tcp"
        return True

    def _on_spliced_socket(self, token: bytes, transport: asyncio.Transport, early: bytes) -> bool:
        splice = self._pending_splices.pop(token, None)
        if splice is None:
            return False
        splice.attach(transport, early)
        return True

    def _refuse(self, src: PeerId, target: PeerId, conn: Connection) -> tuple[str, str] | None:
        if conn.transport == "relay":
            return "PERMISSION_DENIED", "circuits are not relayed over relayed connections"
        if target == src or target == self.host.peer_id:
            return "MALFORMED", "a circuit needs two distinct peers other than the relay"
        if not self.has_reservation(target) or self._direct_conn(target) is None:
            return "NO_RESERVATION", f"{target} holds no reservation on this relay"
        if self.total_circuits >= self.cfg.max_circuits:
            return "RESOURCE_LIMIT", f"this relay carries its maximum of {self.cfg.max_circuits} circuits"
        for p in (src, target):
            if self.circuits.get(p, 0) >= self.cfg.max_circuits_per_peer:
                return "RESOURCE_LIMIT", f"{p} already has {self.cfg.max_circuits_per_peer} circuits on this relay"
        if self.host.circle_of(src) == "stranger":
            # (counted by source only: anyone could otherwise use up an honest target's share)
            cfg = self.cfg
            if self._opened_by.get(src, 0) >= cfg.max_circuits_per_stranger:
                return (
                    "RESOURCE_LIMIT",
                    f"{src} already opened {cfg.max_circuits_per_stranger} circuits on this relay (the limit for peers outside its mesh)",
                )
            if self._opened_by.get(("from", addr_host_key(conn.remote_addr)), 0) >= cfg.max_stranger_circuits_per_ip:
                return (
                    "RESOURCE_LIMIT",
                    f"peers outside this relay's mesh opened {cfg.max_stranger_circuits_per_ip} circuits from {addr_host_key(conn.remote_addr)} (the limit per address)",
                )
            if self._opened_by.get(("to", target), 0) >= cfg.max_circuits_per_peer // 2:
                return (
                    "RESOURCE_LIMIT",
                    f"peers outside this relay's mesh hold half of {target}'s circuits (the rest is kept for members)",
                )
            if self.stranger_circuits >= self.cfg.max_circuits // 2:
                return "RESOURCE_LIMIT", "this relay carries its maximum of circuits opened by peers outside its mesh"
        return None

    def _limits(self, src: PeerId, target: PeerId) -> tuple[float | None, int | None]:
        """(duration, bytes) of a circuit: the stranger limits unless a member of our mesh (or
        this node) is at one end; members' circuits have the general ones (unlimited by default)."""
        cfg = self.cfg
        if self.host.circle_of(src) == "stranger" and self.host.circle_of(target) == "stranger":
            return _tighter(cfg.circuit_duration, cfg.stranger_circuit_duration), _tighter(
                cfg.circuit_bytes, cfg.stranger_circuit_bytes
            )
        return cfg.circuit_duration, cfg.circuit_bytes

    def _count(self, src: PeerId, target: PeerId, delta: int, stranger: bool, ip: str) -> None:
        self.total_circuits += delta
        if stranger:
            self.stranger_circuits += delta
            for key in (src, ("from", ip), ("to", target)):
                n = self._opened_by.get(key, 0) + delta
                if n > 0:
                    self._opened_by[key] = n
                else:
                    self._opened_by.pop(key, None)
        for p in (src, target):
            n = self.circuits.get(p, 0) + delta
            if n > 0:
                self.circuits[p] = n
            else:
                self.circuits.pop(p, None)

    async def _connect_target(
        self, src: PeerId, target: PeerId, splice: bool, limits: tuple[float | None, int | None]
    ) -> tuple[Stream, bytes | None, bool]:
        """The stop stream to ``target``, once it accepted, the splice token it took (if any),
        and whether it is circuit relay v2's (the target reserved through it)."""
        conn = self._direct_conn(target)
        if conn is None:
            raise RelayRefused(f"{target} is no longer connected")
        reservation = self.reservations.get(target)
        if reservation is not None and reservation.libp2p:
            return await self._connect_target_v2(src, target, conn, limits), None, True
        other = await self.host.open_stream_on(conn, STOP)
        request = {"type": "connect", "peer": src.to_bytes(), "limit": limit_wire(*limits)}
        token = os.urandom(TOKEN_LEN) if splice and _may_splice(conn) else None
        if token is not None:
            request["splice"] = token
        try:
            async with asyncio.timeout(_TIMEOUT):
                write_message(other, request)
                await other.drain()
                answer = check_answer(await read_message(other, MAX_MESSAGE), f"peer {target.short()}")
        except BaseException:
            other.reset()
            raise
        return other, token if answer.get("splice") is True else None, False

    async def _connect_target_v2(
        self, src: PeerId, target: PeerId, conn: Connection, limits: tuple[float | None, int | None]
    ) -> Stream:
        """Circuit relay v2's stop stream to ``target``, once it accepted."""
        other = await self.host.open_stream_on(conn, v2.STOP)
        try:
            async with asyncio.timeout(_TIMEOUT):
                connect = v2.StopMessage(v2.StopType.CONNECT, v2.RelayPeer(src), _v2_limit(*limits))
                write_delimited(other, v2.encode_stop(connect))
                await other.drain()
                answer = v2.decode_stop(await read_delimited(other, v2.MAX_MESSAGE))
                if answer.type != v2.StopType.STATUS or answer.status != v2.Status.OK:
                    status = answer.status.name if answer.status is not None else answer.type.name
                    raise RelayRefused(f"peer {target.short()} refused the circuit: {status}")
        except BaseException:
            other.reset()
            raise
        return other

    # -- libp2p's circuit relay v2 --------------------------------------------------------------

    async def _on_hop_v2(self, stream: Stream, conn: Connection) -> None:
        """A hop stream in circuit relay v2: RESERVE or CONNECT, answered with a STATUS."""
        src = conn.remote_peer
        try:
            async with asyncio.timeout(_TIMEOUT):
                msg = v2.decode_hop(await read_delimited(stream, v2.MAX_MESSAGE))
        except (TimeoutError, LatticaError) as e:
            log.info("bad hop request", peer=str(src), reason=str(e) or "timeout")
            await self._answer_v2(stream, v2.Status.MALFORMED_MESSAGE)
            return
        if msg.type == v2.HopType.RESERVE:
            await self._reserve_v2(stream, src, conn)
        elif msg.type == v2.HopType.CONNECT and msg.peer is not None:
            await self._circuit_v2(stream, src, msg.peer.peer, conn)
        else:
            await self._answer_v2(
                stream, v2.Status.MALFORMED_MESSAGE if msg.peer is None else v2.Status.UNEXPECTED_MESSAGE
            )

    async def _reserve_v2(self, stream: Stream, peer: PeerId, conn: Connection) -> None:
        await self.host.peer_info(conn, _TIMEOUT)  # its circle: strangers hold at most half
        direct = self._direct_conn(peer) if conn.transport != "relay" else None
        why = self._refuse_reservation(peer, direct)
        if why is not None:
            log.info("refused a reservation", peer=str(peer), reason=why[1])
            await self._answer_v2(stream, _V2_STATUS[why[0]])
            return
        assert direct is not None  # (_refuse_reservation refuses without one)
        expires = int(self._grant(peer, direct, libp2p=True))
        assert self.keypair is not None  # (the handler is set only with a keypair)
        me = self.host.peer_id
        reservation = v2.Reservation(
            expires,
            tuple(a.with_peer_id(me) for a in self.host.advertised_addrs() if not a.is_circuit)[: v2.MAX_ADDRS],
            v2.make_voucher(self.keypair, peer, expires),
        )
        await self._answer_v2(stream, v2.Status.OK, reservation=reservation, limit=_v2_limit(*self._limits(peer, peer)))

    async def _circuit_v2(self, stream: Stream, src: PeerId, target: PeerId, conn: Connection) -> None:
        """CONNECT: circuit relay v2's stop stream to the target (a v2 source runs libp2p's stack
        on the circuit, so a Lattica target that reserved with our protocol takes v2's too: it
        serves both), then bytes both ways under the circuit's limits."""
        await self.host.peer_info(conn, _TIMEOUT)  # its circle sets the circuit's limits
        stranger = self.host.circle_of(src) == "stranger"
        why = self._refuse(src, target, conn)
        if why is not None:
            await self._answer_v2(stream, _V2_STATUS[why[0]])
            return
        ip = addr_host_key(conn.remote_addr)
        self._count(src, target, +1, stranger, ip)
        try:
            duration, budget = self._limits(src, target)
            target_conn = self._direct_conn(target)
            try:
                if target_conn is None:  # (it left since the checks)
                    raise RelayRefused(f"{target} is no longer connected")
                other = await self._connect_target_v2(src, target, target_conn, (duration, budget))
            except (TimeoutError, LatticaError) as e:
                log.info("circuit target refused", target=str(target), reason=str(e) or "timeout")
                await self._answer_v2(stream, v2.Status.CONNECTION_FAILED)
                return
            write_delimited(
                stream,
                v2.encode_hop(v2.HopMessage(v2.HopType.STATUS, limit=_v2_limit(duration, budget), status=v2.Status.OK)),
            )
            await self._splice(stream, other, duration, budget)
        finally:
            self._count(src, target, -1, stranger, ip)

    @staticmethod
    async def _answer_v2(
        stream: Stream, status: v2.Status, *, reservation: v2.Reservation | None = None, limit: v2.Limit | None = None
    ) -> None:
        msg = v2.HopMessage(v2.HopType.STATUS, reservation=reservation, limit=limit, status=status)
        try:
            write_delimited(stream, v2.encode_hop(msg))
            await asyncio.wait_for(stream.close(), _TIMEOUT)
        except (TimeoutError, LatticaError):
            stream.reset()

    @staticmethod
    async def _answer(stream: Stream, msg: dict) -> None:
        try:
            write_message(stream, msg)
            await asyncio.wait_for(stream.close(), _TIMEOUT)
        except (TimeoutError, LatticaError):
            stream.reset()

    async def _splice(self, a: Stream, b: Stream, duration: float | None, limit: int | None) -> None:
        """Copy both ways until both sides end, a limit is hit or either side fails."""
        budget = [limit]

        async def pipe(src: Stream, dst: Stream) -> None:
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    await dst.close()
                    return
                if budget[0] is not None:
                    budget[0] -= len(data)
                    if budget[0] < 0:
                        raise RelayRefused(f"circuit exceeded its limit of {limit} bytes")
                self.bytes_relayed += len(data)
                dst.write(data)
                await dst.drain()

        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(pipe(a, b)), loop.create_task(pipe(b, a))]
        try:
            async with asyncio.timeout(duration):
                await asyncio.gather(*tasks)
        except (TimeoutError, LatticaError, ProtocolError) as e:
            log.debug("circuit ended", reason=str(e) or "duration limit")
            a.reset()
            b.reset()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class RelayActor:
    """What peers call on a relay: ``reserve`` (renew by calling again) and ``status``."""

    NAME = "relay"

    def __init__(self, service: RelayService) -> None:
        self._svc = service

    async def reserve(self) -> dict:
        """Reserve a slot for the caller: ``{expires (unix s), addrs, limit}``."""
        caller = current_caller()
        assert caller is not None
        return self._svc.reserve(caller)

    async def status(self) -> dict:
        return self._svc.status()
