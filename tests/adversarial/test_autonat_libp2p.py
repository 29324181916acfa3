"""Hostile peers of libp2p AutoNAT (issue 50), over real libp2p-stack connections on 127.0.0.1.

Against our v2 client: servers that ask for 10 MB of dial data, that ask again and again, that
never answer, that dial back with a nonce that is not ours (and flood such dial-backs). Against
our v1 server: requests with 1,000 addresses, with another peer's id, garbage, and floods from
many identities. Each case is bounded (what we send, what we dial), logged, and the node serves
on. Last, the guard both clients share: a nonce sent back on a connection we dialed proves
nothing (a Lattica server that does so instead of dialing)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import pytest

import lattica
from helpers import wait_for
from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica._multiaddr import Multiaddr
from lattica.actors.nat import autonat, autonat_client
from lattica.config import NatConfig
from lattica.errors import LatticaError
from lattica.nat import _autonat_v1_wire as v1
from lattica.nat import _autonat_v2_wire as w
from lattica.nat import _manager
from lattica.nat._autonat_v2_client import DIAL_DATA_PER_MINUTE, Outcome
from lattica.nat._manager import DIALBACK

TCP = "/ip4/127.0.0.1/tcp/0"
pytestmark = pytest.mark.timeout(120)


def connect_libp2p(caller: lattica.Node, target: lattica.Node) -> None:
    host, port = target.addrs[0].host_port()

    async def remember() -> None:
        caller._host.transport_set.named("tcp")._libp2p_at[(host, port)] = None

    caller.run(remember())
    caller.connect(target.addrs[0])
    assert caller._host.conns[target.peer_id].libp2p


def _logged(caplog: pytest.LogCaptureFixture, event: str) -> int:
    return sum(1 for r in caplog.records if r.getMessage() == event)


# -- hostile AutoNAT v2 servers against our client -------------------------------------------


class HostileServer:
    """A node whose ``/libp2p/autonat/2/dial-request`` is ``behave(stream, conn, self)``; it
    counts the dial data it receives."""

    def __init__(self, behave) -> None:
        self.behave = behave
        self.data = 0
        self.node = lattica.Node([TCP], nat=NatConfig(autonat=False))

    def __enter__(self) -> HostileServer:
        self.node.start()

        async def install() -> None:
            self.node._host.set_handler(w.DIAL_REQUEST, self._serve)

        self.node.run(install())
        return self

    def __exit__(self, *exc) -> None:
        self.node.stop()

    async def _serve(self, stream, conn) -> None:
        try:
            await self.behave(stream, conn, self)
        except LatticaError:
            stream.reset()

    async def read(self, stream) -> w.Message:
        msg = w.decode(await read_delimited(stream, w.MAX_MESSAGE))
        if isinstance(msg, w.DialDataResponse):
            self.data += len(msg.data)
        return msg


def _ask(client: lattica.Node, server: lattica.Node, timeout: float = 30):
    """One AutoNAT v2 request of the client's to ``server`` about the client's own address."""
    asker = client._host.services.nat.libp2p_autonat
    return client.run(asker.ask(server.peer_id, [client.addrs[0].without_peer_id()]), timeout=timeout)


def _requests(client: lattica.Node):
    return client._host.services.nat.libp2p_autonat.requests


def test_a_server_asking_for_10_mb_of_dial_data_gets_none(caplog) -> None:
    caplog.set_level(logging.INFO)

    async def greedy(stream, conn, srv) -> None:
        await srv.read(stream)
        write_delimited(stream, w.encode(w.DialDataRequest(0, 10_000_000)))
        while True:
            await srv.read(stream)

    with HostileServer(greedy) as srv, lattica.Node([TCP]) as client:
        connect_libp2p(client, srv.node)
        verdict = _ask(client, srv.node)
        assert verdict.outcome == Outcome.NOTHING and "10000000" in verdict.reason
        assert srv.data == 0 and _requests(client).counts["dial_data"] == 0 and len(_requests(client)) == 0
        assert _logged(caplog, "AutoNAT v2 request abandoned") == 1
        assert client.ping(srv.node.peer_id) > 0


def test_a_server_that_asks_again_and_again_is_paid_once_per_request_and_a_budget_a_minute(caplog) -> None:
    caplog.set_level(logging.INFO)

    async def insatiable(stream, conn, srv) -> None:
        await srv.read(stream)
        while True:
            write_delimited(stream, w.encode(w.DialDataRequest(0, 100_000)))
            got = srv.data
            while srv.data < got + 100_000:
                await srv.read(stream)

    with HostileServer(insatiable) as srv, lattica.Node([TCP]) as client:
        connect_libp2p(client, srv.node)
        t0 = time.monotonic()
        verdicts = [_ask(client, srv.node) for _ in range(6)]
        elapsed = time.monotonic() - t0
        assert all(v.outcome == Outcome.NOTHING for v in verdicts)
        # each request paid at most once; together at most the budget and what refilled meanwhile
        allowed = DIAL_DATA_PER_MINUTE + DIAL_DATA_PER_MINUTE / 60 * elapsed
        assert 100_000 <= srv.data <= allowed and srv.data % 100_000 == 0, (srv.data, elapsed)
        assert srv.data == _requests(client).counts["dial_data"]
        assert any("twice" in v.reason for v in verdicts) and any("budget" in v.reason for v in verdicts)
        assert _logged(caplog, "AutoNAT v2 request abandoned") == 6
        assert len(_requests(client)) == 0
        assert client.ping(srv.node.peer_id) > 0


def test_a_server_that_never_answers_is_given_up_on(monkeypatch) -> None:
    monkeypatch.setattr(autonat_client, "_TIMEOUT", 1.0)

    async def silent(stream, conn, srv) -> None:
        await srv.read(stream)
        await asyncio.sleep(3600)

    with HostileServer(silent) as srv, lattica.Node([TCP]) as client:
        connect_libp2p(client, srv.node)
        verdict = _ask(client, srv.node)
        assert verdict.outcome == Outcome.NOTHING and "abandoned" in verdict.reason
        assert len(_requests(client)) == 0  # (its nonce is forgotten)
        assert client.ping(srv.node.peer_id) > 0


def test_dial_backs_with_a_nonce_not_ours_are_refused_and_prove_nothing(caplog) -> None:
    """The server dials us back for real, but with other nonces (50 streams of them, and one on
    the connection we asked over), then says OK: each dial-back stream is reset unanswered, and
    the request comes to nothing."""
    caplog.set_level(logging.INFO)
    answers: list[object] = []

    async def wrong_nonce(stream, conn, srv) -> None:
        msg = await srv.read(stream)
        assert isinstance(msg, w.DialRequest)
        back = await srv.node._host.services.autonat._connect_back(conn.remote_peer, msg.addrs[0], libp2p=True)

        async def deliver(on, nonce: int) -> None:
            s = await srv.node._host.open_stream_on(on, w.DIAL_BACK)
            write_delimited(s, w.encode_dial_back(nonce))
            try:
                answers.append(await read_delimited(s, 64))
            except LatticaError as e:
                answers.append(e)

        try:
            await asyncio.gather(*(deliver(back, (msg.nonce + 1 + i) % 2**64) for i in range(50)))
            await deliver(conn, msg.nonce)  # (ours, but on the connection the client dialed)
        finally:
            back.abort("done")
        write_delimited(stream, w.encode(w.DialResponse(w.ResponseStatus.OK, 0, w.DialStatus.OK)))
        await stream.close()

    with HostileServer(wrong_nonce) as srv, lattica.Node([TCP]) as client:
        connect_libp2p(client, srv.node)
        verdict = _ask(client, srv.node)
        assert verdict.outcome == Outcome.NOTHING and "no dial-back came" in verdict.reason
        assert len(answers) == 51 and all(isinstance(a, LatticaError) for a in answers), answers[:3]
        counts = _requests(client).counts
        assert counts["stray"] == 51 and counts["reached"] == 0 and counts["unconfirmed"] == 1
        assert _logged(caplog, "AutoNAT v2 dial-back refused: not a nonce of ours in flight") == 51
        assert client.ping(srv.node.peer_id) > 0


# -- hostile AutoNAT v1 clients against our server --------------------------------------------


def _ask_v1(client: lattica.Node, server: lattica.Node, raw: bytes) -> v1.Message | LatticaError:
    async def go() -> v1.Message | LatticaError:
        conn = await client._host.get_connection(server.peer_id)
        stream = await client._host.open_stream_on(conn, v1.PROTOCOL)
        write_delimited(stream, raw)
        try:
            return v1.decode(await read_delimited(stream, v1.MAX_MESSAGE))
        except LatticaError as e:
            return e

    return client.run(go(), timeout=30)


def _closed_ports(n: int) -> list[int]:
    """``n`` ports on 127.0.0.1 (whoever is there, a dial-back to them fails: no libp2p peer
    of the requester's id listens at any)."""
    return [61000 - i for i in range(n)]


def test_a_request_with_1000_addresses_is_bounded(caplog) -> None:
    """1,000 addresses do not fit the 8 KiB cap: the stream is reset unread. 700 do: 16 are
    read, and 4 dialed at most."""
    caplog.set_level(logging.INFO)
    with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client:
        connect_libp2p(client, server)
        me = client.peer_id.to_bytes()
        many = [Multiaddr(f"/ip4/127.0.0.1/tcp/{p}") for p in _closed_ports(1000)]
        assert isinstance(_ask_v1(client, server, v1.encode(v1.Dial(me, tuple(many)))), LatticaError)
        counts = server._host.services.autonat.v1_counts
        assert counts["dialed"] == 0 and counts["refused"] == 1
        assert _logged(caplog, "AutoNAT v1 request dropped") == 1
        answer = _ask_v1(client, server, v1.encode(v1.Dial(me, tuple(many[:700]))))
        assert isinstance(answer, v1.DialResponse) and answer.status == v1.Status.E_DIAL_ERROR, answer
        assert counts["dialed"] == autonat.MAX_ADDRS == 4
        assert client.ping(server.peer_id) > 0


def test_another_peers_id_and_garbage_are_bad_requests_and_nothing_is_dialed(caplog) -> None:
    caplog.set_level(logging.INFO)
    with lattica.Node([TCP]) as server, lattica.Node([TCP]) as client, lattica.Node([TCP]) as other:
        connect_libp2p(client, server)
        mine = client.addrs[0].without_peer_id()
        for raw in (
            v1.encode(v1.Dial(other.peer_id.to_bytes(), (mine,))),  # another peer's id
            v1.encode(v1.Dial(b"", (mine,))),  # none
            v1.encode(v1.DialResponse(v1.Status.OK)),  # not a request
            b"\x12\x00",  # a dial without its peer
            b"\xff\xff\xff",  # garbage
        ):
            answer = _ask_v1(client, server, raw)
            assert isinstance(answer, v1.DialResponse) and answer.status == v1.Status.E_BAD_REQUEST, (raw, answer)
        counts = server._host.services.autonat.v1_counts
        assert counts["dialed"] == 0 and counts["refused"] == 5
        assert _logged(caplog, "AutoNAT v1 request refused") == 5
        assert client.ping(server.peer_id) > 0


def test_a_flood_from_many_identities_gets_a_bounded_number_of_dials(caplog) -> None:
    """Six identities on one host ask, together, for 48 dial-backs to an address at their own IP
    (which v1 allows): the server dials it at most its per-IP burst plus what refills meanwhile,
    refuses the rest (E_DIAL_REFUSED), and serves on."""
    caplog.set_level(logging.INFO)
    victim_sock = socket.socket()  # (a plain listener: every dial there fails its handshake)
    victim_sock.bind(("127.0.0.1", 0))
    victim_sock.listen(128)
    victim = Multiaddr(f"/ip4/127.0.0.1/tcp/{victim_sock.getsockname()[1]}")
    accepted = [0]
    stop = threading.Event()

    def accept() -> None:
        victim_sock.settimeout(0.1)
        while not stop.is_set():
            try:
                c, _ = victim_sock.accept()
            except OSError:
                continue
            accepted[0] += 1
            c.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    with lattica.Node([TCP]) as server:
        askers = [lattica.Node([TCP], mdns=False).start() for _ in range(6)]
        try:
            for a in askers:
                connect_libp2p(a, server)
            results: list[object] = []
            t0 = time.monotonic()

            def ask(node: lattica.Node) -> None:
                for _ in range(8):  # one requester's whole burst
                    results.append(_ask_v1(node, server, v1.encode(v1.Dial(node.peer_id.to_bytes(), (victim,)))))

            threads = [threading.Thread(target=ask, args=(a,)) for a in askers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - t0
            assert len(results) == 48 and all(isinstance(r, v1.DialResponse) for r in results), results
            refused = [r for r in results if isinstance(r, v1.DialResponse) and r.status == v1.Status.E_DIAL_REFUSED]
            allowed = 16 + 1.0 * elapsed + 1  # the per-IP burst, its refill, and rounding
            assert len(results) - len(refused) <= allowed and refused, (len(refused), elapsed)
            assert all("busy" in r.text for r in refused if isinstance(r, v1.DialResponse))
            wait_for(lambda: accepted[0] >= len(results) - len(refused), 2)
            assert accepted[0] <= allowed
            assert _logged(caplog, "AutoNAT v1 request refused") == len(refused)
            assert askers[0].ping(server.peer_id) > 0
        finally:
            for a in askers:
                a.stop()
            stop.set()
            thread.join()
            victim_sock.close()


# -- the same guard on our own protocol ------------------------------------------------------


def test_a_lattica_server_that_sends_our_nonce_back_on_our_own_connection_proves_nothing(monkeypatch) -> None:
    """A Lattica AutoNAT server that, asked to dial us back, writes our nonce on the connection we
    asked over (one we dialed: it came through no NAT of ours) instead of dialing: the nonce
    arrives, and counts for nothing; the server said it tried, so we are private."""
    monkeypatch.setattr(_manager, "is_loopback", lambda addr: False)  # (let 127.0.0.1 be probed)
    with lattica.Node([TCP], nat=NatConfig(autonat=False)) as server, lattica.Node([TCP]) as client:
        srv = server._host.services.autonat

        async def no_dial(peer, addr, nonce) -> bool:
            stream = await srv.host.open_stream_on(srv.host.conns[peer], DIALBACK)
            write_message(stream, {"nonce": nonce, "addr": str(addr)})
            return await read_message(stream, 256) == {"ok": True}

        srv.dial_back = no_dial
        client.connect(server.addrs[0])
        assert wait_for(lambda: client.nat_status().reachability != "unknown", 30), client.nat_status()
        st = client.nat_status()
        assert st.reachability == "private" and "no dial-back got through" in st.reason, st
