"""The emulated link (lattica.bench.linkem) that ``lattica bench ... --link`` runs across: real
TUN devices, a real far namespace, a forwarder process; checked with real sockets and a real
node on the far side. Needs root and /dev/net/tun (as the rest of the NAT lab)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from lattica.bench.linkem import EmulatedLink, Profile, available
from lattica.bench.transport import plain_tcp, server
from lattica.node import Node

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
