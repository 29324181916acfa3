"""Where we stand behind NATs: AutoNAT probes, the mapping type, and relay reservations.

``NatManager`` runs on the node loop. When the node has a non-loopback address and peers to ask,
it asks up to three of them (their ``autonat`` actors) to dial it back, and up to three libp2p
peers with AutoNAT v2 or v1 (``libp2p_autonat``), and believes only the dial-backs that actually
arrive: one from a host we never contacted means *public*; none means *private*. The mapping type comes from the addresses different peers observe for our listening
UDP socket (QUIC dials leave from it): one port for every observer is endpoint-independent, several
are endpoint-dependent (symmetric). A private node keeps reservations on up to ``max_relays``
relays, replaces a relay that goes away, and publishes its ``/p2p-circuit`` addresses in its signed
peer record.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from lattica import _context as context
from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica._identity import PeerId
from lattica._interfaces import host_key, ip_of, is_loopback
from lattica._membership import SelfDowned
from lattica._multiaddr import Multiaddr
from lattica._runtime.refs import autonat_ref, relay_ref
from lattica.config import NatConfig
from lattica.errors import LatticaError, ProtocolError, RelayRefused
from lattica.logging import get_logger
from lattica.nat import _autonat_v1_wire as autonat_v1
from lattica.nat import _autonat_v2_wire as autonat_v2
from lattica.nat._autonat_v2_client import Outcome, Verdict
from lattica.transports import circuit_v2 as v2
from lattica.transports.circuit import HOP, circuit_addr

if TYPE_CHECKING:
    from lattica._host.host import Host
    from lattica.transports.base import Connection, Stream

log = get_logger("lattica.nat")

__all__ = ["NatStatus", "NatManager", "LibP2PAutoNat", "classify_mapping"]

DIALBACK = "/lattica/autonat/dialback/1"  # the stream an AutoNAT server's dial-back arrives on
PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"
_MAX_CANDIDATES = 4  # observed addresses advertised while reachability is unknown
_CONTACT_MEMORY = 600.0  # s: longer than NATs keep a filter entry open after our last packet
_MIN_RESERVATION = 60.0  # s: the shortest reservation we take a relay's word for
_MAX_RESERVATION = 3600.0  # s: the longest reservation we take a relay's word for (renewed at half)
_RESERVE_TIMEOUT = 10.0  # s for a relay to grant a reservation
INDEPENDENT, DEPENDENT = "endpoint-independent", "endpoint-dependent"


@dataclass
class NatStatus:
    """What ``lattica.nat_status()`` returns."""

    reachability: str = UNKNOWN  # "public" | "private" | "unknown"
    mapping: str = UNKNOWN  # "endpoint-independent" | "endpoint-dependent" | "unknown"
    observed: list[str] = field(default_factory=list)  # our addresses as peers see them
    public: list[str] = field(default_factory=list)  # addresses a stranger reached us at
    relays: list[str] = field(default_factory=list)  # our /p2p-circuit addresses
    reason: str = "not checked yet"
    checked_at: float | None = None  # unix time of the last AutoNAT round


def classify_mapping(observations: list[tuple[str, str]]) -> str:
    """The NAT mapping type from ``(observer IP, observed address)`` pairs for one local socket."""
    ports: dict[str, set[str]] = {}
    for observer, observed in observations:
        ports.setdefault(observer, set()).add(observed)
    if len(ports) < 2:
        return UNKNOWN
    seen = set().union(*ports.values())
    return INDEPENDENT if len(seen) == 1 else DEPENDENT


class LibP2PAutoNat(Protocol):
    """What asks libp2p peers to dial us back (AutoNAT v2's and v1's client, ``actors/nat/autonat_client.py``)."""

    async def check(self, servers: list[PeerId], cands: list[Multiaddr]) -> list[Verdict]: ...


@dataclass(slots=True)
class _Relay:
    peer: PeerId
    addrs: list[Multiaddr]
    expires: float
    renew: asyncio.TimerHandle | None = field(init=False, default=None)


class NatManager:
    def __init__(
        self,
        host: Host,
        config: NatConfig | None = None,
        relays: list[Multiaddr] | None = None,
        relaying: bool = False,
        libp2p_autonat: LibP2PAutoNat | None = None,
    ) -> None:
        self.host = host
        self.cfg = config or NatConfig()
        self.libp2p_autonat = libp2p_autonat  # asks libp2p AutoNAT v2 servers (None: only ours)
        self.given_relays = list(relays or ())  # relays to hold reservations with (Node(relays=...)), else found ones
        self.status = NatStatus()
        # what we advertise beyond our listen addresses (Host.advertised_addrs reads them)
        self.public_addrs: list[Multiaddr] = []  # observed addresses AutoNAT confirmed dialable
        self.candidate_addrs: list[Multiaddr] = []  # observed ones, unconfirmed (reachability unknown)
        self.relay_addrs: list[Multiaddr] = []  # our /p2p-circuit addresses (from reservations)
        self.relays: dict[PeerId, _Relay] = {}
        self._arrived: dict[bytes, list[tuple[str, str | None, str]]] = {}  # nonce -> (address, dialer IP, transport)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._learning: asyncio.Task | None = None  # a mapping observation under way (learn_mapping)
        host.set_handler(DIALBACK, self._on_dialback)
        host.events.identified.subscribe(lambda info: self._wake.set())
        host.events.disconnected.subscribe(self._on_disconnect)
        host.events.membership_changed.subscribe(self._on_membership)
        # a relay is public by its operator's word: only a dial-back that never arrives says otherwise
        self._operator_says_public = self.cfg.reachability is None and relaying
        if self.cfg.reachability in (PUBLIC, PRIVATE):
            self.status.reachability = self.cfg.reachability
            self.status.reason = "set by configuration"
        elif self._operator_says_public:
            self.status.reachability = PUBLIC
            self.status.reason = "a relay: public by its operator's word until a dial-back proves otherwise"

    def start(self) -> None:
        self._task = self.host.spawn(self._run())

    async def astart(self) -> None:
        """The node listens: start finding out our reachability."""
        self.start()

    # -- what peers observe -----------------------------------------------------------------------

    def observations(self) -> list[tuple[str, str, Connection]]:
        """(observer, observed address, connection) for every identified direct connection: the
        observer as limits per address count hosts (an IPv6 /64 is one), and only addresses of
        the connection's own family (a peer cannot have seen us at an IPv4 address over IPv6)."""
        out = []
        for conn, info in list(self.host.info.items()):
            if conn.is_closed or info.observed_addr is None or conn.transport not in ("tcp", "quic"):
                continue
            observer = ip_of(conn.remote_addr)
            observed = info.observed_addr.without_peer_id()
            seen = ip_of(observed)
            if observer is not None and seen is not None and (":" in observer) == (":" in seen):
                out.append((host_key(observer), str(observed), conn))
        return out

    def mapping(self) -> str:
        """Our NAT's mapping type, from what peers observe for our listening UDP socket."""
        if self.status.mapping == UNKNOWN:
            self.status.mapping = self._mapping()
        return self.status.mapping

    async def learn_mapping(self, timeout: float = 1.0) -> str:
        """Our mapping type, observed now (QUIC to two peers at different IPs) if still unknown:
        a hole punch needs it at once, and a fresh node's first AutoNAT round may not have run.
        Waits at most ``timeout`` seconds; concurrent callers share one observation."""
        if self.mapping() != UNKNOWN or not self._probing():
            return self.status.mapping
        if self._learning is None or self._learning.done():
            self._learning = self.host.spawn(self._observe_quic(observers=2))
        try:
            await asyncio.wait_for(asyncio.shield(self._learning), timeout)
        except TimeoutError:
            pass
        return self.mapping()

    def _listening_quic(self) -> list[tuple[str, str, Connection]]:
        listen = set(self.host.bound_addrs)
        return [o for o in self.observations() if o[2].transport == "quic" and o[2].local_addr in listen]

    def _mapping(self) -> str:
        """From QUIC connections on the listening socket (outbound ones leave from it too)."""
        return classify_mapping([(ip, seen) for ip, seen, _ in self._listening_quic()])

    def candidates(self) -> list[Multiaddr]:
        """Our addresses worth a dial-back: listen addresses and what peers saw (QUIC as seen; TCP
        with our listening port, since outbound TCP leaves from an ephemeral one)."""
        out: list[Multiaddr] = [a for a in self.host.listen_addrs if not is_loopback(a)]
        for _, c in self._observed():
            if c not in out:
                out.append(c)
        return out

    def _observed(self) -> list[tuple[str, Multiaddr]]:
        """(observer IP, candidate address) for what each peer says it sees us at: a QUIC address
        as seen (QUIC leaves from the listening socket), and our listening ports at the observed
        IP (outbound TCP leaves from an ephemeral port; many NATs keep ports)."""
        ports = [
            (a.host_port()[1], a.protocols()[-1])
            for a in self.host.listen_addrs
            if a.protocols()[1:] in (["tcp"], ["udp", "quic-v1"])
        ]
        out: list[tuple[str, Multiaddr]] = []
        for observer, seen, conn in self.observations():
            try:
                m = Multiaddr(seen)
                host_ip = m.host_port()[0]
            except LatticaError:
                continue
            as_seen = [m] if conn.transport == "quic" and m.protocols()[1:] == ["udp", "quic-v1"] else []
            for c in as_seen + [Multiaddr.from_host_port(host_ip, p, proto) for p, proto in ports]:
                if not is_loopback(c):
                    out.append((observer, c))
        return out

    # -- the loop -------------------------------------------------------------------------------

    def _probing(self) -> bool:
        """AutoNAT applies: it is on, not overridden, and we listen beyond loopback."""
        return (
            self.cfg.autonat
            and self.cfg.reachability is None
            and any(not is_loopback(a) for a in self.host.listen_addrs)
        )

    async def _run(self) -> None:
        while not self.host.closing:
            delay = self.cfg.retry
            try:
                probing = self._probing()
                if probing:
                    if self.status.reachability == UNKNOWN or self._due():
                        await self.probe()
                    if self.status.reachability != UNKNOWN:
                        delay = self.cfg.recheck
                # not proven public (yet), or public only through our NAT's mapping: hold
                # reservations, so that peers always have a path to us
                reach = self.status.reachability
                if (
                    reach == PRIVATE
                    or (reach == UNKNOWN and (probing or self.given_relays))
                    or self._public_through_mapping()
                ):
                    await self._keep_relays()
                    if len(self.relays) < self.cfg.max_relays:
                        delay = min(delay, self.cfg.retry)
                elif self.status.reachability == PUBLIC and self.relays:
                    for peer in list(self.relays):  # dialable directly: circuits would only slow peers down
                        self._lose(peer, replace=False)
            except LatticaError as e:
                log.info("reachability round failed", reason=str(e))
            except Exception:
                log.exception("reachability round crashed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
                await asyncio.sleep(0.2)  # let a burst of new connections settle
            except TimeoutError:
                pass

    def _public_through_mapping(self) -> bool:
        """Strangers reached us only at an address our NAT maps (a cone): that lasts while the
        mapping does, and the evidence may come from what an earlier process on this port sent
        (the NAT still remembers it), so circuits stay as the fallback path."""
        st = self.status
        if st.reachability != PUBLIC or not st.public:
            return False
        listen = set(self.host.listen_addrs)
        return not any(Multiaddr(a) in listen for a in st.public)

    def _due(self) -> bool:
        return self.status.checked_at is None or time.time() - self.status.checked_at >= self.cfg.recheck

    def _servers(self) -> list[PeerId]:
        out = []
        for peer, conn in list(self.host.conns.items()):
            info = self.host.info.get(conn)
            if info is not None and DIALBACK in info.protocols and conn.transport in ("tcp", "quic"):
                out.append(peer)
        return out[: self.cfg.servers]

    def _libp2p_servers(self) -> list[PeerId]:
        """libp2p peers that serve AutoNAT (v2 ones first, then v1's) and not our protocol (those
        we ask with ours)."""
        if self.libp2p_autonat is None:
            return []
        v2s, v1s = [], []
        for peer, conn in list(self.host.conns.items()):
            info = self.host.info.get(conn)
            if info is None or DIALBACK in info.protocols or conn.transport not in ("tcp", "quic"):
                continue
            if autonat_v2.DIAL_REQUEST in info.protocols:
                v2s.append(peer)
            elif autonat_v1.PROTOCOL in info.protocols:
                v1s.append(peer)
        return (v2s + v1s)[: self.cfg.servers]

    async def probe(self) -> NatStatus:
        """One AutoNAT round: ask servers to dial us back; classify; return the new status."""
        st = self.status
        if self._mapping() == UNKNOWN:
            # one QUIC observer first: its connection maps our UDP port for the dial-backs, and the
            # other peers stay uncontacted, so a server can pick one as a helper (the only way to
            # tell a full cone from an address-restricted NAT); the second observer comes after
            await self._observe_quic(observers=1)
        try:
            return await self._check(self._servers(), self.candidates(), self._libp2p_servers())
        finally:
            if self._mapping() == UNKNOWN:
                await self._observe_quic(observers=2)
            st.observed = sorted({seen for _, seen, _ in self.observations()})
            st.mapping = self._mapping()

    async def _check(
        self, servers: list[PeerId], cands: list[Multiaddr], libp2p_servers: list[PeerId] | None = None
    ) -> NatStatus:
        st = self.status
        st.observed = sorted({seen for _, seen, _ in self.observations()})
        libp2p_servers = libp2p_servers or []
        if not (servers or libp2p_servers) or not cands:
            st.reason = "no peer to ask yet" if not (servers or libp2p_servers) else "no address worth checking"
            return st
        contacted = self._contacted()
        avoid = sorted(set().union(*contacted.values()))  # helpers at these IPs would prove little
        nonce = os.urandom(16)
        self._arrived[nonce] = []
        rt = self.host.runtime
        assert rt is not None
        try:
            futs = [
                rt.call(autonat_ref(p), "check", ([str(a) for a in cands], nonce, avoid), {}, timeout=15.0)
                for p in servers
            ]
            ours, (theirs, their_arrivals) = await asyncio.gather(
                asyncio.gather(*futs, return_exceptions=True), self._ask_libp2p(libp2p_servers, cands)
            )
            answers: list[Any] = [*ours, *theirs]
            await asyncio.sleep(0.05)  # a dial-back stream may still be in the last loop round
        finally:
            arrived = self._arrived.pop(nonce, [])
        arrived += their_arrivals
        tried = [a for a in answers if isinstance(a, dict) and a.get("tried")]
        for transport, ips in self._contacted().items():  # dials made meanwhile count too
            contacted.setdefault(transport, set()).update(ips)
        # A dial-back proves strangers can reach us only if it came from an IP that listening
        # socket never sent to (QUIC dials and hole punches do): a cone NAT's filter lets such an
        # IP in. (Plain TCP dials leave from ephemeral ports: they open nothing.)
        reached = {
            addr: ip
            for addr, ip, transport in arrived
            if ip is not None and transport in ("tcp", "quic") and ip not in contacted.get(transport, ())
        }
        st.checked_at = time.time()
        if not reached and self._operator_says_public and (arrived or not tried):
            # a relay stays public unless servers tried and no dial-back arrived at all
            st.reason = "a relay: public by its operator's word (no dial-back proved otherwise)"
            log.info("reachability", reachability=st.reachability, mapping=st.mapping, reason=st.reason)
            return st
        if reached:
            st.reachability = PUBLIC
            st.public = sorted(reached)
            st.reason = f"a peer we never contacted reached us at {', '.join(st.public)}"
            public = [Multiaddr(a) for a in st.public if Multiaddr(a) not in self.host.listen_addrs]
            if public != self.public_addrs or self.candidate_addrs:
                self.public_addrs = public
                self.candidate_addrs = []
                self._addrs_changed()
        elif arrived and not any(a.get("helper") for a in tried):
            # a contacted server got through from a fresh port; whether a stranger would (full
            # cone or public) or not (address-restricted) needs a helper at another address
            st.reason = (
                "reachable by peers we talk to; waiting for a second peer to tell whether strangers can reach us"
            )
        elif tried:
            st.reachability = PRIVATE
            st.public = []
            if self.public_addrs or self.candidate_addrs:
                self.public_addrs = []
                self.candidate_addrs = []
                self._addrs_changed()
            got = sorted({a for a, _, _ in arrived})
            st.reason = (
                "only peers we already talk to got through (an address-restricted NAT or firewall)"
                if got
                else f"no dial-back got through to {', '.join(sorted({t for a in tried for t in a['tried']}))}"
            )
        else:
            errors = [str(a) for a in answers if isinstance(a, BaseException)]
            st.reason = "no server could check us" + (
                f": {errors[0]}" if errors else " (none saw us at these addresses)"
            )
        if st.reachability == UNKNOWN:
            self._advertise_candidates()
        log.info("reachability", reachability=st.reachability, mapping=st.mapping, reason=st.reason)
        return st

    async def _ask_libp2p(
        self, servers: list[PeerId], cands: list[Multiaddr]
    ) -> tuple[list[Any], list[tuple[str, str | None, str]]]:
        """AutoNAT to libp2p servers, as our servers' answers and dial-backs: a server that
        dialed (whether or not it got through) tried the address it names, and a dial-back with
        our nonce arrived as one of ours does; anything else is an error (it proves nothing)."""
        if not servers or self.libp2p_autonat is None:
            return [], []
        answers: list[Any] = []
        arrived: list[tuple[str, str | None, str]] = []
        for peer, v in zip(servers, await self.libp2p_autonat.check(servers, cands)):
            if v.outcome in (Outcome.REACHED, Outcome.FAILED) and v.addr is not None:
                answers.append({"tried": [str(v.addr)], "helper": None})
            else:
                answers.append(ProtocolError(f"libp2p AutoNAT server {peer}: {v.reason}"))
            if v.outcome == Outcome.REACHED and v.addr is not None:
                arrived.append((str(v.addr), v.dialer_ip, v.transport))
        return answers, arrived

    def _advertise_candidates(self) -> None:
        """Not proven either way: advertise the addresses peers observe us at as candidates, so a
        peer can try them (a full cone NAT lets it in) while its circuits through our relays are
        the path that always works. What one peer says is its word alone (it could name any
        address, to send our callers there): a candidate needs observers at two different IPs,
        and at most ``_MAX_CANDIDATES`` are advertised, the best attested first."""
        listen = set(self.host.listen_addrs)
        votes: dict[Multiaddr, set[str]] = {}
        for observer, c in self._observed():
            if c not in listen:
                votes.setdefault(c, set()).add(observer)
        agreed = sorted((c for c, who in votes.items() if len(who) >= 2), key=lambda c: -len(votes[c]))
        cands = agreed[:_MAX_CANDIDATES]
        if cands != self.candidate_addrs:
            self.candidate_addrs = cands
            self._addrs_changed()

    async def _observe_quic(self, observers: int = 2) -> None:
        """The mapping type needs two observers at different IPs of our listening UDP socket:
        dial QUIC to connected peers we know a QUIC address of until ``observers`` see it (the
        connections stay: their keepalives also hold the mapping open for hole punching)."""
        have = {ip for ip, _, _ in self._listening_quic()}
        wanted: list[tuple[PeerId, list[Multiaddr]]] = []
        for peer, conn in list(self.host.conns.items()):
            ip = ip_of(conn.remote_addr)
            if len(have) >= observers:
                break
            if ip is None or ip in have or conn.transport != "tcp":
                continue
            quic = [
                a
                for a in self.host.peer_addrs.get(peer, ())
                if a.protocols()[1:] == ["udp", "quic-v1"] and ip_of(a) == ip
            ]
            if quic:
                wanted.append((peer, quic[:1]))
                have.add(ip)
        if not wanted:
            return
        token = context.NO_DHT_DIAL_LOOKUP.set(True)
        try:
            conns = await asyncio.gather(*(self.host.dial_addrs(p, a) for p, a in wanted), return_exceptions=True)
        finally:
            context.NO_DHT_DIAL_LOOKUP.reset(token)
        waits = [
            asyncio.shield(self.host.identified[c])
            for c in conns
            if not isinstance(c, BaseException) and c in self.host.identified
        ]
        if waits:
            await asyncio.wait(waits, timeout=5.0)
            for w in waits:  # a connection closed before identify is simply not observed
                if not w.done():
                    w.cancel()
                elif not w.cancelled():
                    w.exception()

    def _contacted(self) -> dict[str, set[str]]:
        """Per transport, every IP its listening socket sent to lately: a cone NAT's filter lets
        those in on that port."""
        now = self.host.loop.time()
        out: dict[str, set[str]] = {
            "tcp": set(),
            # a QUIC connection is direct: its remote address has an IP
            "quic": cast(
                set[str], {ip_of(conn.remote_addr) for _, _, conn in self.observations() if conn.transport == "quic"}
            ),
        }
        for (transport, ip), t in list(self.host.contacted.items()):
            if now - t < _CONTACT_MEMORY:
                out.setdefault(transport, set()).add(ip)
        return out

    async def _on_dialback(self, stream: Stream, conn: Connection) -> None:
        try:
            async with asyncio.timeout(5.0):
                msg = await read_message(stream, 256)
        except (TimeoutError, LatticaError):
            stream.reset()
            return
        if type(msg) is not dict or type(msg.get("nonce")) is not bytes or type(msg.get("addr")) is not str:
            stream.reset()
            return
        waiting = self._arrived.get(msg["nonce"])
        # (only a connection the server opened proves anything: a nonce sent back on one we
        # dialed, the one we asked over say, came through no NAT of ours)
        if waiting is not None and len(waiting) < 16 and conn.direction == "inbound":
            waiting.append(
                (
                    msg["addr"][:256],
                    ip_of(conn.remote_addr) if conn.transport in ("tcp", "quic") else None,
                    conn.transport,
                )
            )
        write_message(stream, {"ok": True})
        await stream.close()

    # -- relays ---------------------------------------------------------------------------------

    def _relay_candidates(self) -> list[PeerId]:
        out: list[PeerId] = []
        for a in self.given_relays:
            p = a.peer_id
            if p is not None and p not in out:
                self.host.remember_addrs(p, [a])
                out.append(p)
        # other relays we are connected to: directly (a relay reached through a relay is no
        # path), and of our mesh (every peer is, in an open one): a stranger that says it relays
        # would hold a relay slot and name the addresses our callers dial
        for peer, conn in list(self.host.conns.items()):
            info = self.host.info.get(conn)
            if (
                info is not None
                and HOP in info.protocols
                and peer not in out
                and conn.transport != "relay"
                and info.circle != "stranger"
            ):
                out.append(peer)
        return [p for p in out if p not in self.relays and p != self.host.peer_id]

    async def _keep_relays(self) -> None:
        for peer in self._relay_candidates():
            if len(self.relays) >= self.cfg.max_relays:
                break
            try:
                self._reserved(peer, await self._reserve(peer))
            except LatticaError as e:
                log.info("relay reservation failed", relay=str(peer), reason=str(e))

    async def _reserve(self, peer: PeerId) -> Any:
        """Reserve (or renew) a slot on relay ``peer``: a call to a Lattica relay's actor, or
        circuit relay v2's RESERVE on a libp2p relay; the answer in the actor's shape."""
        rt = self.host.runtime
        assert rt is not None
        conn = await self.host.get_connection(peer)
        info = await self.host.peer_info(conn, _RESERVE_TIMEOUT)
        protocols = info.protocols if info is not None else ()
        if HOP in protocols or (v2.HOP not in protocols and not conn.libp2p):
            return await rt.call(relay_ref(peer), "reserve", (), {}, timeout=_RESERVE_TIMEOUT)
        stream = await self.host.open_stream_on(conn, v2.HOP)
        try:
            async with asyncio.timeout(_RESERVE_TIMEOUT):
                write_delimited(stream, v2.encode_hop(v2.HopMessage(v2.HopType.RESERVE)))
                await stream.drain()
                answer = v2.decode_hop(await read_delimited(stream, v2.MAX_MESSAGE))
        except TimeoutError:
            raise RelayRefused(f"libp2p relay {peer} did not answer the reservation in {_RESERVE_TIMEOUT} s") from None
        finally:
            stream.reset()  # (the relay ends the stream after its answer; nothing more is said on it)
        if answer.type != v2.HopType.STATUS:
            raise ProtocolError(f"libp2p relay {peer} answered RESERVE with {answer.type.name}")
        if answer.status != v2.Status.OK or answer.reservation is None:
            status = answer.status.name if answer.status is not None else "no status"
            raise RelayRefused(f"libp2p relay {peer} refused the reservation: {status}")
        r = answer.reservation
        if r.expire <= time.time():
            raise ProtocolError(f"libp2p relay {peer} granted a reservation that has already expired")
        if r.voucher:
            v2.open_voucher(r.voucher, peer, self.host.peer_id)  # (ProtocolError: not the relay's, or not ours)
        limit = answer.limit
        return {
            "expires": r.expire,
            "addrs": [str(a) for a in r.addrs],
            "limit": {"duration": limit.duration or None, "bytes": limit.data or None} if limit else None,
        }

    def _reserved(self, peer: PeerId, answer: Any) -> None:
        if (
            type(answer) is not dict
            or type(answer.get("addrs")) is not list
            or not isinstance(answer.get("expires"), (int, float))
        ):
            raise LatticaError(f"relay {peer} answered the reservation with garbage")
        # the relay's addresses we advertise: only at the IP we reach it at (or its configured
        # one), so a relay cannot send the callers of its clients to a third party
        conn = self.host.conns.get(peer)
        ips = {ip_of(a) for a in self.given_relays if a.peer_id == peer}
        if conn is not None:
            ips.add(ip_of(conn.remote_addr))
        addrs = []
        for a in answer["addrs"][:8]:
            try:
                m = Multiaddr(a)
            except (LatticaError, TypeError):
                continue
            if not m.is_circuit and ip_of(m) in ips - {None}:
                addrs.append(circuit_addr(m.without_peer_id(), peer))
        if not addrs:
            if conn is None:
                raise LatticaError(f"relay {peer} gave no address")
            addrs = [circuit_addr(conn.remote_addr, peer)]
        old = self.relays.get(peer)
        if old is not None and old.renew is not None:
            old.renew.cancel()
        # renewed at half: a relay can make us renew (and re-announce) neither every few seconds
        # nor never
        ttl = min(max(answer["expires"] - time.time(), _MIN_RESERVATION), _MAX_RESERVATION)
        r = _Relay(peer, addrs, answer["expires"])
        r.renew = self.host.loop.call_later(ttl / 2, lambda: self.host.spawn(self._renew(peer)))
        self.relays[peer] = r
        self.host.protect(peer, "relay-client")
        log.info("relay reservation", relay=str(peer), expires_in=round(ttl))
        self._addrs_changed()

    async def _renew(self, peer: PeerId) -> None:
        if peer not in self.relays or self.host.runtime is None:
            return
        try:
            self._reserved(peer, await self._reserve(peer))
        except LatticaError as e:
            log.info("relay reservation renewal failed", relay=str(peer), reason=str(e))
            self._lose(peer)

    def _on_membership(self, event: Any) -> None:
        # the mesh declared us dead and we rejoined: relays dropped our reservations meanwhile
        if isinstance(event, SelfDowned):
            for peer in list(self.relays):
                self.host.spawn(self._renew(peer))

    def _on_disconnect(self, peer: PeerId, conn: Connection) -> None:
        if peer in self.relays:
            log.info("lost relay", relay=str(peer))
            self._lose(peer)

    def _lose(self, peer: PeerId, replace: bool = True) -> None:
        r = self.relays.pop(peer, None)
        if r is None:
            return
        if r.renew is not None:
            r.renew.cancel()
        self.host.unprotect(peer, "relay-client")
        self._addrs_changed()
        if replace:
            self._wake.set()  # find another relay now

    def _addrs_changed(self) -> None:
        self.relay_addrs = [a for r in self.relays.values() for a in r.addrs]
        self.status.relays = [str(a) for a in self.relay_addrs]
        if not self.host.closing:
            for conn in list(self.host.all_conns):  # tell connected peers (identify push)
                if not conn.is_closed:
                    self.host.spawn(self.host.push_identify(conn))
            self.host.events.addresses_changed.emit(self.host.advertised_addrs())

    def snapshot(self) -> NatStatus:
        st = self.status
        st.observed = sorted({seen for _, seen, _ in self.observations()})
        if st.mapping == UNKNOWN:
            st.mapping = self._mapping()
        st.relays = [str(a) for a in self.relay_addrs]
        return replace(st, observed=list(st.observed), public=list(st.public), relays=list(st.relays))
