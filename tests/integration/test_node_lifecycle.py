"""Node lifecycle edges found in review: a start that fails leaves the node stopped, a node runs
on its own thread *or* on a shared loop (never both), astart/astop races, nodes sharing one loop
keep their own identity inside actor methods, and a name re-registered right after a kill stays
visible."""

import asyncio
import socket

import pytest

import lattica
import sample_actors as sa
from helpers import wait_for

pytestmark = pytest.mark.timeout(60)


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
        from lattica.actor import current_runtime

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
    out = _run_script(tmp_path, """
        import lattica
        lattica.init(["/ip4/127.0.0.1/tcp/0"])
        print("ok")
    """)
    assert out.strip() == "ok"


def test_a_script_that_spawns_actors_and_returns_exits_and_their_on_stop_runs(tmp_path):
    marks = tmp_path / "stopped"
    marks.mkdir()
    out = _run_script(tmp_path, f"""
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
    """)
    assert out.split() == ["sync", "async", "ok"]
    assert sorted(p.name for p in marks.iterdir()) == ["async", "sync"]
