"""Hostile DCUtR peers (``/libp2p/dcutr``, issue 50's bad input: "DCUtR messages with hundreds of
addresses or addresses aimed at a third host"), over real nodes on 127.0.0.1.

The worry: any identity (free to make) that reaches our node through a relay answers its hole
punch with addresses of a third host, so our node sprays TCP connections and UDP datagrams at that
host, once per identity and relayed connection. A "victim" here is a set of sockets at other
loopback addresses (127.0.0.9, 127.0.0.10 ...) that count what reaches them. The hostile peers are
Lattica nodes that look like plain libp2p peers as far as hole punching goes (they offer DCUtR, not
our protocol) and never dial anyone directly by themselves, so the relayed connection is all there
is; the relay is ours, on loopback (where loopback and private targets are fair: the peer is on
this machine).
"""

from __future__ import annotations

import asyncio
import collections
import selectors
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import pytest

import lattica
from helpers import on_loop, wait_for
from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica._multiaddr import Multiaddr
from lattica._protobuf import uvarint
from lattica.actors.nat import holepunch as hp_actor
from lattica.config import NatConfig
from lattica.errors import LatticaError, PeerUnreachable
from lattica.nat import _dcutr_wire as dcutr
from lattica.nat._holepunch import DEPENDENT
from lattica.nat._holepunch import PROTOCOL as OUR_PROTOCOL
from lattica.transports.base import Connection, Stream
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"
QUIET = {"pubsub": False, "membership": False, "crdt": False, "content": False, "mdns": False}
Handler = Callable[[Stream, Connection], Awaitable[None]]


@pytest.fixture(autouse=True)
def short_window(monkeypatch):
    monkeypatch.setattr(hp_actor, "WINDOW", 0.3)  # (each attempt's wait: the sending is what counts here)


# -- the third host ------------------------------------------------------------------------------------


class Victim:
    """Sockets at ``hosts`` (a TCP listener and a UDP socket per port) counting what reaches them."""

    def __init__(self, hosts: list[str], ports: int = 1) -> None:
        self.hits: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self.tcp: list[tuple[str, int]] = []
        self.udp: list[tuple[str, int]] = []
        self._sel = selectors.DefaultSelector()
        self._socks: list[socket.socket] = []
        for host in hosts:
            for _ in range(ports):
                ls = socket.socket()
                ls.bind((host, 0))
                ls.listen(1024)
                us = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                us.bind((host, 0))
                for s, kind, out in ((ls, "tcp", self.tcp), (us, "udp", self.udp)):
                    s.setblocking(False)
                    self._sel.register(s, selectors.EVENT_READ, (kind, s.getsockname()))
                    self._socks.append(s)
                    out.append(s.getsockname())
        self._stop = False
        self._thread = threading.Thread(target=self._count, daemon=True)
        self._thread.start()

    def _count(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(0.05):
                kind, (host, port) = key.data
                try:
                    if kind == "tcp":
                        c, _ = key.fileobj.accept()  # type: ignore[union-attr]
                        c.close()
                    else:
                        key.fileobj.recvfrom(2048)  # type: ignore[union-attr]
                except OSError:
                    continue
                self.hits[(kind, host, port)] += 1

    def addrs(self) -> list[Multiaddr]:
        """Every socket's address, a TCP and a QUIC one per port in turn."""
        out = []
        for (th, tp), (uh, up) in zip(self.tcp, self.udp):
            out += [Multiaddr(f"/ip4/{th}/tcp/{tp}"), Multiaddr(f"/ip4/{uh}/udp/{up}/quic-v1")]
        return out

    def reached(self, kind: str | None = None) -> dict[tuple[str, str, int], int]:
        return {k: n for k, n in self.hits.items() if kind in (None, k[0])}

    def hosts_reached(self) -> set[str]:
        return {host for _, host, _ in self.hits}

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        for s in self._socks:
            s.close()


@pytest.fixture
def victims():
    made: list[Victim] = []

    def make(hosts: list[str], ports: int = 1) -> Victim:
        made.append(Victim(hosts, ports))
        return made[-1]

    yield make
    for v in made:
        v.close()


# -- nodes ------------------------------------------------------------------------------------------


def _puncher(relay: lattica.Node, **kw) -> lattica.Node:
    """Our node: listens on TCP and QUIC (so its punches really send), private, reserved on ``relay``."""
    node = lattica.Node([TCP, QUIC], relays=[str(relay.addrs[0])], nat=NatConfig(reachability="private"), **QUIET, **kw)
    node.start()
    return node


def _circuit(node: lattica.Node) -> str:
    assert wait_for(lambda: node.nat_status().relays, timeout=10), "no reservation within 10 s"
    return node.nat_status().relays[0] + f"/p2p/{node.peer_id}"


def _hostile(
    handler: Handler | None, relay: lattica.Node, reserve: bool = False, protocol: str = dcutr.PROTOCOL, **kw
) -> lattica.Node:
    """A fresh identity offering DCUtR and not our hole punching (what a libp2p peer looks like),
    answering DCUtR streams with ``handler``, and dialing nobody but ``relay`` (so a relayed
    connection is all there is between it and us); ``reserve``: it listens nowhere but there.
    ``protocol=OUR_PROTOCOL``: it offers our hole punching instead, answered with ``handler``."""
    if reserve:
        kw |= {"relays": [str(relay.addrs[0])], "nat": NatConfig(reachability="private")}
    node = _dialing_only(lattica.Node([], **QUIET, **kw).start(), relay)
    host = node._host

    def plain() -> None:
        host.handlers.pop(OUR_PROTOCOL, None)
        host.handlers.pop(dcutr.PROTOCOL, None)
        if handler is not None:
            host.handlers[protocol] = handler
        host.dialer._try_upgrade = lambda conn: None  # (no punch of its own either)

    on_loop(node, plain)
    return node


def _dialing_only(node: lattica.Node, relay: lattica.Node) -> lattica.Node:
    """``node``, dialing nobody but ``relay`` directly (a relayed connection is all it gets to us)."""
    dialer = node._host.dialer
    dial_addrs = dialer.dial_addrs

    async def only_the_relay(peer, addrs):
        if peer != relay.peer_id:
            addrs = [a for a in addrs if a.is_circuit]
            if not addrs:
                raise PeerUnreachable("(in this test it dials the relay only, and others through it)")
        return await dial_addrs(peer, addrs)

    on_loop(node, lambda: setattr(dialer, "dial_addrs", only_the_relay))
    return node


def _answering(addrs: list[Multiaddr]) -> Handler:
    """A DCUtR peer's side as ``A`` that answers CONNECT with ``addrs``, then takes SYNC."""

    async def answer(stream: Stream, conn: Connection) -> None:
        try:
            await read_delimited(stream, dcutr.MAX_MESSAGE)
            write_delimited(stream, dcutr.encode(dcutr.HolePunch(dcutr.PunchType.CONNECT, tuple(addrs))))
            await read_delimited(stream, dcutr.MAX_MESSAGE)
        except LatticaError:
            pass

    return answer


async def _silent(stream: Stream, conn: Connection) -> None:
    """Takes CONNECT and never answers (until the stream ends)."""
    while await stream.read(4096):
        pass


def _punches(node: lattica.Node) -> hp_actor.HolePunchService:
    return node._host.services.holepunch


def _status(node: lattica.Node) -> dict:
    async def get() -> dict:
        return _punches(node).status()

    return node.run(get(), timeout=5)


def _recent_of(node: lattica.Node, peer) -> list[dict]:
    return [r for r in _status(node)["recent"] if r["peer"] == str(peer)]


# -- what a third host receives ------------------------------------------------------------------------


def test_many_identities_aiming_our_punches_at_one_host_get_a_bounded_number_of_attempts(victims):
    """Ten identities reach us through the relay and answer our DCUtR CONNECT with eight TCP and
    eight QUIC addresses of one third host: 30 attempts asked for (3 each). The host sees at most
    the destination budget's attempts (a burst of 12, then one per 5 s, whoever asked), each to at
    most 4 TCP and 4 UDP ports; the other ports get nothing."""
    victim = victims(["127.0.0.9"], ports=8)
    with lattica.Node([TCP], relay=True, mdns=False) as relay:
        me = _puncher(relay)
        hostiles: list[lattica.Node] = []
        try:
            circuit = _circuit(me)
            t0 = time.monotonic()
            for _ in range(10):
                hostiles.append(_hostile(_answering(victim.addrs()), relay))
                hostiles[-1].connect(circuit, timeout=10)
            assert wait_for(
                lambda: sum(len(_recent_of(me, h.peer_id)) for h in hostiles) == 30 and not _status(me)["active"],
                timeout=30,
            ), _status(me)
            elapsed = time.monotonic() - t0
            time.sleep(0.5)  # (the last datagrams in flight)
            first_tcp, first_udp = victim.tcp[0], victim.udp[0]
            attempts = victim.hits[("tcp", *first_tcp)]  # every attempt connects to the first TCP port
            assert attempts <= 12 + 1 + 0.2 * elapsed, (attempts, elapsed)
            assert victim.hits[("udp", *first_udp)] > 0  # (it was reached: the budget, not a broken test)
            assert {p for _, _, p in victim.reached("tcp")} <= {p for _, p in victim.tcp[:4]}, victim.hits
            assert {p for _, _, p in victim.reached("udp")} <= {p for _, p in victim.udp[:4]}, victim.hits
            # and the 10 punches left nothing behind
            punches = _punches(me)
            assert on_loop(me, lambda: (len(punches._waiting), len(punches._responding), len(punches.active))) == (
                0,
                0,
                0,
            )
        finally:
            for h in hostiles:
                h.stop()
            me.stop()


def test_one_punch_aims_at_two_hosts_at_most(victims):
    """A CONNECT naming 16 addresses on 8 hosts: the punch sends to the first two hosts only
    (honest peers name what others observe first: one IPv4 address, perhaps an IPv6 one)."""
    hosts = [f"127.0.0.{i}" for i in range(10, 18)]
    victim = victims(hosts)
    with lattica.Node([TCP], relay=True, mdns=False) as relay:
        me = _puncher(relay)
        hostile = _hostile(_answering(victim.addrs()), relay)
        try:
            hostile.connect(_circuit(me), timeout=10)
            assert wait_for(lambda: len(_recent_of(me, hostile.peer_id)) == 3, timeout=20), _status(me)
            time.sleep(0.5)
            assert victim.hosts_reached() == set(hosts[:2]), victim.hits
        finally:
            hostile.stop()
            me.stop()


def test_our_own_protocols_probing_is_under_the_same_budget(monkeypatch):
    """Our own hole punching (``/lattica/holepunch/1``) has a bigger lever: a peer claiming an
    endpoint-dependent NAT makes us probe random ports at the IP of its first QUIC address, 1,000
    datagrams a second for 8 s an attempt (before the fix, four identities reaching us through the
    relay got 41,767 datagrams sent to one third host's IP in 25 s, 12 probing attempts). A
    probing attempt costs four of the destination's budget: of the 12 asked for here, 3."""
    probed: list[list[str]] = []

    async def probe(self, quic, ips, payload, window) -> None:
        probed.append(list(ips))  # (counted, not sent)

    monkeypatch.setattr(hp_actor.HolePunchService, "_probe", probe)
    monkeypatch.setattr(hp_actor, "BIRTHDAY_WINDOW", 0.3)

    async def claim_symmetric(stream: Stream, conn: Connection) -> None:
        try:
            await read_message(stream, 8192)
            write_message(stream, {"type": "connect", "addrs": ["/ip4/127.0.0.9/udp/4001/quic-v1"], "nat": DEPENDENT})
            await read_message(stream, 8192)
        except LatticaError:
            pass

    with lattica.Node([TCP], relay=True, mdns=False) as relay:
        me = _puncher(relay)
        hostiles: list[lattica.Node] = []
        try:
            circuit = _circuit(me)
            t0 = time.monotonic()
            for _ in range(4):
                hostiles.append(_hostile(claim_symmetric, relay, protocol=OUR_PROTOCOL))
                hostiles[-1].connect(circuit, timeout=10)
            assert wait_for(
                lambda: sum(len(_recent_of(me, h.peer_id)) for h in hostiles) == 12 and not _status(me)["active"],
                timeout=30,
            ), _status(me)
            elapsed = time.monotonic() - t0
            assert probed and all(ips == ["127.0.0.9"] for ips in probed), probed
            assert len(probed) <= 3 + 0.2 * elapsed / 4 + 1, (len(probed), elapsed)
        finally:
            for h in hostiles:
                h.stop()
            me.stop()


def test_private_and_loopback_targets_only_through_a_relay_on_this_machine_or_network():
    """What a punch over a relayed connection may aim at depends on where the relay is: through a
    public relay, a peer's loopback address is our own machine and its private ones are someone's
    LAN (go-libp2p sends public addresses only); through a relay on our LAN its private addresses
    may be real; through one on loopback, everything is this machine. Over a direct connection the
    peer's own address plays the relay's part."""
    from lattica.nat._holepunch import Plan, aim

    theirs = [
        Multiaddr("/ip4/127.0.0.1/tcp/22"),
        Multiaddr("/ip4/10.0.0.7/tcp/4001"),
        Multiaddr("/ip4/198.51.100.9/tcp/4001"),
        Multiaddr("/ip4/127.0.0.1/udp/53/quic-v1"),
        Multiaddr("/ip4/192.168.1.1/udp/4001/quic-v1"),
        Multiaddr("/ip4/198.51.100.9/udp/4001/quic-v1"),
    ]

    def targets(via: str | None) -> list[str]:
        plan = Plan(
            tcp_targets=[a for a in theirs if "tcp" in str(a)],
            quic_targets=[a for a in theirs if "udp" in str(a)],
            probe_ips=["127.0.0.1"],
        )
        p = aim(plan, via)
        return [str(a) for a in p.tcp_targets + p.quic_targets] + p.probe_ips

    assert targets("203.0.113.5") == ["/ip4/198.51.100.9/tcp/4001", "/ip4/198.51.100.9/udp/4001/quic-v1"]
    assert targets(None) == targets("203.0.113.5")  # (a relay we cannot place: as a public one)
    assert targets("10.0.0.1") == [
        "/ip4/10.0.0.7/tcp/4001",
        "/ip4/198.51.100.9/tcp/4001",
        "/ip4/198.51.100.9/udp/4001/quic-v1",
    ]  # (192.168.1.1 would be a third host: two at most)
    assert targets("127.0.0.1")[:2] == ["/ip4/127.0.0.1/tcp/22", "/ip4/10.0.0.7/tcp/4001"]
    assert "127.0.0.1" in targets("127.0.0.1")  # probing stays at a host aimed at


def test_the_destination_budget_is_per_host_whoever_asks_and_probing_costs_more():
    """The budget behind the two tests above, on a clock of our own: 12 attempts at a host, then
    one per 5 s, however the targets are spread over ports; a probing attempt costs four, and a
    host that cannot pay for probing any more still gets the plain attempt (an honest peer behind
    a symmetric NAT keeps its simultaneous open)."""
    from lattica.nat._holepunch import Destinations, Plan

    now = [0.0]
    budget = Destinations(clock=lambda: now[0])

    def plain(port: int) -> Plan:
        return Plan(tcp_targets=[Multiaddr(f"/ip4/192.0.2.7/tcp/{port}")], quic_targets=[])

    assert [bool(budget.admit(plain(p))[0].tcp_targets) for p in range(14)] == [True] * 12 + [False] * 2
    now[0] += 5.0
    assert budget.admit(plain(1))[0].tcp_targets and not budget.admit(plain(2))[0].tcp_targets
    probing = Plan(quic_targets=[Multiaddr("/ip4/192.0.2.8/udp/4001/quic-v1")], probe_ips=["192.0.2.8"])
    assert [bool(budget.admit(probing)[0].probe_ips) for _ in range(4)] == [True, True, True, False]
    now[0] += 5.0  # (one token back: not enough to probe, enough for the plain attempt)
    later = budget.admit(probing)[0]
    assert later.quic_targets and not later.probe_ips


# -- who may ask -----------------------------------------------------------------------------------------


def test_a_dcutr_request_from_the_relayed_connections_dialer_is_refused(victims):
    """Only the peer that received a relayed connection starts DCUtR (go and rust both refuse a
    hole-punch stream on a relayed connection they did not dial): a stranger that dialed us through
    the relay and asks anyway is reset unanswered, and nothing reaches the host it names."""
    victim = victims(["127.0.0.9"])
    with lattica.Node([TCP], relay=True, mdns=False) as relay:
        me = _puncher(relay)

        async def refuse(stream: Stream, conn: Connection) -> None:
            stream.reset()  # (our own punch towards it ends at once)

        hostile = _hostile(refuse, relay)
        try:
            hostile.connect(_circuit(me), timeout=10)
            assert wait_for(lambda: _recent_of(me, hostile.peer_id) and not _status(me)["active"], timeout=10)
            conn = hostile._host.conns[me.peer_id]
            assert conn.transport == "relay" and conn.direction == "outbound"

            async def ask() -> bytes | None:
                stream = await hostile._host.open_stream_on(conn, dcutr.PROTOCOL)
                write_delimited(stream, dcutr.encode(dcutr.HolePunch(dcutr.PunchType.CONNECT, tuple(victim.addrs()))))
                try:
                    answer = await asyncio.wait_for(read_delimited(stream, dcutr.MAX_MESSAGE), 5)
                except LatticaError:
                    return None
                write_delimited(stream, dcutr.encode(dcutr.HolePunch(dcutr.PunchType.SYNC)))
                await stream.drain()
                return answer

            assert hostile.run(ask(), timeout=10) is None
            time.sleep(1.0)
            assert _status(me)["refused"] == 1 and _status(me)["attempts"] == 0, _status(me)
            assert not victim.hits
        finally:
            hostile.stop()
            me.stop()


def test_after_sync_our_side_of_the_stream_ends_and_a_sync_flood_starts_nothing(victims):
    """We dialed a peer through a relay and it starts DCUtR (the right way round): we answer, punch
    on SYNC, and end our side of the stream as go does; SYNCs it keeps sending start nothing more
    (and the stream is reset once the punch is over: they are not kept while the connection lives)."""
    victim = victims(["127.0.0.9"])
    with lattica.Node([TCP], relay=True, mdns=False) as relay:
        hostile = _hostile(None, relay, reserve=True)
        me = _puncher(relay)
        try:
            me.connect(_circuit(hostile), timeout=10)
            assert wait_for(lambda: me.peer_id in hostile._host.conns, timeout=5)
            conn = hostile._host.conns[me.peer_id]
            assert conn.transport == "relay" and conn.direction == "inbound"

            async def flood() -> bytes:
                stream = await hostile._host.open_stream_on(conn, dcutr.PROTOCOL)
                write_delimited(stream, dcutr.encode(dcutr.HolePunch(dcutr.PunchType.CONNECT, tuple(victim.addrs()))))
                dcutr.decode(await asyncio.wait_for(read_delimited(stream, dcutr.MAX_MESSAGE), 5))
                sync = dcutr.encode(dcutr.HolePunch(dcutr.PunchType.SYNC))
                for _ in range(1000):
                    write_delimited(stream, sync)
                await stream.drain()
                try:  # what follows on our side of the stream: its end (or a reset), never silence
                    return await asyncio.wait_for(stream.read(1), 5)
                except LatticaError:
                    return b""
                except TimeoutError:
                    return b"(nothing: the stream is still open)"

            assert hostile.run(flood(), timeout=15) == b""
            assert wait_for(lambda: _status(me)["attempts"] == 1 and not _status(me)["active"], timeout=10)
            time.sleep(0.5)
            assert _status(me)["attempts"] == 1
        finally:
            me.stop()
            hostile.stop()


def test_silent_strangers_cannot_take_every_punch_slot(monkeypatch):
    """Strangers that reach us through the relay and never answer our CONNECT hold a punch slot
    each while the exchange waits for them: together they hold at most half the slots, and a member
    of our mesh arriving meanwhile is punched (before: with every slot held it never was, and its
    connection stayed relayed)."""
    monkeypatch.setattr(hp_actor, "_MAX_ACTIVE", 4)
    mesh = MeshKey.generate()
    with lattica.Node([TCP], relay=True, mdns=False) as relay:
        me = _puncher(relay, mesh=mesh)
        strangers: list[lattica.Node] = []
        try:
            circuit = _circuit(me)
            for _ in range(4):
                strangers.append(_hostile(_silent, relay))
                strangers[-1].connect(circuit, timeout=10)
            held = {str(s.peer_id) for s in strangers}
            assert wait_for(
                lambda: sum(str(p) in held for p in on_loop(me, lambda: set(_punches(me).active))) >= 2, timeout=10
            )
            with _dialing_only(lattica.Node([], mesh=mesh, **QUIET).start(), relay) as member:
                member.connect(circuit, timeout=10)
                assert wait_for(lambda: on_loop(me, lambda: me._host.circle_of(member.peer_id)) == "member", timeout=5)
                assert wait_for(lambda: _recent_of(me, member.peer_id), timeout=15), _status(me)
                assert len(held & {str(p) for p in on_loop(me, lambda: set(_punches(me).active))}) <= 2
        finally:
            for s in strangers:
                s.stop()
            me.stop()


# -- what held up ------------------------------------------------------------------------------------


def test_malformed_huge_or_late_answers_end_the_exchange_and_free_the_slot():
    """Answers to our CONNECT that are garbage, announce 1 GiB, are a SYNC, or never come: each
    ends that exchange (a protocol error, unread past the length, or the 10 s timeout), the slot
    is free again, nothing is punched, and the relayed connection still works."""

    def raw(data: bytes) -> Handler:
        async def answer(stream: Stream, conn: Connection) -> None:
            await read_delimited(stream, dcutr.MAX_MESSAGE)
            stream.write(data)
            await _silent(stream, conn)

        return answer

    sync = dcutr.encode(dcutr.HolePunch(dcutr.PunchType.SYNC))
    answers = {
        "garbage": raw(b"\x05\xff\xff\xff\xff\xff"),
        "huge": raw(b"\x80\x80\x80\x80\x04"),  # (a uvarint of 1 GiB)
        "sync": raw(uvarint(len(sync)) + sync),
        "silent": _silent,
    }
    with lattica.Node([TCP], relay=True, mdns=False) as relay:
        me = _puncher(relay)
        hostiles = {name: _hostile(h, relay) for name, h in answers.items()}
        try:
            circuit = _circuit(me)
            for h in hostiles.values():
                h.connect(circuit, timeout=10)
            for name, h in hostiles.items():
                assert wait_for(lambda h=h: _recent_of(me, h.peer_id), timeout=15), name
                (entry,) = _recent_of(me, h.peer_id)
                assert entry["outcome"] == "refused", (name, entry)
            assert _status(me)["attempts"] == 0 and not _status(me)["active"]
            assert hostiles["silent"].ping(me.peer_id) > 0  # (the relayed connection is fine)
        finally:
            for h in hostiles.values():
                h.stop()
            me.stop()
