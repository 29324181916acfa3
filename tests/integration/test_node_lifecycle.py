"""The node's lifecycle: a start that fails leaves the node stopped, a node runs on its own thread
*or* on a shared loop (never both), astart/astop races, nodes sharing one loop keep their own
identity (in actor methods, and when one of them stops), a name re-registered right after a kill
stays visible, and a script that starts a node (and spawns actors) and returns exits."""

import asyncio
import socket
import threading
import time

import pytest

import lattica
import sample_actors as sa
from helpers import wait_for
from lattica._remote import current_runtime

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"


def test_a_start_that_fails_leaves_the_node_stopped_and_restartable():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        node = lattica.Node([f"/ip4/127.0.0.1/tcp/{port}"])
        with pytest.raises(lattica.errors.TransportError, match="cannot listen"):
            node.start()
        assert not node.running
        node.stop()  # nothing to stop: no error


def test_a_node_runs_on_its_own_thread_or_on_a_shared_loop_never_both():
    async def main():
        node = lattica.Node(["/ip4/127.0.0.1/tcp/0"])
        first, second = await asyncio.gather(node.astart(), node.astart())  # concurrent: one start
        assert first is second is node and node.running and node.addrs
        with pytest.raises(RuntimeError, match="shared loop"):
            node.start()
        with pytest.raises(RuntimeError, match="astop"):
            node.stop()
        await node.astop()
        assert not node.running

    asyncio.run(main())
    threaded = lattica.Node(["/ip4/127.0.0.1/tcp/0"]).start()
    try:
        with pytest.raises(RuntimeError, match="stop\\(\\)"):
            asyncio.run(threaded.astop())
        assert threaded.running
    finally:
        threaded.stop()


def test_astop_during_astart_stops_the_started_node():
    async def main():
        node = lattica.Node(["/ip4/127.0.0.1/tcp/0"])
        task = asyncio.create_task(node.astart())
        await asyncio.sleep(0)
        await node.astop()
        await task
        assert not node.running

    asyncio.run(main())


@lattica.actor
class _Who:
    async def who(self):
        from lattica._remote import current_runtime

        return current_runtime().peer_id


def test_nodes_sharing_a_loop_keep_their_identity_inside_actor_methods():
    async def main():
        a = await lattica.Node(["/ip4/127.0.0.1/tcp/0"]).astart()
        b = await lattica.Node(["/ip4/127.0.0.1/tcp/0"]).astart()
        try:
            rt_b = b._host.runtime
            actor = rt_b.create(_Who.cls, [], None, "who")
            await actor.ready
            assert await rt_b.call(actor.ref, "who", (), {}, timeout=5) == b.peer_id
        finally:
            await a.astop()
            await b.astop()

    asyncio.run(main())


def test_channel_idle_must_be_positive():
    with pytest.raises(ValueError, match="channel_idle"):
        lattica.Node(channel_idle=0)


@lattica.actor
class _Finder:
    async def find(self, name):
        return lattica.get_actor(name)  # sync API, on the node loop, for a local actor


def test_get_actor_of_a_local_actor_works_on_the_node_loop(default_node, token):
    target = sa.Counter.options(name=f"target-{token}").remote(1)
    finder = _Finder.remote()
    assert finder.find.remote(f"target-{token}").result(5) == target


def test_a_name_taken_again_right_after_a_kill_stays_visible(default_node, token):
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], allow=["sample_actors.*"]) as other:
        default_node.connect(other.addrs[0])
        name = f"svc-{token}"
        first = sa.Counter.options(node=other.peer_id, name=name).remote(1)
        assert first.get.remote().result(5) == 1
        assert wait_for(lambda: _resolves(name), timeout=10)
        lattica.kill(first)
        second = sa.Counter.options(node=other.peer_id, name=name).remote(2)
        assert second.get.remote().result(5) == 2
        for _ in range(20):  # the withdrawal of the first must not hide the second
            assert _resolves(name)


def _resolves(name):
    try:
        lattica.get_actor(name, timeout=3)
        return True
    except lattica.errors.ActorNotFound:
        return False


def test_stopping_one_of_two_astarted_nodes_keeps_current_runtime_for_the_other():
    lattica.shutdown()  # no default node: current_runtime() must come from the loop's own nodes

    async def main():
        n1 = await lattica.Node([TCP]).astart()
        n2 = await lattica.Node([TCP]).astart()
        n3 = None
        try:
            assert current_runtime().peer_id in (n1.peer_id, n2.peer_id)
            await n2.astop()
            assert current_runtime().peer_id == n1.peer_id  # the later node's stop left n1's mapping
            n3 = await lattica.Node([TCP]).astart()
            await n1.astop()  # the node the loop's calls went through stops; n3 still runs
            assert current_runtime().peer_id == n3.peer_id
            assert str(n3.peer_id) in lattica.dht.owned_key("x")
        finally:
            for n in (n1, n2, n3):
                if n is not None:
                    await n.astop()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_node_left_running_on_a_closed_loop_does_not_capture_the_thread(default_node, token):
    """asyncio.run ended by an exception before astop: the abandoned node's loop is closed, and
    calls from this thread go through the default node again instead of failing on that loop."""

    async def main():
        await lattica.Node([TCP]).astart()
        raise ValueError("the script failed")

    with pytest.raises(ValueError):
        asyncio.run(main())
    assert current_runtime().peer_id == default_node.peer_id
    echo = sa.Echo.options(name=f"echo-{token}").remote()
    assert lattica.get(echo.echo.remote(5)) == 5


def test_concurrent_astart_does_not_deadlock_and_stop_points_to_astop():
    async def main():
        n = lattica.Node([TCP])
        started = []

        async def start():
            node = await n.astart()
            started.append(node.running)  # whoever awaited astart gets a started node
            return node

        try:
            r1, r2 = await asyncio.wait_for(asyncio.gather(start(), start()), 5)
            assert r1 is n and r2 is n and n.running
            with pytest.raises(RuntimeError, match="astop"):
                n.stop()
            assert n.running  # stop() refused: the node still runs
        finally:
            await n.astop()
        assert not n.running
        assert started == [True, True], "an astart() returned before the node had started"

    outcome = []

    def run():  # in a thread of its own: a deadlocked loop cannot be interrupted from inside
        try:
            asyncio.run(main())
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the test
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(15)
    assert outcome, "two concurrent astart() calls deadlocked the loop"
    if outcome[0] is not None:
        raise outcome[0]


_SCRIPT_TIMEOUT = 20  # generous for a loaded CI machine; a hang is what this catches


def _run_script(tmp_path, body: str) -> str:
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=_SCRIPT_TIMEOUT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_script_that_inits_and_returns_exits(tmp_path):
    out = _run_script(
        tmp_path,
        """
        import lattica
        lattica.init(["/ip4/127.0.0.1/tcp/0"])
        print("ok")
    """,
    )
    assert out.strip() == "ok"


def test_a_script_that_spawns_actors_and_returns_exits_and_their_on_stop_runs(tmp_path):
    marks = tmp_path / "stopped"
    marks.mkdir()
    out = _run_script(
        tmp_path,
        f"""
        import pathlib
        import lattica

        MARKS = pathlib.Path({str(marks)!r})

        @lattica.actor
        class Sync:
            def ping(self):
                return "sync"
            def on_stop(self):
                (MARKS / "sync").write_text("stopped")

        @lattica.actor
        class Async:
            async def ping(self):
                return "async"
            async def on_stop(self):
                (MARKS / "async").write_text("stopped")

        lattica.init(["/ip4/127.0.0.1/tcp/0"], allow=["__main__.*"])
        a, b = Sync.remote(), Async.remote()
        print(a.ping.remote().result(10), b.ping.remote().result(10))
        # a second node, started directly and never stopped, must not hold the exit either
        other = lattica.Node(["/ip4/127.0.0.1/tcp/0"]).start()
        print("ok")
    """,
    )
    assert out.split() == ["sync", "async", "ok"]
    assert sorted(p.name for p in marks.iterdir()) == ["async", "sync"]


def test_init_returns_once_one_bootstrap_peer_answers_and_fails_only_if_none_does():
    """A bootstrap peer that accepts and then says nothing (a hung or overloaded node) does not
    hold up ``init`` while another answers; if none answers, ``init`` raises PeerUnreachable."""
    lattica.shutdown()
    with socket.socket() as silent, socket.socket() as closed, lattica.Node([TCP]) as live:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the TCP handshake; nothing answers the Noise one
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        hung = f"/ip4/127.0.0.1/tcp/{silent.getsockname()[1]}"
        refused = f"/ip4/127.0.0.1/tcp/{closed.getsockname()[1]}"
        try:
            t0 = time.monotonic()
            node = lattica.init([TCP], bootstrap=[hung, str(live.addrs[0])], dial_timeout=8.0)
            assert time.monotonic() - t0 < 4.0  # not the 8 s the hung peer's dial could take
            assert live.peer_id in node._host.conns
            lattica.shutdown()
            t0 = time.monotonic()
            with pytest.raises(lattica.errors.PeerUnreachable):
                lattica.init([TCP], bootstrap=[hung, refused], dial_timeout=1.5)
            assert time.monotonic() - t0 < 5.0  # both failures heard within the dial timeout
            assert lattica._context.default_node() is None  # no half-joined node left behind...
            node = lattica.init([TCP], bootstrap=[str(live.addrs[0])])  # ...so a retry joins
            assert live.peer_id in node._host.conns
        finally:
            lattica.shutdown()
