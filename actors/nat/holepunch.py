"""The ``holepunch`` system actor: turns relayed connections into direct ones.

When a relayed connection comes up, the peer that received it (``B``) runs the exchange of
``lattica/nat/_holepunch.py`` with the other (``A``) over that connection, then both execute the plan at
the agreed moment: TCP simultaneous open from the listening port, QUIC from the listening UDP
socket, and many-port probing when one side's NAT maps every destination to a new port. Success
is the first direct connection to the peer, whoever dialed it; the node then makes it the
primary connection, moves new calls to it and lets calls in flight finish on the relay. ``B``
tries up to three times. ``status()`` reports attempts and outcomes (``lattica doctor`` prints it).

With a libp2p peer (one that serves ``/libp2p/dcutr`` and not our protocol) the exchange is
libp2p's DCUtR, in the same roles and timing; the direct connection then runs libp2p's stack.

The same exchange over a direct QUIC connection adds a TCP path (TCP is the fast path): a peer
behind a full-cone NAT is dialed over QUIC at once, and its TCP listening port has no mapping
until it sends a SYN. The QUIC connection's dialer asks; the other sends a SYN from its listening
port (opening its mapping), then the asker dials it plainly (``lattica.nat._holepunch.tcp_only``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from typing import TYPE_CHECKING, Any

from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica._identify import PeerInfo
from lattica._identity import PeerId
from lattica._interfaces import host_key
from lattica._multiaddr import Multiaddr
from lattica._runtime import ASYNC, ActorRef
from lattica.errors import LatticaError
from lattica.logging import get_logger
from lattica.nat import _dcutr_wire as dcutr
from lattica.nat._holepunch import (
    MAX_MESSAGE,
    PROTOCOL,
    DcutrInitiator,
    DcutrResponder,
    Destinations,
    Initiator,
    Punch,
    Responder,
    aim,
    is_probe,
    probe_packet,
    probe_ports,
    tcp_only,
)

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._runtime.calls import Calls
    from lattica.transports.base import Connection, Stream

log = get_logger("lattica.holepunch")

__all__ = ["HolePunchService", "HolePunchActor", "holepunch_ref"]

ATTEMPTS = 3
WINDOW = 3.0  # s a punch waits for a direct connection
BIRTHDAY_WINDOW = 8.0  # ... when probing many ports
SPRAY_SOCKETS = 256  # sockets the hard side opens: with 1,000 probes/s a hit is expected in ~0.25 s
PROBE_RATE = 1000.0  # probes per second from the easy side
_TICK = 0.02
_RESEND = 0.25  # s between punch datagram rounds
TCP_GRACE = 1.0  # s a TCP punch under way may still finish once QUIC got through (TCP is the fast path)
_MAX_ACTIVE = 32  # punches at once (strangers together: half of them)
_MAX_SPRAYS = 2  # of which hard-side sprays (each holds SPRAY_SOCKETS sockets)
_EXCHANGE_TIMEOUT = 10.0
_ROUNDS_PER_MINUTE = 6  # punches one peer may ask of us (each can mean thousands of probes)
_RECENT = 32
_TCP_ONLY_WAIT = 15.0  # s a TCP-only punch waits for the punch that brought its QUIC connection
_MAX_TCP_ONLY = 8  # TCP-only punches at once (their own budget: they cannot take relayed punches' slots)
_TCP_ONLY_TARGETS = 2  # TCP candidates a TCP-only punch connects to
_TCP_ONLY_EXCHANGE = 3.0  # s a TCP-only exchange may take (a slot held by a silent peer comes back soon)
_TCP_ONLY_PER_IP = 6  # TCP-only punches we answer per IP (v4 address or v6 /64) per minute


def _via(conn: Connection) -> str | None:
    """The IP an exchange on ``conn`` came over: a relayed connection's relay, else the peer's."""
    parts = list(conn.remote_addr)
    return str(parts[0][1]) if parts and parts[0][0] in ("ip4", "ip6") else None


def holepunch_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s holepunch actor."""
    return ActorRef(peer, "holepunch", {"status": ASYNC})


class HolePunchService:
    """Hole punches on the node loop (both roles)."""

    def __init__(self, runtime: Calls) -> None:
        self.host: HostView = runtime.host
        self.host.set_handler(PROTOCOL, self._on_stream)
        self.host.set_handler(dcutr.PROTOCOL, self._on_dcutr)
        self.host.events.identified.subscribe(self._on_identified)
        self.active: set[PeerId] = set()
        self.tcp_active: set[PeerId] = set()  # TCP-only punches (a budget of their own)
        self._asked_ip: dict[str, list[float]] = {}  # when each IP last asked us for a TCP-only punch
        self._sprays = 0
        self._waiting: dict[PeerId, tuple[asyncio.Future[Connection], str | None]] = {}  # (future, transport wanted)
        self._asked: dict[PeerId, list[float]] = {}  # when each peer last asked us to punch
        self.counts = {"attempts": 0, "direct": 0, "failed": 0, "refused": 0}
        self._responding: dict[PeerId, asyncio.Event] = {}  # peers we are answering, set when done
        self._destinations = Destinations(clock=self.host.loop.time)  # attempts per destination host
        self.recent: collections.deque[dict] = collections.deque(maxlen=_RECENT)

    # -- what we tell the peer ----------------------------------------------------------------

    async def _mine(self) -> tuple[list[Multiaddr], str]:
        """Our candidate addresses, those at an IP peers observe first (the peer probes the first),
        and our mapping type (observed now if a fresh node does not know it yet)."""
        nat = self.host.nat
        assert nat is not None
        mapping = await nat.learn_mapping()
        return self._candidates(), mapping

    def _candidates(self) -> list[Multiaddr]:
        """Our candidate addresses, those at an IP peers observe first."""
        nat = self.host.nat
        assert nat is not None
        seen = {Multiaddr(o).host_port()[0] for _, o, _ in nat.observations()}
        return sorted(nat.candidates(), key=lambda a: a.host_port()[0] not in seen)

    def _dcutr_only(self, conn: Connection) -> bool:
        """The peer punches with libp2p's DCUtR, not with our protocol."""
        info = self.host.info.get(conn)
        return info is not None and PROTOCOL not in info.protocols and dcutr.PROTOCOL in info.protocols

    def _slot_free(self, peer: PeerId) -> bool:
        """Room for a punch with ``peer``: _MAX_ACTIVE at once, of which strangers hold at most
        half (a stranger that never answers holds its slot for the exchange's timeout, and
        identities are free to make: members of our mesh are still punched meanwhile)."""
        if len(self.active) >= _MAX_ACTIVE:
            return False
        circle = self.host.circle_of
        return circle(peer) != "stranger" or sum(circle(p) == "stranger" for p in self.active) < _MAX_ACTIVE // 2

    def _direct(self, peer: PeerId, want: str | None = None) -> bool:
        """Whether the peer's primary connection is direct (and over ``want``, if given)."""
        conn = self.host.conns.get(peer)
        return conn is not None and not conn.is_closed and conn.transport != "relay" and want in (None, conn.transport)

    def _on_identified(self, info: PeerInfo) -> None:
        """A peer identified on a connection: the host has weighed it against the peer's primary
        by now (lattica/_host/connections.py), so a punch waiting for a direct path may end."""
        fut, want = self._waiting.get(info.peer_id, (None, None))
        conn = self.host.conns.get(info.peer_id)
        if (
            fut is not None
            and not fut.done()
            and conn is not None
            and conn.transport != "relay"
            and want in (None, conn.transport)
        ):
            fut.set_result(conn)

    # -- B: the relayed connection's receiver starts ------------------------------------------

    async def punch(self, conn: Connection) -> bool:
        """Try up to ATTEMPTS times to reach ``conn``'s peer directly; True once a direct
        connection is the primary one."""
        peer = conn.remote_peer
        if peer in self.active or peer in self.tcp_active or not self._slot_free(peer):
            return False
        self.active.add(peer)
        t0 = time.perf_counter()
        try:
            for attempt in range(1, ATTEMPTS + 1):
                if self._direct(peer) or conn.is_closed or self.host.closing:
                    break
                try:
                    punch = await self._exchange(conn)
                except (TimeoutError, LatticaError) as e:
                    self._record(peer, "refused", t0, attempt, None, reason=str(e) or "timeout")
                    return False
                if await self._run(peer, punch, initiator=True, via=_via(conn)):
                    self._record(peer, "direct", t0, attempt, punch)
                    return True
                self._record(peer, "failed", t0, attempt, punch)
            return self._direct(peer)
        finally:
            self.active.discard(peer)

    async def punch_tcp(self, conn: Connection) -> bool:
        """Over a direct QUIC connection, add a TCP path to its peer: True once a TCP connection
        is the primary one. A punch that brought the QUIC connection may still be finishing on
        either side (or the peer may be asking us at the same moment): we wait for ours, and ask
        again once, after a random pause, if the exchange did not go through."""
        peer, host = conn.remote_peer, self.host
        if host.tcp_transport() is None or host.nat is None:
            return False
        deadline = host.loop.time() + _TCP_ONLY_WAIT
        t0 = time.perf_counter()
        for attempt in (1, 2):
            while peer in self.active or peer in self.tcp_active:  # (a punch of this peer, ending)
                if host.loop.time() > deadline or conn.is_closed:
                    return self._direct(peer, "tcp")
                await asyncio.sleep(0.1)
            if self._direct(peer, "tcp") or conn.is_closed or host.closing or len(self.tcp_active) >= _MAX_TCP_ONLY:
                return self._direct(peer, "tcp")
            self.tcp_active.add(peer)
            try:
                try:
                    punch = await self._exchange(conn, _TCP_ONLY_EXCHANGE)
                except (TimeoutError, LatticaError) as e:
                    if attempt == 2:
                        self._record(peer, "refused", t0, attempt, None, reason=str(e) or "timeout")
                        return False
                    punch = None
                if punch is None:
                    self.tcp_active.discard(peer)
                    await asyncio.sleep(0.5 + random.random())  # (out of step with a peer asking too)
                    continue
                punch.plan = tcp_only(punch.theirs, conn.remote_addr.host_port()[0], asker=True, nats=punch.nats)
                del punch.plan.tcp_targets[_TCP_ONLY_TARGETS:]
                if not punch.plan.tcp_targets:
                    self._record(peer, "failed", t0, attempt, punch, reason="no TCP candidate at the peer's address")
                    return False
                ok = await self._run(peer, punch, initiator=True, want="tcp", via=_via(conn))
                self._record(peer, "direct" if ok else "failed", t0, attempt, punch)
                return ok
            finally:
                self.tcp_active.discard(peer)
        return self._direct(peer, "tcp")

    def _may_ask_tcp(self, conn: Connection) -> bool:
        """At most _TCP_ONLY_PER_IP TCP-only punches a minute for one IP, whatever the PeerIds."""
        ip = host_key(conn.remote_addr.host_port()[0])
        now = self.host.loop.time()
        times = [t for t in self._asked_ip.get(ip, ()) if now - t < 60.0]
        if len(times) >= _TCP_ONLY_PER_IP:
            return False
        self._asked_ip[ip] = times + [now]
        if len(self._asked_ip) > 4096:
            del self._asked_ip[next(iter(self._asked_ip))]
        return True

    async def _exchange(self, conn: Connection, timeout: float = _EXCHANGE_TIMEOUT) -> Punch:
        if self._dcutr_only(conn):
            return await self._exchange_dcutr(conn, timeout)
        stream = await self.host.open_stream_on(conn, PROTOCOL)
        try:
            init = Initiator(*await self._mine())
            async with asyncio.timeout(timeout):
                write_message(stream, init.start(self.host.loop.time()))
                answer = await read_message(stream, MAX_MESSAGE)
            sync, punch = init.receive(answer, self.host.loop.time())
            write_message(stream, sync)
            await stream.close()
            return punch
        except BaseException:
            stream.reset()
            raise

    async def _exchange_dcutr(self, conn: Connection, timeout: float) -> Punch:
        """``B``'s side of DCUtR: CONNECT, the peer's CONNECT (the RTT), SYNC."""
        stream = await self.host.open_stream_on(conn, dcutr.PROTOCOL)
        try:
            init = DcutrInitiator(self._candidates())
            async with asyncio.timeout(timeout):
                write_delimited(stream, dcutr.encode(init.start(self.host.loop.time())))
                answer = dcutr.decode(await read_delimited(stream, dcutr.MAX_MESSAGE))
            sync, punch = init.receive(answer, self.host.loop.time())
            write_delimited(stream, dcutr.encode(sync))
            await stream.close()
            return punch
        except BaseException:
            stream.reset()
            raise

    # -- A: the relayed connection's dialer answers -------------------------------------------

    async def _on_dcutr(self, stream: Stream, conn: Connection) -> None:
        """``A``'s side of DCUtR, for a libp2p peer that received our relayed connection: answer
        its CONNECT with our addresses (at once: the peer times the round trip), punch on SYNC."""
        peer = conn.remote_peer
        if (
            conn.transport != "relay"
            or conn.direction != "outbound"
            or peer in self.active
            or peer in self.tcp_active
            or not self._slot_free(peer)
            or self._direct(peer)
            or not self._may_ask(peer)
        ):
            # only a relayed peer has a reason to punch, and only the one that received the
            # relayed connection asks (go and rust refuse the other way round too): anyone else
            # would make us send packets to addresses of their choosing
            self.counts["refused"] += 1
            stream.reset()
            return
        self.active.add(peer)
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(_EXCHANGE_TIMEOUT):
                resp = DcutrResponder(self._candidates())
                answer = resp.receive(dcutr.decode(await read_delimited(stream, dcutr.MAX_MESSAGE)))
                assert not isinstance(answer, Punch)
                write_delimited(stream, dcutr.encode(answer))
                await stream.drain()
                punch = resp.receive(dcutr.decode(await read_delimited(stream, dcutr.MAX_MESSAGE)))
            assert isinstance(punch, Punch)
            await stream.close()  # (our side is done, as go's is)
            ok = await self._run(peer, punch, initiator=False, via=_via(conn))
            self._record(peer, "direct" if ok else "failed", t0, None, punch)
        except (TimeoutError, LatticaError) as e:
            self._record(peer, "refused", t0, None, None, reason=str(e) or "timeout")
        finally:
            self.active.discard(peer)
            stream.reset()  # what the peer sends after SYNC (a flood of them) is not kept

    async def _on_stream(self, stream: Stream, conn: Connection) -> None:
        peer = conn.remote_peer
        want = "tcp" if conn.transport == "quic" else None  # over direct QUIC: adding TCP only
        if conn.transport == "relay" and conn.direction != "outbound":
            # the relayed connection's receiver asks (``punch``), never its dialer: a stranger
            # that reached us through a relay would aim our packets (and probes) where it likes
            log.info("refusing hole punch: the peer dialed this relayed connection", peer=str(peer))
            self.counts["refused"] += 1
            stream.reset()
            return
        if conn.transport != "relay" and (
            want is None or self._direct(peer, "tcp") or self.host.tcp_transport() is None or self.host.nat is None
        ):
            # only a relayed peer has a reason to punch (or one we reach over QUIC, to add TCP);
            # anyone else would make us send packets to addresses of their choosing
            log.info("refusing hole punch: not on a relayed or QUIC connection", peer=str(peer))
            self.counts["refused"] += 1
            stream.reset()
            return
        previous = self._responding.get(peer)
        if previous is not None:
            # the peer's next attempt can arrive while we still finish answering its last one
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_EXCHANGE_TIMEOUT):
                    await previous.wait()
        if (
            peer in self.active
            or peer in self.tcp_active
            or (len(self.tcp_active) >= _MAX_TCP_ONLY if want else not self._slot_free(peer))
            or self._direct(peer, want)
            or not self._may_ask(peer)
            or (want is not None and not self._may_ask_tcp(conn))
        ):
            self.counts["refused"] += 1
            stream.reset()
            return
        slots = self.tcp_active if want else self.active
        slots.add(peer)
        done = self._responding[peer] = asyncio.Event()
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(_TCP_ONLY_EXCHANGE if want else _EXCHANGE_TIMEOUT):
                connect = await read_message(stream, MAX_MESSAGE)
                arrived = time.perf_counter()
                resp = Responder(*await self._mine())  # may observe our mapping first (up to 1 s)
                write_message(stream, resp.receive(connect, held=time.perf_counter() - arrived))
                punch = resp.receive(await read_message(stream, MAX_MESSAGE))
            assert isinstance(punch, Punch)
            await stream.close()
            if want is not None:
                punch.plan = tcp_only(punch.theirs, conn.remote_addr.host_port()[0], asker=False, nats=punch.nats)
                del punch.plan.tcp_targets[_TCP_ONLY_TARGETS:]
                if not punch.plan.tcp_targets:
                    self._record(peer, "failed", t0, None, punch, reason="no TCP candidate at the peer's address")
                    return
            ok = await self._run(peer, punch, initiator=False, want=want, via=_via(conn))
            stream.reset()  # (long done with: what the peer still sends on it is not kept)
            self._record(peer, "direct" if ok else "failed", t0, None, punch)
        finally:
            slots.discard(peer)
            if self._responding.get(peer) is done:
                del self._responding[peer]
            done.set()

    def _may_ask(self, peer: PeerId) -> bool:
        now = self.host.loop.time()
        times = [t for t in self._asked.get(peer, ()) if now - t < 60.0]
        if len(times) >= _ROUNDS_PER_MINUTE:
            return False
        self._asked[peer] = times + [now]
        if len(self._asked) > 4096:
            del self._asked[next(iter(self._asked))]
        return True

    # -- both: execute the plan ------------------------------------------------------------------

    async def _run(
        self, peer: PeerId, punch: Punch, initiator: bool, want: str | None = None, via: str | None = None
    ) -> bool:
        """Execute ``punch.plan`` as far as :func:`aim` (``via``: the IP the exchange came over)
        and the destination budget allow (a TCP-only punch aims at the peer's own address: its
        own budget); True when a direct connection (over ``want``, if given) to ``peer`` came up
        in time."""
        host = self.host
        plan = punch.plan = aim(punch.plan, via)
        if want is None:
            plan, spent = self._destinations.admit(plan)
            punch.plan = plan
            if spent:
                log.info("hole punch: destinations aimed at too often lately left out", peer=str(peer), hosts=spent)
        self.counts["attempts"] += 1
        fut: asyncio.Future[Connection] = host.loop.create_future()
        self._waiting[peer] = (fut, want)
        if self._direct(peer, want):
            # the peer's dial may come through (and identify) while our half of the exchange was
            # still closing its stream, before this wait began: that is the punch's success too
            fut.set_result(host.conns[peer])
        tasks: list[asyncio.Task] = []
        sprayed: list = []
        hit: list = []
        keep: list[asyncio.Task] = []  # TCP punches that outlive the punch by TCP_GRACE
        quic = host.quic_transport() if plan.quic_targets else None
        payload = probe_packet(punch.token)
        targets = [a.host_port() for a in plan.quic_targets]  # (MAX_TARGETS at most: aim)
        spraying = plan.spray and quic is not None and self._sprays < _MAX_SPRAYS
        window = BIRTHDAY_WINDOW if spraying or plan.probe_ips else WINDOW

        def dial_quic(addr: Multiaddr, via: Any = None) -> None:
            tasks.append(host.spawn(self._dial(peer, lambda: quic.dial(addr, peer, via=via))))  # type: ignore[union-attr]

        def on_hit(ep: Any, data: bytes, sender: tuple) -> None:
            # dial from the first sockets a probe reached; more would only be refused
            if len(hit) < 2 and ep not in hit and is_probe(data, punch.token) and not fut.done():
                hit.append(ep)
                dial_quic(Multiaddr.from_sockaddr(sender, "quic-v1"), via=ep)

        contacts = (
            (() if plan.tcp_dial else plan.tcp_targets),
            plan.quic_targets,
        )  # (a plain dial leaves from another port)
        for transport, targets_of in zip(("tcp", "quic"), contacts):
            for a in targets_of:
                host.note_contact(a.host_port()[0], transport)
        try:
            if quic is not None:
                self._send(quic, targets, payload)  # opens our side's filter for the peer
                tasks.append(host.spawn(self._keep_punching(quic, targets, payload, window)))
            if punch.delay:
                await asyncio.sleep(punch.delay)
            tcp = host.tcp_transport()
            if plan.tcp_dial:  # (a TCP-only punch's asker: the opener's SYN has left by now)
                tcp_tasks = [
                    host.spawn(self._dial(peer, lambda a=addr: tcp.dial(a, peer)))
                    for addr in (plan.tcp_targets if tcp is not None else ())
                ]
            else:
                tcp_tasks = [
                    host.spawn(
                        self._dial(
                            peer,
                            lambda a=addr: tcp.punch(
                                a, peer, initiator=plan.tcp_initiator, timeout=window, libp2p=punch.libp2p
                            ),
                        )
                    )
                    for addr in (plan.tcp_targets if tcp is not None else ())
                ]
            tasks += tcp_tasks
            if quic is not None and plan.quic_dial:
                for addr in plan.quic_targets:
                    dial_quic(addr)
            if spraying:
                self._sprays += 1
                try:
                    sprayed = await quic.spray(targets, SPRAY_SOCKETS, payload, on_hit)  # type: ignore[union-attr]
                finally:
                    self._sprays -= 1
            if quic is not None and plan.probe_ips:
                tasks.append(host.spawn(self._probe(quic, plan.probe_ips, payload, window)))
            try:
                first = await asyncio.wait_for(asyncio.shield(fut), window)
            except TimeoutError:
                first = None
            if want == "tcp":
                # a TCP-only punch: another TCP connection (an AutoNAT dial-back, say) may have
                # ended the wait; our own dials and SYNs finish anyway, within their timeout
                keep = [t for t in tcp_tasks if not t.done()]
            elif first is not None and first.transport != "tcp":
                # QUIC got through first; both ends are also opening TCP at once, and a TCP path,
                # if it comes, becomes the primary one (lattica/_host/connections.py): the TCP
                # punches under way get a moment more
                keep = [t for t in tcp_tasks if not t.done()]
            return self._direct(peer, want)
        except LatticaError as e:
            log.info("hole punch failed", peer=str(peer), reason=str(e))
            return self._direct(peer, want)
        finally:
            if self._waiting.get(peer, (None,))[0] is fut:
                del self._waiting[peer]
            for t in tasks:
                if t not in keep:
                    t.cancel()
            if keep:
                host.loop.call_later(TCP_GRACE, lambda: [t.cancel() for t in keep])
            if sprayed:
                # every socket a punch got through from stays while its connection lives: two
                # may have got through, and the host may have made either the primary one
                quic.close_spray(sprayed)  # type: ignore[union-attr]

    async def _dial(self, peer: PeerId, dial: Any) -> None:
        try:
            conn = await dial()
        except (LatticaError, OSError) as e:
            log.debug("hole punch dial failed", peer=str(peer), reason=str(e))
            return
        if self.host.closing or conn.remote_peer != peer:
            conn.abort("not needed")
            return
        self.host.adopt(conn)

    @staticmethod
    def _send(quic: Any, targets: list[tuple], payload: bytes) -> None:
        for t in targets:
            try:
                quic.send_raw(t, payload)
            except LatticaError:
                pass

    async def _keep_punching(self, quic: Any, targets: list[tuple], payload: bytes, window: float) -> None:
        end = self.host.loop.time() + window
        while self.host.loop.time() < end:
            await asyncio.sleep(_RESEND)
            self._send(quic, targets, payload)

    async def _probe(self, quic: Any, ips: list[str], payload: bytes, window: float) -> None:
        """The easy side of many-port probing: datagrams to random ports at the hard side's IPs,
        until the window closes (the caller cancels us on success)."""
        per_tick = max(1, int(PROBE_RATE * _TICK))
        ports = probe_ports(int(PROBE_RATE * window))
        for i in range(0, len(ports), per_tick):
            for port in ports[i : i + per_tick]:
                self._send(quic, [(ip, port) for ip in ips], payload)
            await asyncio.sleep(_TICK)

    # -- reporting ---------------------------------------------------------------------------------

    def _record(
        self, peer: PeerId, outcome: str, t0: float, attempt: int | None, punch: Punch | None, reason: str = ""
    ) -> None:
        if outcome in ("direct", "failed"):
            self.counts[outcome] += 1
        conn = self.host.conns.get(peer)
        entry = {
            "peer": str(peer),
            "outcome": outcome,
            "ms": round((time.perf_counter() - t0) * 1e3, 1),
            "attempt": attempt,
            "path": conn.transport if conn is not None else None,
            "rtt_ms": round(punch.rtt * 1e3, 2) if punch is not None and punch.rtt is not None else None,
            "mode": ("birthday" if punch.plan.spray or punch.plan.probe_ips else "simultaneous") if punch else None,
        }
        if reason:
            entry["reason"] = reason[:200]
        self.recent.append(entry)
        log.info("hole punch", **entry)

    def status(self) -> dict:
        return {**self.counts, "active": len(self.active), "recent": list(self.recent)}


class HolePunchActor:
    """``holepunch``: what this node's hole punches did."""

    NAME = "holepunch"

    def __init__(self, service: HolePunchService) -> None:
        self._service = service

    async def status(self) -> dict:
        return self._service.status()
