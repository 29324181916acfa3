"""Membership between real processes: a killed node, a frozen node and a node that leaves.

Three node processes and the test's own node form a mesh (the test node dials them; they learn of
each other through gossip). Default detector settings throughout.
"""

from __future__ import annotations

import os
import signal
import time

import lattica
from helpers import wait_for
from lattica.actors.membership import membership_ref
from lattica.mesh.process import ServerProcess

TCP = "/ip4/127.0.0.1/tcp/0"


def _state(node: lattica.Node, peer: str) -> str | None:
    return next((r["state"] for r in node.nodes() if r["peer_id"] == peer), None)


def test_killed_frozen_and_departed_members(capsys):
    with lattica.Node([TCP], labels={"role": "test"}) as me:
        with ServerProcess([TCP]) as killed, ServerProcess([TCP]) as frozen, ServerProcess([TCP]) as leaving:
            procs = (killed, frozen, leaving)
            for p in procs:
                me.connect(p.addr("tcp"))
            assert wait_for(lambda: all(_state(me, p.peer_id) == "alive" for p in procs), timeout=10)
            # what each says about itself arrives with its gossip
            assert wait_for(lambda: all("cpu" in r for r in me.nodes()), timeout=10)
            view = {r["peer_id"]: r for r in me.nodes()}
            assert view[str(me.peer_id)]["labels"] == {"role": "test"} and view[killed.peer_id]["cpu"] >= 1
            # the others learned of each other through gossip (only we dialed them)
            assert wait_for(lambda: _state_at(me, killed, frozen.peer_id) == "alive", timeout=10)

            t0 = time.monotonic()
            os.kill(killed.pid, signal.SIGKILL)  # its connections reset; the redial is refused
            assert wait_for(lambda: _state(me, killed.peer_id) == "dead", timeout=10)
            t_kill = time.monotonic() - t0

            t0 = time.monotonic()
            os.kill(frozen.pid, signal.SIGSTOP)  # silent: the connection stays open
            try:
                assert wait_for(lambda: _state(me, frozen.peer_id) == "dead", timeout=15)
                t_stop = time.monotonic() - t0
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
            # thawed, it hears it was declared dead, comes back in a newer incarnation
            assert wait_for(lambda: _state(me, frozen.peer_id) == "alive", timeout=15)
            assert next(r for r in me.nodes() if r["peer_id"] == frozen.peer_id)["incarnation"] >= 1

            t0 = time.monotonic()
            leaving.__exit__(None, None, None)  # a clean stop says goodbye
            assert wait_for(lambda: _state(me, leaving.peer_id) == "left", timeout=10)
            t_leave = time.monotonic() - t0
            with capsys.disabled():
                print(
                    f"\nmembership: SIGKILL known dead after {t_kill:.2f} s, SIGSTOP after {t_stop:.2f} s, clean stop known after {t_leave:.2f} s"
                )


def _state_at(me: lattica.Node, proc: ServerProcess, peer: str) -> str | None:
    """``peer``'s state in ``proc``'s view (asked of its membership actor)."""
    ref = membership_ref(lattica.PeerId.from_string(proc.peer_id))
    rows = me.run(me._host.runtime.call(ref, "view", (), {}, timeout=5), timeout=10)
    return next((r["state"] for r in rows if r["peer_id"] == peer), None)


def test_a_disconnect_is_honoured_and_is_not_a_failure():
    """Node.disconnect closes the link on purpose: membership neither redials it nor, over the
    next seconds of silence between the two, takes either node for dead (the third judges both)."""
    with lattica.Node([TCP]) as a, lattica.Node([TCP]) as b, lattica.Node([TCP]) as c:
        b.connect(a.addrs[0])
        c.connect(a.addrs[0])
        c.connect(b.addrs[0])
        everyone = {str(n.peer_id) for n in (a, b, c)}
        assert wait_for(lambda: all({r["peer_id"] for r in n.nodes()} == everyone for n in (a, b, c)), timeout=10)
        b.disconnect(a.peer_id)
        assert wait_for(lambda: b.peer_id not in a._host.conns)  # (a hears of it a moment later)
        deadline = time.monotonic() + 6.0  # past suspicion (2 s of silence) plus the 1 s to dead
        while time.monotonic() < deadline:
            assert a.peer_id not in b._host.conns and b.peer_id not in a._host.conns
            assert {r["state"] for n in (a, b, c) for r in n.nodes()} == {"alive"}
            time.sleep(0.2)
