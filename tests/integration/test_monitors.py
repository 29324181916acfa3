"""lattica.monitor: told once, with a reason, when an actor stops or its node dies."""

from __future__ import annotations

import os
import queue
import signal

import pytest

import lattica
import sample_actors as sa
from helpers import wait_for
from lattica.bench.rpc import AsyncEcho, spawn_on
from lattica.mesh.process import ServerProcess

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ["sample_actors.*"]


def _spawned(node: lattica.Node, target: lattica.PeerId):
    async def go():
        ref = sa.Counter.options(node=target).remote()
        await ref.get.remote()
        return ref

    return node.run(go(), timeout=20)


def _monitor(node: lattica.Node, ref) -> tuple[queue.Queue, lattica.Monitor]:
    got: queue.Queue = queue.Queue()
    m = node.run(_set(node, ref, lambda r, why: got.put((r.name, why))), timeout=10)
    return got, m


async def _set(node, ref, cb):
    return node._host.runtime.monitors.watch(ref, cb)


def test_a_killed_actor_is_reported_once_locally_and_remotely():
    with lattica.Node([TCP], allow=ALLOW) as a, lattica.Node([TCP], allow=ALLOW) as b:
        b.connect(a.addrs[0])
        for host in (a, b):  # the actor lives on a; watched from a itself and from b
            ref = _spawned(a, a.peer_id)
            got, _ = _monitor(host, ref)
            # b's monitor is set by a call to a: kill only once a holds it (else: "noproc")
            assert wait_for(lambda: ref.name in a._host.runtime.monitors.watchers, timeout=10)
            a.run(_kill(ref), timeout=10)
            name, why = got.get(timeout=10)
            assert name == ref.name and "killed" in why
            with pytest.raises(queue.Empty):
                got.get(timeout=0.3)  # once


async def _kill(ref):
    await lattica.akill(ref)


def test_monitoring_an_actor_that_is_not_there_reports_noproc_and_cancel_silences():
    with lattica.Node([TCP], allow=ALLOW) as a, lattica.Node([TCP], allow=ALLOW) as b:
        b.connect(a.addrs[0])
        ref = _spawned(a, a.peer_id)
        ghost = lattica.ActorRef(a.peer_id, "no-such-actor", {})
        got, _ = _monitor(b, ghost)
        assert got.get(timeout=10) == ("no-such-actor", "noproc")
        got, m = _monitor(b, ref)
        m.cancel()
        a.run(_kill(ref), timeout=10)
        with pytest.raises(queue.Empty):
            got.get(timeout=1.0)


def test_an_actor_on_a_killed_node_is_reported_down():
    with lattica.Node([TCP]) as me, ServerProcess([TCP]) as srv:
        info = me.connect(srv.addr("tcp"))
        ref = spawn_on(me, AsyncEcho, info.peer_id)
        got, _ = _monitor(me, ref)
        os.kill(srv.pid, signal.SIGKILL)
        name, why = got.get(timeout=15)
        # "node down: ..." from membership, or "node unreachable: ..." if the kill beat the
        # monitor's registration: either way, once, with the reason
        assert name == ref.name and why.startswith(("node down", "node unreachable")), why
