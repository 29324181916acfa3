"""The emulated link (lattica.bench.linkem) that ``lattica bench ... --link`` runs across: real
TUN devices, a real far namespace, a forwarder process; checked with real sockets and a real
node on the far side. Needs root and /dev/net/tun (as the rest of the NAT lab)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest

from lattica._node import Node
from lattica.bench.linkem import EmulatedLink, Profile, available
from lattica.bench.transport import plain_tcp, server
from lattica.transports.noise import MAX_PLAINTEXT

ok, why = available()
pytestmark = pytest.mark.skipif(not ok, reason=f"link emulation unavailable here: {why}")

_ECHO = r"""
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    d = c.recv(65536)
    if not d:
        break
    c.sendall(d)
"""


def _round_trips(link: EmulatedLink, n: int = 7) -> list[float]:
    echo = subprocess.Popen([*link.wrap, sys.executable, "-c", _ECHO, link.far_ip], stdout=subprocess.PIPE, text=True)
    try:
        port = int(echo.stdout.readline())
        with socket.create_connection((link.far_ip, port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                s.sendall(b"x")
                assert s.recv(8) == b"x"
                out.append(time.perf_counter() - t0)
            return out
    finally:
        echo.kill()
        echo.wait()


def test_the_link_delays_each_round_trip_by_its_rtt_and_no_more_than_a_little():
    with EmulatedLink(Profile(rtt=0.040)) as link:
        rtts = sorted(_round_trips(link))
    assert 0.040 <= rtts[0] and rtts[len(rtts) // 2] < 0.050, rtts


def test_a_rate_cap_holds_one_connection_to_it():
    with EmulatedLink(Profile(rtt=0.002, rate=5e6)) as link:  # 5 MB/s each way
        mb_s = plain_tcp(link, 8 << 20)
    assert 3.5 < mb_s <= 5.2, mb_s


def test_loss_drops_its_share_of_packets_and_tcp_still_delivers_everything():
    with EmulatedLink(Profile(rtt=0.004, loss=0.02)) as link:
        assert plain_tcp(link, 4 << 20) > 0  # (the sink counted every byte: plain_tcp divides what it got)
    up = link.counters["up"]  # the forwarder's own count, from this side to the far one
    assert up["sent"] > 2000 and 0.01 < up["lost"] / up["sent"] < 0.03 and up["overflow"] == 0, link.counters
    assert up["sent"] - 5 <= up["delivered"] + up["lost"] <= up["sent"]  # (the last few may be on the line at the end)


def test_a_node_on_the_far_side_answers_across_the_link():
    with server("tcp", link="region") as (srv, link), Node([]) as node:
        info = node.connect(srv.addr("tcp"))
        rtts = node.ping_many(info.peer_id, 5)
    assert link.far_ip in srv.addr("tcp")
    assert 0.010 <= min(rtts) < 0.030, rtts


def _frame_after_calls(link) -> int:
    """The client's Noise frame size towards a node across ``link`` (None: loopback) once calls
    have flowed for a little over a second (sizes are refreshed about once a second)."""
    from lattica.bench.rpc import AsyncEcho, spawn_on

    with server("tcp", link=link) as (srv, _), Node([]) as node:
        info = node.connect(srv.addr("tcp"))
        ref = spawn_on(node, AsyncEcho, info.peer_id)
        payload = b"x" * 128

        async def burst() -> None:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                got = await asyncio.gather(*(ref.echo.remote(payload) for _ in range(50)))
                assert got == [payload] * 50

        node.run(burst(), timeout=60)
        return node._host.conns[info.peer_id]._frame


def test_noise_frames_shrink_to_what_a_slow_path_carries_in_a_millisecond_and_stay_whole_on_loopback():
    # A receiver opens nothing of a frame before all of it is in: on a 200 KB/s path a 64 KiB
    # frame would hold every call in it for a third of a second (docs/protocols.md, "Frame size").
    slow = _frame_after_calls(Profile(rtt=0.020, rate=200e3))
    assert 512 <= slow <= 4096, slow
    assert _frame_after_calls(None) == MAX_PLAINTEXT


@pytest.mark.parametrize("transport, init_most, shutdown_most", [("tcp", 2.5, 0.5), ("quic", 1.5, 3.5)])
def test_a_fresh_scripts_first_call_across_a_link_counted_in_round_trips(transport, init_most, shutdown_most):
    """``lattica bench firstcall``: a fresh process joins through a node across a 200 ms link,
    resolves a name, calls once and stops. Joining waits for the handshake only (TCP's SYN and
    Noise's round trip, or QUIC's one): the bootstrap peer's identify comes inside it (before:
    a round trip more); a QUIC node's stop waits for its last bytes to be acknowledged, not for
    every connection's closing period (before: ~5 round trips). Bounds half a round trip above
    the protocol's count, so a busy machine does not fail it; one round trip more would."""
    from lattica.bench.firstcall import bench_firstcall

    row = bench_firstcall(transport, link=Profile(rtt=0.2), runs=1)
    assert row["init_rtts"] < init_most, row
    assert 0.5 < row["resolve_rtts"] < 1.5 and 0.5 < row["call_rtts"] < 1.5, row
    assert row["shutdown_rtts"] < shutdown_most, row


def test_a_stream_of_small_items_is_not_held_to_sixteen_items_a_round_trip(monkeypatch):
    """A streaming call across a 100 ms link: the consumer's item window grows with the round
    trip (refs._StreamState), so 3,000 small items take far fewer round trips than the 188 a
    fixed window of 16 needs; a slow consumer's bound is checked on loopback (test_actors)."""
    import os

    support = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([support, os.environ.get("PYTHONPATH", "")]))
    import sample_actors as sa
    from lattica.bench.rpc import spawn_on

    rtt, n = 0.1, 3000
    with server("tcp", "--allow", "sample_actors.*", link=Profile(rtt=rtt)) as (srv, _), Node([]) as node:
        info = node.connect(srv.addr("tcp"))
        ref = spawn_on(node, sa.Streamer, info.peer_id)

        async def consume() -> tuple[list, float]:
            t0 = time.perf_counter()
            got = [x async for x in ref.agen.stream(n)]
            return got, time.perf_counter() - t0

        got, took = node.run(consume(), timeout=120)
    assert got == list(range(n))
    assert took / rtt < 60, f"{n} items took {took / rtt:.0f} round trips"


def test_a_streamed_argument_of_small_items_is_not_held_to_sixteen_items_a_round_trip(monkeypatch):
    """The other direction: the caller streams 3,000 small items into a method across a 100 ms
    link; the callee's item window grows with the round trip (local.ArgStream) as a result
    stream's does (before: 16 items a round trip, ~188 round trips)."""
    import os

    support = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([support, os.environ.get("PYTHONPATH", "")]))
    import sample_actors as sa
    from lattica.bench.rpc import spawn_on

    rtt, n = 0.1, 3000
    with server("tcp", "--allow", "sample_actors.*", link=Profile(rtt=rtt)) as (srv, _), Node([]) as node:
        info = node.connect(srv.addr("tcp"))
        ref = spawn_on(node, sa.Streamer, info.peer_id)

        async def items():
            for i in range(n):
                yield i

        async def send() -> tuple[list, float]:
            t0 = time.perf_counter()
            got = await ref.collect.remote(items())
            return got, time.perf_counter() - t0

        got, took = node.run(send(), timeout=120)
    assert got == list(range(n))
    assert took / rtt < 60, f"{n} items took {took / rtt:.0f} round trips"


@pytest.mark.parametrize("version, grows", [(1, False), (2, True)], ids=["older-caller", "caller-told-what-was-taken"])
def test_only_a_caller_told_what_was_taken_gets_a_growing_argument_window(monkeypatch, version, grows):
    """A caller speaking the call protocol by hand streams 400 small items across a 100 ms link
    as fast as its credit allows. On ``/lattica/rpc/1`` (an older caller, which counts every
    grant as items taken) it is kept to a window of 16: grants of 8 after the first 16. On
    ``/lattica/rpc/2`` each grant says how many of its items were taken (the first none, then
    8 each) and the rest grows the window."""
    import os

    from lattica import _rpc as rpc
    from lattica import codec
    from lattica._runtime.refs import StreamArg

    support = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([support, os.environ.get("PYTHONPATH", "")]))
    import sample_actors as sa
    from lattica.bench.rpc import spawn_on

    def frame(obj) -> bytes:
        body = codec.encode_bytes(obj)
        return len(body).to_bytes(4, "big") + body

    async def read(stream):
        n = int.from_bytes(await stream.readexactly(4), "big")
        return codec.decode(await stream.readexactly(n))

    n = 400
    with server("tcp", "--allow", "sample_actors.*", link=Profile(rtt=0.1)) as (srv, _), Node([]) as node:
        info = node.connect(srv.addr("tcp"))
        ref = spawn_on(node, sa.Streamer, info.peer_id)

        async def talk() -> tuple[list, list]:
            s = await node.aopen_stream(info.peer_id, rpc.PROTOCOL if version == 2 else rpc.PROTOCOL_1)
            s.write(frame([rpc.CALL, 1, ref.name, "total", [StreamArg(0)], None, None, rpc.F_ARGSTREAM]))
            grants, sent, credit = [], 0, 0
            while True:
                msg = await asyncio.wait_for(read(s), 30)
                if msg[0] == rpc.ARGCRED:
                    assert len(msg) == 3 + version, msg  # (only version 2 says what was taken)
                    grants.append(rpc.grant(msg))
                    credit += msg[3]
                    while credit and sent < n:
                        s.write(frame([rpc.ARG, 1, 0, 1]))
                        sent += 1
                        credit -= 1
                    if sent == n:
                        s.write(frame([rpc.ARGEND, 1, 0]))
                        sent += 1
                else:
                    s.reset()
                    return grants, msg

        grants, reply = node.run(talk(), timeout=90)
    assert reply[0] == rpc.OK and reply[2] == n, reply
    assert grants[0] == ((16, 0) if version == 2 else (16, 16))
    assert {taken for _, taken in grants[1:]} == {8}, grants
    if grows:
        assert max(n for n, _ in grants[1:]) > 8, grants
    else:
        assert {n for n, _ in grants[1:]} == {8}, grants
