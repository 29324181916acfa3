"""Our AutoNAT v1 client (``actors/nat/autonat_client.py``) in the reachability round, against a
libp2p server that speaks only v1 (as go-libp2p before 0.36 does), over a real libp2p-stack
connection on 127.0.0.1: our own node's v1 server, made to serve neither Lattica AutoNAT nor v2.
Its dial-back (a bare connection) makes the client public; a server that answers OK without
dialing, or names an address we did not ask about, is not believed; one that says it could not
connect makes the client private. The NAT lab compares v1 answers from go with ours
(tests/interop/test_autonat_nat.py)."""

from __future__ import annotations

import pytest
from integration.test_autonat_v2_client import connect_libp2p, probing, until  # noqa: F401 (probing: a fixture)

import lattica
from lattica._framing import read_delimited, write_delimited
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.config import NatConfig
from lattica.nat import _autonat_v1_wire as v1
from lattica.nat import _autonat_v2_wire as v2
from lattica.nat._manager import DIALBACK

TCP = "/ip4/127.0.0.1/tcp/0"
pytestmark = pytest.mark.timeout(90)


def v1_server(node: lattica.Node, handler=None) -> None:
    """Make ``node`` a plain libp2p AutoNAT v1 server: no Lattica AutoNAT and no v2 (either would
    be asked instead), and ``handler`` for its v1 requests if given."""

    async def go() -> None:
        node._host.handlers.pop(DIALBACK)
        node._host.handlers.pop(v2.DIAL_REQUEST)
        if handler is not None:
            node._host.set_handler(v1.PROTOCOL, handler)

    node.run(go())


def counts(node: lattica.Node) -> dict:
    return node._host.services.nat.libp2p_autonat.v1_counts


def answering(response) -> object:
    async def handler(stream, conn) -> None:
        msg = v1.decode(await read_delimited(stream, v1.MAX_MESSAGE))
        assert isinstance(msg, v1.Dial)
        write_delimited(stream, v1.encode(response(msg)))
        await stream.close()

    return handler


def test_our_v1_client_is_dialed_back_by_a_v1_server_and_is_public(probing) -> None:  # noqa: F811
    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        v1_server(server)
        connect_libp2p(client, server)
        assert until(lambda: client.nat_status().reachability == "public"), client.nat_status()
        assert client.nat_status().public == [str(client.addrs[0].without_peer_id())]
        assert counts(client)["reached"] >= 1 and counts(client)["asked"] >= 1
        assert server._host.services.autonat.v1_counts["reached"] >= 1
        info = client._host.info[client._host.conns[server.peer_id]]
        assert v1.PROTOCOL in info.protocols and v2.DIAL_REQUEST not in info.protocols


def test_an_ok_without_a_dial_back_is_not_believed(probing) -> None:  # noqa: F811
    lie = answering(lambda msg: v1.DialResponse(v1.Status.OK, addr=msg.addrs[0]))
    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        v1_server(server, lie)
        connect_libp2p(client, server)
        assert until(lambda: "no connection came" in client.nat_status().reason), counts(client)
        assert client.nat_status().reachability == "unknown", client.nat_status()
        assert counts(client)["unconfirmed"] >= 1
        assert counts(client)["reached"] == 0


def test_an_ok_for_an_address_of_the_servers_choosing_is_not_believed(probing) -> None:  # noqa: F811
    """It dials us back (so a connection comes), but names an address we never asked about: we
    would advertise it if we believed it."""

    async def elsewhere(stream, conn) -> None:
        msg = v1.decode(await read_delimited(stream, v1.MAX_MESSAGE))
        await server._host.services.autonat._dial_back_v1(conn.remote_peer, msg.addrs[0], conn.libp2p)
        write_delimited(stream, v1.encode(v1.DialResponse(v1.Status.OK, addr=Multiaddr("/ip4/192.0.2.66/tcp/80"))))
        await stream.close()

    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        v1_server(server, elsewhere)
        connect_libp2p(client, server)
        assert until(lambda: "names no address we asked about" in client.nat_status().reason), counts(client)
        st = client.nat_status()
        assert st.reachability != "public" and "192.0.2.66" not in str(st), st


def test_a_server_that_could_not_connect_makes_us_private(probing) -> None:  # noqa: F811
    fail = answering(lambda msg: v1.DialResponse(v1.Status.E_DIAL_ERROR, "dial failed"))
    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        v1_server(server, fail)
        connect_libp2p(client, server)
        assert until(lambda: client.nat_status().reachability == "private"), client.nat_status()
        assert counts(client)["failed"] >= 1


def test_a_refusing_server_leaves_us_unknown(probing) -> None:  # noqa: F811
    refuse = answering(lambda msg: v1.DialResponse(v1.Status.E_DIAL_REFUSED, "busy"))
    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        v1_server(server, refuse)
        connect_libp2p(client, server)
        assert until(lambda: "E_DIAL_REFUSED" in client.nat_status().reason), client.nat_status()
        assert client.nat_status().reachability == "unknown" and counts(client)["nothing"] >= 1


def test_a_dial_that_reaches_a_listener_is_told_before_any_handshake() -> None:
    """What counts as a v1 dial-back: a bare TCP connection closed at once, and a QUIC dial that
    the dialer gives up (here: it expected another peer) are both reported by the transports."""
    import socket  # (this test only: a raw TCP dial)

    with lattica.Node([TCP, "/ip4/127.0.0.1/udp/0/quic-v1"]) as node, lattica.Node([TCP]) as other:
        seen: list[tuple[str, str]] = []
        node.run(_subscribe(node, seen))
        tcp_addr, quic_addr = node.addrs[0], node.addrs[1]
        with socket.create_connection(tcp_addr.host_port()):
            pass
        assert until(lambda: ("tcp", "127.0.0.1") in seen), seen
        wrong = quic_addr.without_peer_id().encapsulate(f"/p2p/{KeyPair.generate().peer_id}")
        with pytest.raises(lattica.errors.LatticaError):
            other.connect(wrong, timeout=5)
        assert until(lambda: ("quic", "127.0.0.1") in seen), seen


async def _subscribe(node: lattica.Node, seen: list) -> None:
    node._host.events.dialed_in.subscribe(lambda transport, ip: seen.append((transport, ip)))
