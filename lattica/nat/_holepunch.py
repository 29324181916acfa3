"""Hole punching over a relayed connection (DCUtR-style), as a sans-IO state machine.

Two peers joined through a relay want a direct path. The peer that *received* the relayed
connection (``B``, the initiator here) opens a hole-punch stream on it and sends ``connect`` with
the addresses peers observe for it and its NAT mapping type; the other (``A``) answers with its
own. ``B`` now knows the round-trip time, sends ``sync`` and waits half of it; ``A`` acts the
moment ``sync`` arrives, so both sides' first packets leave at about the same time and each NAT
sees an outbound packet before the other side's inbound one arrives.

What each side then does is :func:`plan`'s answer, computed the same way on both ends from what
was exchanged: TCP simultaneous open from the listening port (``A`` runs the Noise initiator),
QUIC from the listening UDP socket (``A`` dials, ``B`` sends punch datagrams), and when exactly one
side has an endpoint-dependent ("symmetric") mapping, many-port probing: the hard side opens many
UDP sockets towards the easy side, the easy side probes random ports at the hard side's IP, and
the hard side dials from the socket a probe reached (birthday paradox).

No sockets here: :class:`Initiator` and :class:`Responder` take decoded messages and return the
messages to send and a :class:`Punch` (what to do and when); ``actors/nat/holepunch.py`` runs them.

With a libp2p peer the same roles and timing run over DCUtR (``/libp2p/dcutr``,
:class:`DcutrInitiator` and :class:`DcutrResponder`): its messages carry addresses only, so the
plan is the simultaneous one (no many-port probing: a libp2p peer neither sprays nor probes), and
its TCP and QUIC connections run libp2p's stack (``Punch.libp2p``).

Whatever the peer named, what a punch sends goes through :func:`aim` (few targets, at two hosts,
loopback and private ones only when the exchange itself came over such an address) and
:class:`Destinations` (a budget of attempts per destination host, whoever asked): the peer's
addresses are its word, and a stranger reaching us through a relay may name a third host's.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lattica._budget import Buckets
from lattica._interfaces import host_key, is_loopback_ip, is_private_ip
from lattica._multiaddr import Multiaddr
from lattica.errors import ProtocolError
from lattica.nat._dcutr_wire import HolePunch, PunchType

__all__ = [
    "PROTOCOL",
    "Punch",
    "Plan",
    "Initiator",
    "Responder",
    "DcutrInitiator",
    "DcutrResponder",
    "tcp_only",
    "plan",
    "aim",
    "Destinations",
    "probe_packet",
    "is_probe",
    "probe_ports",
]

PROTOCOL = "/lattica/holepunch/1"
MAX_MESSAGE = 8192
MAX_ADDRS = 16
INDEPENDENT, DEPENDENT, UNKNOWN = "endpoint-independent", "endpoint-dependent", "unknown"
_MAPPINGS = (INDEPENDENT, DEPENDENT, UNKNOWN)

# QUIC long headers start with 1 bits and short headers with 01: a first byte of 0 is neither, so
# punch and probe datagrams can never be mistaken for QUIC packets (and vice versa).
_PROBE_MAGIC = b"\x00lattica-punch"
TOKEN_LEN = 16
PORT_RANGE = (1024, 65535)  # where NATs pick random ports (Linux: 1024-65535 for sources >= 1024)
# What one attempt may send to, whatever the peer named (its addresses are its word: a stranger
# reaching us through a relay may name a third host's), and how often one host may be aimed at.
MAX_TARGETS = 4  # TCP targets, and QUIC ones, an attempt dials, sends SYNs or punch datagrams to
MAX_HOSTS = 2  # distinct hosts (an IPv4 address, an IPv6 /64) an attempt sends to
DESTINATION_RATE, DESTINATION_BURST = 0.2, 12.0  # attempts per destination host: 12, then one per 5 s
PROBING_COST = 4.0  # an attempt that probes a host (up to thousands of datagrams) counts as four


def probe_packet(token: bytes) -> bytes:
    """A punch/probe datagram carrying the attempt's token."""
    return _PROBE_MAGIC + token


def is_probe(data: bytes, token: bytes) -> bool:
    return (
        len(data) == len(_PROBE_MAGIC) + TOKEN_LEN
        and data.startswith(_PROBE_MAGIC)
        and data[len(_PROBE_MAGIC) :] == token
    )


def probe_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct random ports from the range NATs allocate from."""
    rng = rng or random.SystemRandom()
    lo, hi = PORT_RANGE
    return rng.sample(range(lo, hi + 1), min(count, hi - lo + 1))


@dataclass(slots=True)
class Plan:
    """What one side does once the punch starts (filled in by :func:`plan`)."""

    tcp_targets: list[Multiaddr] = field(default_factory=list)  # simultaneous open towards these
    tcp_initiator: bool = False  # run the Noise initiator on the punched TCP connection
    tcp_dial: bool = False  # dial tcp_targets plainly instead (a TCP-only punch's asker)
    quic_targets: list[Multiaddr] = field(default_factory=list)  # the peer's UDP endpoints
    quic_dial: bool = False  # dial QUIC from the listening socket (else only punch datagrams)
    spray: bool = False  # hard side: open many sockets towards quic_targets, dial from the one probed
    probe_ips: list[str] = field(default_factory=list)  # easy side: probe random ports at these IPs


@dataclass(slots=True)
class Punch:
    """Event: start ``plan`` after ``delay`` seconds; ``rtt`` as measured by the initiator."""

    plan: Plan
    delay: float
    rtt: float | None
    token: bytes
    theirs: list[Multiaddr] = field(default_factory=list)  # the peer's candidate addresses (None: none)
    nats: tuple[str, str] = (UNKNOWN, UNKNOWN)  # (our mapping type, the peer's)
    libp2p: bool = False  # agreed over DCUtR: the direct connection runs libp2p's stack

    def __post_init__(self) -> None:
        self.theirs = self.theirs or []  # (None is taken for no addresses)


def _addrs_out(addrs: list[Multiaddr]) -> list[str]:
    return [str(a.without_peer_id()) for a in addrs[:MAX_ADDRS]]


def _addrs_in(raw: Any) -> list[Multiaddr]:
    if type(raw) is not list:
        raise ProtocolError("hole punch: addrs must be a list")
    out = []
    for a in raw[:MAX_ADDRS]:
        if type(a) is not str or len(a) > 256:
            raise ProtocolError("hole punch: bad address")
        try:
            m = Multiaddr(a)
        except Exception:
            raise ProtocolError(f"hole punch: bad address {a[:64]!r}") from None
        if not m.is_circuit and m not in out:
            out.append(m)
    return out


def _connect(addrs: list[Multiaddr], mapping: str, token: bytes | None) -> dict:
    msg: dict[str, Any] = {"type": "connect", "addrs": _addrs_out(addrs), "nat": mapping}
    if token is not None:
        msg["token"] = token
    return msg


def _parse_connect(msg: Any, want_token: bool) -> tuple[list[Multiaddr], str, bytes | None]:
    if type(msg) is not dict or msg.get("type") != "connect":
        raise ProtocolError("hole punch: expected a connect message")
    nat = msg.get("nat")
    if nat not in _MAPPINGS:
        raise ProtocolError("hole punch: bad NAT mapping type")
    token = msg.get("token")
    if want_token and (type(token) is not bytes or len(token) != TOKEN_LEN):
        raise ProtocolError("hole punch: bad token")
    return _addrs_in(msg.get("addrs")), nat, token


def _kind(addr: Multiaddr) -> str | None:
    p = addr.protocols()
    if p[:1] in (["ip4"], ["ip6"]):
        if p[1:] == ["tcp"]:
            return "tcp"
        if p[1:] == ["udp", "quic-v1"]:
            return "quic"
    return None


def plan(initiator: bool, mine: tuple[list[Multiaddr], str], theirs: tuple[list[Multiaddr], str]) -> Plan:
    """The same decision on both ends: ``initiator`` is True on ``B`` (the relayed connection's
    receiver, who sends ``connect`` first). Address lists put what peers observe first."""
    (_, my_nat), (their_addrs, their_nat) = mine, theirs
    p = Plan()
    p.tcp_initiator = not initiator  # A: its SYN leaves first, and it speaks first in Noise
    p.tcp_targets = (
        [a for a in their_addrs if _kind(a) == "tcp"] if my_nat != DEPENDENT and their_nat != DEPENDENT else []
    )
    p.quic_targets = [a for a in their_addrs if _kind(a) == "quic"]
    if my_nat == DEPENDENT and their_nat != DEPENDENT:
        p.spray, p.quic_dial = True, True  # the hard side dials (from the listening socket too)
    elif their_nat == DEPENDENT and my_nat != DEPENDENT:
        # one IP only, the first (peers list what others observe first): a peer must not be
        # able to aim thousands of probes at several hosts
        p.probe_ips = [p.quic_targets[0].host_port()[0]] if p.quic_targets else []
    else:
        p.quic_dial = not initiator
    return p


def _reach(ip: str | None) -> int:
    """0: loopback, 1: private (see ``is_private_ip``), 2: public, or not an IP we can place."""
    if ip is None:
        return 2
    if is_loopback_ip(ip):
        return 0
    return 1 if is_private_ip(ip) else 2


def aim(plan: Plan, via: str | None) -> Plan:
    """What of ``plan`` an attempt may send to. ``via``: the IP the exchange came over (a relayed
    connection's relay, a direct connection's peer; None: unknown, taken as public). A loopback
    target only via loopback (else it is our own machine), a private one only via a private or
    loopback address (else it is someone's LAN, or ours: go-libp2p sends public addresses only);
    at most MAX_TARGETS TCP and MAX_TARGETS QUIC targets, at the first MAX_HOSTS hosts (TCP's
    first: peers list what others observe first), and probing only at those hosts."""
    floor = _reach(via)
    hosts: list[str] = []

    def keep(ip: str) -> bool:
        if _reach(ip) < floor:
            return False
        key = host_key(ip)
        if key not in hosts:
            if len(hosts) == MAX_HOSTS:
                return False
            hosts.append(key)
        return True

    def within(targets: list[Multiaddr]) -> list[Multiaddr]:
        out: list[Multiaddr] = []
        for a in targets:
            if len(out) == MAX_TARGETS:
                break
            if keep(a.host_port()[0]):
                out.append(a)
        return out

    tcp = within(plan.tcp_targets)
    quic = within(plan.quic_targets)
    return dataclasses.replace(
        plan, tcp_targets=tcp, quic_targets=quic, probe_ips=[ip for ip in plan.probe_ips if keep(ip)]
    )


class Destinations:
    """Punch attempts per destination host, whoever asked (DESTINATION_BURST, then
    DESTINATION_RATE a second; probing a host costs PROBING_COST): identities are free to make
    and each may answer a punch with the same third host, so what that host receives is bounded
    here, not per peer. libp2p dials the candidates once per attempt, three attempts, and bounds
    nothing per destination."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._buckets = Buckets(DESTINATION_RATE, DESTINATION_BURST, 4096, clock=clock)

    def admit(self, plan: Plan) -> tuple[Plan, list[str]]:
        """``plan`` without what the budget no longer allows (each host kept is charged), and the
        hosts left out. A host that cannot pay for probing any more is still sent the plain
        attempt if it can pay for that."""
        probed = {host_key(ip) for ip in plan.probe_ips}
        unprobed: set[str] = set()
        refused: list[str] = []
        for h in dict.fromkeys(
            [host_key(a.host_port()[0]) for a in plan.tcp_targets + plan.quic_targets] + list(probed)
        ):
            if h in probed and self._buckets.take(h, PROBING_COST):
                continue
            if h in probed:
                unprobed.add(h)
            if not self._buckets.take(h):
                refused.append(h)
        if not refused and not unprobed:
            return plan, []

        def kept(a: Multiaddr) -> bool:
            return host_key(a.host_port()[0]) not in refused

        return dataclasses.replace(
            plan,
            tcp_targets=[a for a in plan.tcp_targets if kept(a)],
            quic_targets=[a for a in plan.quic_targets if kept(a)],
            probe_ips=[ip for ip in plan.probe_ips if host_key(ip) not in unprobed],
        ), refused


def tcp_only(theirs: list[Multiaddr], peer_ip: str, asker: bool, nats: tuple[str, str] = (UNKNOWN, UNKNOWN)) -> Plan:
    """The plan of a punch over a direct (QUIC) connection, which only adds TCP, for a peer whose
    TCP port has no NAT mapping yet (a full-cone node is dialed over QUIC at once). One side, the
    opener, sends SYNs from its TCP listening port towards the other's TCP candidates at the IP
    the connection comes from: that opens its mapping and filter (and connects where the other's
    port is open); the other, after the usual half round trip, dials the opener plainly. Both run
    Noise as initiator on what they open, so no connection can end with two responders. The
    opener is the side that did not ask, unless only its mapping depends on the destination
    (its SYN would open a port nobody can predict): then the asker opens. Only the peer's TCP
    candidates at the connection's IP, nothing over UDP: a peer we already reach cannot aim our
    packets at anyone else. ``nats``: (our mapping type, the peer's)."""
    mine, their = nats
    opener = not asker
    if (their if asker else mine) == DEPENDENT and (mine if asker else their) != DEPENDENT:
        opener = asker
    q = Plan()
    q.tcp_targets = [a for a in theirs if _kind(a) == "tcp" and a.host_port()[0] == peer_ip]
    q.tcp_dial = not opener
    q.tcp_initiator = True
    return q


class Initiator:
    """``B``: sends ``connect``, measures the RTT from the answer, sends ``sync``."""

    def __init__(self, addrs: list[Multiaddr], mapping: str, token: bytes | None = None) -> None:
        self.mine = (addrs, mapping)
        self.token = token or os.urandom(TOKEN_LEN)
        self._sent_at: float | None = None
        self.done = False

    def start(self, now: float) -> dict:
        self._sent_at = now
        return _connect(*self.mine, self.token)

    def receive(self, msg: Any, now: float) -> tuple[dict, Punch]:
        """The peer's ``connect`` -> (``sync`` to send, the punch to run)."""
        if self._sent_at is None or self.done:
            raise ProtocolError("hole punch: unexpected message")
        theirs = _parse_connect(msg, want_token=False)[:2]
        self.done = True
        waited = max(now - self._sent_at, 0.0)
        held = msg.get("held", 0.0)  # how long the peer held our connect before answering
        if type(held) not in (int, float) or not 0.0 <= held <= waited:
            held = 0.0  # (not a number, or more than we waited: ignored)
        rtt = waited - held
        return {"type": "sync"}, Punch(
            plan(True, self.mine, theirs), rtt / 2, rtt, self.token, theirs[0], (self.mine[1], theirs[1])
        )


class Responder:
    """``A``: answers ``connect`` with its own, then acts the moment ``sync`` arrives."""

    def __init__(self, addrs: list[Multiaddr], mapping: str) -> None:
        self.mine = (addrs, mapping)
        self._theirs: tuple[list[Multiaddr], str] | None = None
        self._token: bytes | None = None
        self.done = False

    def receive(self, msg: Any, held: float = 0.0) -> dict | Punch:
        """``connect`` -> our ``connect`` to send back (``held``: seconds since it arrived, which
        the initiator takes off its RTT); ``sync`` -> the punch to run now."""
        if self.done:
            raise ProtocolError("hole punch: unexpected message")
        if self._theirs is None:
            addrs, nat, token = _parse_connect(msg, want_token=True)
            self._theirs, self._token = (addrs, nat), token
            answer = _connect(*self.mine, None)
            if held > 0:
                answer["held"] = held
            return answer
        if type(msg) is not dict or msg.get("type") != "sync":
            raise ProtocolError("hole punch: expected sync")
        self.done = True
        assert self._token is not None
        return Punch(
            plan(False, self.mine, self._theirs),
            0.0,
            None,
            self._token,
            self._theirs[0],
            (self.mine[1], self._theirs[1]),
        )


def _punchable(addrs: tuple[Multiaddr, ...]) -> list[Multiaddr]:
    """What a DCUtR peer names that a punch can use: direct TCP and QUIC addresses, each once."""
    out: list[Multiaddr] = []
    for a in addrs:
        a = a.without_peer_id()
        if _kind(a) is not None and a not in out:
            out.append(a)
    return out[:MAX_ADDRS]


def _simultaneous(initiator: bool, mine: list[Multiaddr], theirs: list[Multiaddr]) -> Plan:
    """DCUtR's plan: TCP simultaneous open (``A`` the Noise initiator), ``A`` dials QUIC and
    ``B`` sends punch datagrams; mapping types are not exchanged, so nothing more."""
    return plan(initiator, (mine, UNKNOWN), (theirs, UNKNOWN))


class DcutrInitiator:
    """``B`` with a libp2p peer: CONNECT with our addresses, the RTT from its CONNECT, SYNC."""

    def __init__(self, addrs: list[Multiaddr]) -> None:
        self.mine = [a.without_peer_id() for a in addrs if not a.is_circuit][:MAX_ADDRS]
        self._sent_at: float | None = None
        self.done = False

    def start(self, now: float) -> HolePunch:
        self._sent_at = now
        return HolePunch(PunchType.CONNECT, tuple(self.mine))

    def receive(self, msg: HolePunch, now: float) -> tuple[HolePunch, Punch]:
        """The peer's CONNECT -> (SYNC to send, the punch to run after half the RTT)."""
        if self._sent_at is None or self.done or msg.type != PunchType.CONNECT:
            raise ProtocolError("DCUtR: expected the peer's CONNECT")
        self.done = True
        theirs = _punchable(msg.addrs)
        rtt = max(now - self._sent_at, 0.0)
        punch = Punch(_simultaneous(True, self.mine, theirs), rtt / 2, rtt, os.urandom(TOKEN_LEN), theirs, libp2p=True)
        return HolePunch(PunchType.SYNC), punch


class DcutrResponder:
    """``A`` with a libp2p peer: answers CONNECT with our addresses, acts the moment SYNC comes."""

    def __init__(self, addrs: list[Multiaddr]) -> None:
        self.mine = [a.without_peer_id() for a in addrs if not a.is_circuit][:MAX_ADDRS]
        self._theirs: list[Multiaddr] | None = None
        self.done = False

    def receive(self, msg: HolePunch) -> HolePunch | Punch:
        """CONNECT -> our CONNECT to send back; SYNC -> the punch to run now."""
        if self.done:
            raise ProtocolError("DCUtR: unexpected message")
        if self._theirs is None:
            if msg.type != PunchType.CONNECT:
                raise ProtocolError("DCUtR: expected CONNECT first")
            self._theirs = _punchable(msg.addrs)
            return HolePunch(PunchType.CONNECT, tuple(self.mine))
        if msg.type != PunchType.SYNC:
            raise ProtocolError("DCUtR: expected SYNC")
        self.done = True
        theirs = self._theirs
        return Punch(_simultaneous(False, self.mine, theirs), 0.0, None, os.urandom(TOKEN_LEN), theirs, libp2p=True)
