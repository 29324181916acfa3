"""Connection probes: a connection whose peer answers survives a probe; one whose peer stopped
answering (here a frozen process: its kernel still acknowledges TCP, so only the probe can tell)
is aborted when the probe's time is up."""

from __future__ import annotations

import os
import signal
import time

import lattica
from helpers import wait_for
from lattica.mesh.process import ServerProcess

TCP = "/ip4/127.0.0.1/tcp/0"


def _probe(node, peer, timeout):
    async def go():
        conn = node._host.conns[peer]
        conn.probe(timeout)
        return conn

    return node.run(go(), timeout=5)


def test_a_probe_keeps_a_live_connection_and_aborts_a_silent_one():
    with ServerProcess([TCP]) as p, lattica.Node([TCP], membership=False) as me:
        info = me.connect(p.addr("tcp"))
        conn = _probe(me, info.peer_id, 0.3)
        assert not wait_for(lambda: conn.is_closed, timeout=1.0)  # it answered
        os.kill(p.pid, signal.SIGSTOP)
        try:
            # what the peer sent just before it stopped (any traffic counts as an answer) is read
            # first: a CI run's probe began before that arrived, and the connection lived on
            time.sleep(0.5)
            conn = _probe(me, info.peer_id, 0.3)
            assert wait_for(lambda: conn.is_closed, timeout=3.0)
            assert not conn.ended_cleanly  # lost, not closed on purpose
        finally:
            os.kill(p.pid, signal.SIGCONT)
