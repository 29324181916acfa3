"""Our AutoNAT v2 client (``actors/nat/autonat_client.py``) in the reachability round, against a
libp2p AutoNAT v2 server over a real libp2p-stack connection on 127.0.0.1: our own node's v2
server, made to serve no Lattica AutoNAT (so that, to the client, it is any libp2p server). Its
dial-back makes the client public; a server that answers OK and never dials back is not believed;
one that says it could not connect makes the client private, as a failed try of our servers' does.

AutoNAT skips nodes with loopback addresses only; the tests let these count (``probing``)."""

from __future__ import annotations

import time

import pytest

import lattica
from lattica._framing import read_delimited, write_delimited
from lattica.config import NatConfig
from lattica.nat import _autonat_v2_wire as w
from lattica.nat import _manager
from lattica.nat._manager import DIALBACK

TCP = "/ip4/127.0.0.1/tcp/0"
pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def probing(monkeypatch):
    """Nodes on 127.0.0.1 check their reachability (AutoNAT leaves loopback addresses alone)."""
    monkeypatch.setattr(_manager, "is_loopback", lambda addr: False)


def until(pred, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def libp2p_server(node: lattica.Node, handler=None) -> None:
    """Make ``node`` a plain libp2p AutoNAT v2 server to its peers: no Lattica AutoNAT (our
    protocol would be asked instead), and ``handler`` for its dial requests if given."""

    async def go() -> None:
        node._host.handlers.pop(DIALBACK)
        if handler is not None:
            node._host.set_handler(w.DIAL_REQUEST, handler)

    node.run(go())


def connect_libp2p(caller: lattica.Node, target: lattica.Node) -> None:
    """Connect on the libp2p stack (as our TCP transport does once a libp2p listener answered)."""
    host, port = target.addrs[0].host_port()

    async def remember() -> None:
        caller._host.transport_set.named("tcp")._libp2p_at[(host, port)] = None

    caller.run(remember())
    caller.connect(target.addrs[0])
    assert caller._host.conns[target.peer_id].libp2p


def counts(node: lattica.Node) -> dict:
    return node._host.services.nat.libp2p_autonat.requests.counts


def test_our_v2_client_is_dialed_back_by_a_v2_server_and_is_public(probing) -> None:
    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        libp2p_server(server)
        connect_libp2p(client, server)
        assert until(lambda: client.nat_status().reachability == "public"), client.nat_status()
        st = client.nat_status()
        assert st.public == [str(client.addrs[0].without_peer_id())], st
        assert counts(client)["reached"] >= 1 and counts(client)["stray"] == 0
        # the server counts its dial-back once the client's answer came (or its wait ran out),
        # which can be after the client already believed the nonce
        assert until(lambda: server._host.services.autonat.v2_counts["reached"] >= 1)
        # the server is one of ours on libp2p's stack, asked with v2 only (it serves no Lattica AutoNAT)
        info = client._host.info[client._host.conns[server.peer_id]]
        assert w.DIAL_REQUEST in info.protocols and DIALBACK not in info.protocols


def test_a_server_that_answers_ok_and_never_dials_back_is_not_believed(probing) -> None:
    async def lie(stream, conn) -> None:
        w.decode(await read_delimited(stream, w.MAX_MESSAGE))
        write_delimited(stream, w.encode(w.DialResponse(w.ResponseStatus.OK, 0, w.DialStatus.OK)))
        await stream.close()

    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        libp2p_server(server, lie)
        connect_libp2p(client, server)
        assert until(lambda: "no dial-back came" in client.nat_status().reason), client.nat_status()
        assert client.nat_status().reachability == "unknown"
        assert counts(client)["unconfirmed"] >= 1 and counts(client)["reached"] == 0


def test_a_server_that_could_not_connect_makes_us_private(probing) -> None:
    async def fail(stream, conn) -> None:
        w.decode(await read_delimited(stream, w.MAX_MESSAGE))
        write_delimited(stream, w.encode(w.DialResponse(w.ResponseStatus.OK, 0, w.DialStatus.E_DIAL_ERROR)))
        await stream.close()

    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        libp2p_server(server, fail)
        connect_libp2p(client, server)
        assert until(lambda: client.nat_status().reachability == "private"), client.nat_status()
        assert "no dial-back got through" in client.nat_status().reason
        assert counts(client)["failed"] >= 1
