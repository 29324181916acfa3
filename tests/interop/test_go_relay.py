"""Circuit relay v2 with go-libp2p 0.32 (p2pd, whose relay service is on by default), real
processes on 127.0.0.1: our node reserves on go's relay, advertises the circuit, and is reached
through it by another of our nodes and by a go node. go's relay limits each circuit (2 min and
128 KiB by default): the circuit carries identify, ping and what sets up a direct path; calls
wait for that path, and fail with a clear error when none comes."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import lattica
from lattica._host import dialer
from lattica._multiaddr import Multiaddr
from lattica.bench._peers.p2pd import daemon
from lattica.errors import PeerUnreachable
from lattica.transports import circuit_v2

TCP = ("/ip4/127.0.0.1/tcp/0",)


def _relay_addr(go, node: lattica.Node) -> str:
    go_peer, go_addrs = node.run(go.identify(), timeout=10)
    return str(go_addrs[0].with_peer_id(go_peer))


def _reserved(node: lattica.Node, relay: str) -> str:
    """The circuit address ``node`` advertises once it holds a reservation on ``relay``."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        relays = node.nat_status().relays
        if relays:
            assert relays == [relay + "/p2p-circuit"]
            assert any(str(a) == relays[0] for a in node.host.advertised_addrs())
            return relays[0] + f"/p2p/{node.peer_id}"
        time.sleep(0.05)
    raise AssertionError("no reservation on the go relay within 15 s")


def _names(node: lattica.Node, peer) -> list:
    ref = lattica.ActorRef(peer, "spawner", {"names": "async"})
    return node.run(node.host.runtime.call(ref, "names", (), {}, timeout=15.0), timeout=20)


def _circuits(node: lattica.Node, peer) -> list:
    return [c for c in node.host.conns_of.get(peer, ()) if c.transport == "relay"]


def test_ours_reserves_on_go_and_ours_reaches_it_through_the_circuit(p2pd_binary) -> None:
    with daemon(p2pd_binary, listen=TCP) as go, lattica.Node(list(TCP), mdns=False) as b:
        relay = _relay_addr(go, b)
        with lattica.Node(list(TCP), relays=[relay], mdns=False) as a:
            circuit = _reserved(a, relay)
            assert circuit_v2.HOP in b.connect(relay).protocols  # (go's relay, not ours)
            conns: list = []
            infos: list = []
            b.host.events.connected.subscribe(conns.append)
            b.host.events.identified.subscribe(infos.append)
            b.connect(circuit, timeout=10)
            [relayed] = [c for c in conns if c.remote_peer == a.peer_id and c.transport == "relay"]
            assert relayed.libp2p and relayed.relay_limit == (120, 128 * 1024)  # go's default limits
            # over libp2p's stack the two still tell each other our own identify: still members
            said = [i for i in infos if i.peer_id == a.peer_id and i.transport == "relay"]
            assert said and said[0].circle == "member", said
            # a call waits for the direct path the circuit set up (each side dials the other's
            # addresses it learned over the circuit), then goes on it
            assert isinstance(_names(b, a.peer_id), list)
            assert b.host.conns[a.peer_id].transport == "tcp"


async def _close_listeners(node: lattica.Node) -> None:
    for listener in node.host.listeners:
        await listener.close()


def test_a_call_over_only_a_limited_circuit_fails_with_a_clear_error(p2pd_binary, monkeypatch) -> None:
    """Neither of our nodes listens any more (as behind NATs no punch gets through): go's limited
    circuit is the only path, so the call says so instead of running into the relay's 128 KiB."""
    monkeypatch.setattr(dialer, "LIMITED_WAIT", 2.0)
    with daemon(p2pd_binary, listen=TCP) as go, lattica.Node(list(TCP), mdns=False) as b:
        relay = _relay_addr(go, b)
        with lattica.Node(list(TCP), relays=[relay], mdns=False) as a:
            circuit = _reserved(a, relay)
            a.run(_close_listeners(a), timeout=5)
            b.run(_close_listeners(b), timeout=5)
            b.connect(circuit, timeout=10)
            assert b.ping(a.peer_id) > 0
            with pytest.raises(PeerUnreachable, match="limited circuit"):
                _names(b, a.peer_id)
            assert [c.transport for c in b.host.conns_of[a.peer_id]] == ["relay"]


def test_a_go_node_reaches_ours_through_gos_relay(p2pd_binary) -> None:
    with daemon(p2pd_binary, listen=TCP) as go, daemon(p2pd_binary, listen=TCP) as go_client:
        with lattica.Node(list(TCP)) as probe:
            relay = _relay_addr(go, probe)
        with lattica.Node(list(TCP), relays=[relay], mdns=False) as a:
            circuit = Multiaddr(_reserved(a, relay)).without_peer_id()

            async def ping_through() -> bytes:
                await go_client.connect(a.peer_id, [circuit])
                reader, writer = await go_client.open_stream(a.peer_id, "/ipfs/ping/1.0.0")
                payload = os.urandom(32)
                writer.write(payload)
                await writer.drain()
                echo = await asyncio.wait_for(reader.readexactly(32), 10)
                writer.close()
                return payload + echo

            got = a.run(ping_through(), timeout=30)
            assert got[:32] == got[32:]
            go_client_peer, _ = a.run(go_client.identify(), timeout=10)
            relayed = [c for c in _circuits(a, go_client_peer) if c.direction == "inbound"]
            assert relayed and relayed[0].libp2p and relayed[0].relay_limit is not None


# -- our relay, libp2p clients -------------------------------------------------------------------


def _go_reserving_on(relay: str) -> tuple[str, ...]:
    """p2pd flags: private, holding a reservation on ``relay`` only (autorelay needs the DHT on;
    without bootstrap peers it stays local)."""
    return ("-dht", "-autoRelay", f"-trustedRelays={relay}", "-relayDiscovery=false", "-forceReachabilityPrivate")


def _wait_for_reservation(r: lattica.Node, peer) -> None:
    book = r.host.services.relay
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if peer in book.reservations:
            assert book.reservations[peer].libp2p
            return
        time.sleep(0.05)
    raise AssertionError("go took no reservation on our relay within 20 s")


async def _go_pings(go, peer, addr: Multiaddr) -> bool:
    await go.connect(peer, [addr])
    reader, writer = await go.open_stream(peer, "/ipfs/ping/1.0.0")
    payload = os.urandom(32)
    writer.write(payload)
    await writer.drain()
    echo = await asyncio.wait_for(reader.readexactly(32), 10)
    writer.close()
    return echo == payload


def test_go_reserves_on_our_relay_and_is_reached_through_it(p2pd_binary) -> None:
    with lattica.Node(list(TCP), relay=True, mdns=False) as r:
        relay = str(next(a for a in r.addrs if "/tcp/" in str(a)))
        with (
            daemon(p2pd_binary, listen=TCP, flags=_go_reserving_on(relay)) as go,
            daemon(p2pd_binary, listen=TCP) as other_go,
            lattica.Node(list(TCP), mdns=False) as b,
        ):
            go_peer, _ = r.run(go.identify(), timeout=10)
            _wait_for_reservation(r, go_peer)
            # ours through our relay to go: our protocol to the relay, libp2p's stack to go
            conns: list = []
            b.host.events.connected.subscribe(conns.append)
            b.connect(f"{relay}/p2p-circuit/p2p/{go_peer}", timeout=10)
            [relayed] = [c for c in conns if c.remote_peer == go_peer]
            assert relayed.transport == "relay" and relayed.libp2p
            assert b.ping(go_peer) > 0
            # go through our relay to go: circuit relay v2 both sides
            assert r.run(_go_pings(other_go, go_peer, Multiaddr(relay + "/p2p-circuit")), timeout=30)
            assert r.host.services.relay.bytes_relayed > 0


def test_go_reaches_our_node_through_our_relay(p2pd_binary) -> None:
    """Our node reserved with our own protocol; a go node's CONNECT (circuit relay v2) reaches it
    with v2's stop stream, and the two speak libp2p's stack end to end."""
    with lattica.Node(list(TCP), relay=True, mdns=False) as r:
        relay = str(next(a for a in r.addrs if "/tcp/" in str(a)))
        with lattica.Node(list(TCP), relays=[relay], mdns=False) as a, daemon(p2pd_binary, listen=TCP) as go:
            _reserved(a, relay)
            assert not r.host.services.relay.reservations[a.peer_id].libp2p
            assert r.run(_go_pings(go, a.peer_id, Multiaddr(relay + "/p2p-circuit")), timeout=30)
            go_peer, _ = a.run(go.identify(), timeout=10)
            assert any(c.libp2p for c in _circuits(a, go_peer))
