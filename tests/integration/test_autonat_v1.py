"""Our AutoNAT v1 server (``/libp2p/autonat/1.0.0``) on 127.0.0.1, asked by a client written
here with the codec over a real libp2p-stack connection: it dials back the requester's own
address and answers OK with it; an address at another IP is refused and never dialed (v1 has no
amplification guard); an address at the requester's IP where nobody listens is a dial error.
Both AutoNAT servers are in our libp2p identify."""

from __future__ import annotations

import socket
import threading

import pytest

import lattica
from lattica._framing import read_delimited, write_delimited
from lattica._multiaddr import Multiaddr
from lattica.errors import LatticaError
from lattica.nat import _autonat_v1_wire as v1
from lattica.nat import _autonat_v2_wire as v2

TCP = "/ip4/127.0.0.1/tcp/0"
pytestmark = pytest.mark.timeout(60)


def connect_libp2p(caller: lattica.Node, target: lattica.Node) -> None:
    host, port = target.addrs[0].host_port()

    async def remember() -> None:
        caller._host.transport_set.named("tcp")._libp2p_at[(host, port)] = None

    caller.run(remember())
    caller.connect(target.addrs[0])
    assert caller._host.conns[target.peer_id].libp2p


def ask_v1(client: lattica.Node, server: lattica.Node, msg: v1.Message) -> v1.Message | LatticaError:
    """One v1 request on its own stream: the server's answer (or the error that ended the stream)."""

    async def go() -> v1.Message | LatticaError:
        conn = await client._host.get_connection(server.peer_id)
        stream = await client._host.open_stream_on(conn, v1.PROTOCOL)
        write_delimited(stream, v1.encode(msg))
        try:
            return v1.decode(await read_delimited(stream, v1.MAX_MESSAGE))
        except LatticaError as e:
            return e

    return client.run(go(), timeout=30)


class Listener:
    """A TCP listener that counts and drops every connection (a would-be victim)."""

    def __init__(self, ip: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.bind((ip, 0))
        self.sock.listen(64)
        self.addr = Multiaddr(f"/ip4/{ip}/tcp/{self.sock.getsockname()[1]}")
        self.accepted = 0
        self.sock.settimeout(0.1)
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            c.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


def test_both_autonat_servers_are_in_our_libp2p_identify() -> None:
    with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client:
        connect_libp2p(client, server)
        info = client._host.info[client._host.conns[server.peer_id]]
        assert v1.PROTOCOL in info.protocols and v2.DIAL_REQUEST in info.protocols


def test_the_requesters_own_address_is_dialed_back_and_named_in_the_ok() -> None:
    with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client:
        connect_libp2p(client, server)
        mine = client.addrs[0].without_peer_id()
        answer = ask_v1(client, server, v1.Dial(client.peer_id.to_bytes(), (mine,)))
        assert answer == v1.DialResponse(v1.Status.OK, addr=mine)
        assert server._host.services.autonat.v1_counts == {"requests": 1, "dialed": 1, "reached": 1, "refused": 0}


def test_another_ips_address_is_refused_and_never_dialed() -> None:
    victim = Listener("127.0.0.2")
    try:
        with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client:
            connect_libp2p(client, server)
            answer = ask_v1(client, server, v1.Dial(client.peer_id.to_bytes(), (victim.addr,)))
            assert isinstance(answer, v1.DialResponse) and answer.status == v1.Status.E_DIAL_REFUSED, answer
            assert answer.addr is None
            counts = server._host.services.autonat.v1_counts
            assert counts["dialed"] == 0 and counts["refused"] == 1
            assert client.ping(server.peer_id) > 0
    finally:
        victim.close()
    assert victim.accepted == 0


def test_an_address_nobody_answers_at_is_a_dial_error() -> None:
    victim = Listener()  # (it takes the connection and drops it: no libp2p peer there)
    try:
        with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client:
            connect_libp2p(client, server)
            answer = ask_v1(client, server, v1.Dial(client.peer_id.to_bytes(), (victim.addr,)))
            assert isinstance(answer, v1.DialResponse) and answer.status == v1.Status.E_DIAL_ERROR, answer
            assert server._host.services.autonat.v1_counts["dialed"] == 1
    finally:
        victim.close()
    assert victim.accepted == 1
