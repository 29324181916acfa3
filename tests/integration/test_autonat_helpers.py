"""Our AutoNAT server's helpers (issue 50 follow-up): a server asks other peers to dial a client
back too; one that stops answering must not hold up every check after it. Real processes on
loopback, the server and each helper at its own 127.0.0.x (the client's connections come from
127.0.0.1), so that the server sees a distinct address for each."""

from __future__ import annotations

import os
import signal
import time

import lattica
from helpers import call_as
from lattica._runtime import autonat_ref
from lattica.mesh.process import ServerProcess


def _check(client: lattica.Node, server: lattica.Node, timeout: float) -> dict:
    return call_as(
        client,
        autonat_ref(server.peer_id),
        "check",
        [str(client.addrs[0])],
        os.urandom(16),
        [],
        timeout=timeout,
    )


def test_a_frozen_helper_holds_up_one_check_and_is_then_left_out():
    with (
        lattica.Node(["/ip4/127.0.0.5/tcp/0", "/ip4/127.0.0.5/udp/0/quic-v1"], membership=False) as server,
        lattica.Node(["/ip4/127.0.0.3/udp/0/quic-v1"], membership=False) as live,
        lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False) as client,
        ServerProcess(["/ip4/127.0.0.2/udp/0/quic-v1"]) as frozen,
    ):
        server.connect(frozen.addrs[0])
        server.connect(live.addrs[0])
        client.connect(server.addrs[0])
        first = _check(client, server, timeout=10)
        assert first["tried"] and first["helper"] in (frozen.peer_id, str(live.peer_id)), first

        os.kill(frozen.pid, signal.SIGSTOP)  # its connection stays open; it answers nothing
        try:
            second = _check(client, server, timeout=20)  # (waits out the frozen helper's call once)
            assert second["helper"] == str(live.peer_id), second
            for _ in range(3):  # then it is left out: no check waits on it again
                later = _check(client, server, timeout=6)
                assert later["helper"] == str(live.peer_id), later
        finally:
            os.kill(frozen.pid, signal.SIGCONT)


def test_a_dial_back_is_answered_even_behind_the_clients_own_stream_open():
    """The client opens its identify on every connection it accepts, a dial-back's too, and its
    answer to the dial-back may come behind that open on the wire. The server's bare dial-back
    connection held the open (and everything behind it) for a gate nobody gave: one dial-back in
    ten waited out its 4 s timeout."""
    with (
        lattica.Node(["/ip4/127.0.0.5/tcp/0"], membership=False) as server,
        lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False) as client,
    ):
        client.connect(server.addrs[0])
        for _ in range(16):
            answer = _check(client, server, timeout=3)  # (well inside the dial-back's 4 s)
            assert answer["tried"] == [str(client.addrs[0].without_peer_id())], answer
            time.sleep(0.5)  # (within the client's request rate)
