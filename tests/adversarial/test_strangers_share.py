"""Issue 46, must-have 2: what all strangers together may cost is bounded, not only what each
one may. Real nodes on loopback; each stranger is a node of its own mesh (its own identity),
calling at once the public methods the open network may call; a member calls meanwhile."""

from __future__ import annotations

import asyncio
import time

import pytest

import lattica
from helpers import call_as, wait_for
from lattica.actors.content import content_ref
from lattica.actors.dht.actor import dht_ref
from lattica.config import ContentConfig
from lattica.content._cid import Cid
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"


def _strangers(n: int, target: lattica.Node) -> list[lattica.Node]:
    out = []
    for _ in range(n):
        s = lattica.Node(
            [TCP], mesh=MeshKey.generate(), pubsub=False, membership=False, content=ContentConfig(blocks="memory")
        ).start()
        s.connect(target.addrs[0])
        out.append(s)
    return out


def _burst(node: lattica.Node, ref, method: str, args: tuple, n: int) -> int:
    """Make ``n`` calls at once from ``node``; how many were served."""

    async def go() -> int:
        got = await asyncio.gather(
            *(node._host.runtime.call(ref, method, args, {}, timeout=30) for _ in range(n)), return_exceptions=True
        )
        return sum(not isinstance(g, BaseException) for g in got)

    return node.run(go(), timeout=60)


def test_eight_strangers_asking_have_share_one_budget_and_a_member_is_served():
    """8 identities each name 32 x 1,024 CIDs in ``have`` calls at once: each is within its own
    budget (32,768 CIDs at once), all together get what one peer may (before: eight times it,
    and an honest member's ``have`` p50 went from 7.8 to 536 ms); a member's calls all go on."""
    key = MeshKey.generate()
    cids = [Cid.of(i.to_bytes(4, "big")).bytes for i in range(1024)]
    with lattica.Node([TCP], mesh=key, content=ContentConfig(blocks="memory")) as victim:
        strangers = _strangers(8, victim)
        try:
            ref = content_ref(victim.peer_id)
            t0 = time.monotonic()
            served = sum(_burst(s, ref, "have", (cids,), 32) for s in strangers)
            took = time.monotonic() - t0
            # (the strangers' one budget: 32 calls' CIDs at once, 16 a second after; 8 times that before)
            assert 32 <= served <= 32 + 16 * took + 8, (served, took)
            with lattica.Node([TCP], mesh=key) as member:
                member.connect(victim.addrs[0])
                assert _burst(member, ref, "have", (cids,), 16) == 16
        finally:
            for s in strangers:
                s.stop()


def test_strangers_calls_share_one_budget_and_members_calls_go_on():
    """8 identities call the DHT's ``ping`` 1,500 times each, all at once: together they are
    read at the strangers' share (2,000 units at once, 1,000 a second; a ping is about one),
    the rest waits unread and is served in turn, none lost; a member calling meanwhile is served
    at once, every time (before: all 12,000 went straight in beside the member's)."""

    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key, content=False) as victim, lattica.Node([TCP], mesh=key) as member:
        member.connect(victim.addrs[0])
        strangers = _strangers(8, victim)
        try:
            ref = dht_ref(victim.peer_id)

            async def member_calls() -> int:
                got = await asyncio.gather(
                    *(member._host.runtime.call(ref, "ping", (), {}, timeout=30) for _ in range(200)),
                    return_exceptions=True,
                )
                return sum(g is True for g in got)

            async def flood(s) -> int:
                got = await asyncio.gather(
                    *(s._host.runtime.call(ref, "ping", (), {}, timeout=60) for _ in range(1500)),
                    return_exceptions=True,
                )
                return sum(g is True for g in got)

            t0 = time.monotonic()
            floods = [asyncio.run_coroutine_threadsafe(flood(s), s._host.loop) for s in strangers]
            time.sleep(0.5)
            assert member.run(member_calls(), timeout=60) == 200
            served = sum(f.result(90) for f in floods)
            took = time.monotonic() - t0
            assert served == 8 * 1500
            assert took >= 3.0, took  # ((12,000 - 2,000 at once) / 1,000 a second = 10 s at the least)
        finally:
            for s in strangers:
                s.stop()


def test_a_strangers_call_waits_for_its_turn_when_the_share_is_spent():
    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key, content=False) as victim:
        (s,) = _strangers(1, victim)
        try:
            bucket = victim._host.runtime.strangers_calls.share._bucket
            call_as(s, dht_ref(victim.peer_id), "ping")
            bucket._state[None] = [-500.0, time.monotonic()]  # (in debt: half a second at 1,000 a second)
            t0 = time.monotonic()
            assert call_as(s, dht_ref(victim.peer_id), "ping", timeout=10) is True
            assert time.monotonic() - t0 >= 0.4
        finally:
            s.stop()


def test_messages_strangers_send_cost_at_most_the_strangers_signature_checks(monkeypatch):
    """A stranger sends 10 batches of 1,024 messages under throwaway author keys on an open
    topic: the node looks at most at the strangers' share of messages (PubSubConfig.
    strangers_messages a second, twice that at once), the rest is dropped before it is decoded, checked or remembered (before: every one
    was checked, 1.5 s of the attacker's CPU cost the victim 7.7 s); a member's message still
    arrives."""

    from test_pubsub_peers import _message

    from lattica._identity import KeyPair
    from lattica.actors.pubsub import pubsub_ref, validation
    from lattica.config import PubSubConfig

    checks = [0]
    real = validation.verify_signature

    def counting(*a):
        checks[0] += 1
        return real(*a)

    monkeypatch.setattr(validation, "verify_signature", counting)
    key = MeshKey.generate()
    cfg = PubSubConfig(open_topics=["pub"], discover=False)
    with lattica.Node([TCP], mesh=key, pubsub=cfg) as victim, lattica.Node([TCP], mesh=key, pubsub=cfg) as member:
        sub = lattica.pubsub.subscribe("pub", node=victim)
        (s,) = _strangers(1, victim)
        try:
            minted = [KeyPair.generate() for _ in range(64)]
            batches = [[_message(minted[(b * 1024 + i) % 64], "pub", i) for i in range(1024)] for b in range(10)]
            t0 = time.monotonic()
            for batch in batches:
                call_as(s, pubsub_ref(victim.peer_id), "open_rpc", [[], batch, [], [], [], [], []], timeout=30)
            time.sleep(0.5)
            elapsed = time.monotonic() - t0
            rate = cfg.strangers_messages
            assert checks[0] <= 2 * rate + rate * elapsed + 64, (checks[0], elapsed)
            assert checks[0] >= rate  # (strangers' messages are checked, within their share)
            seen = len(victim._host.services.pubsub.router._seen)
            assert seen <= 2 * rate + rate * elapsed + 64, (seen, elapsed)
            member.connect(victim.addrs[0])
            lattica.pubsub.subscribe("pub", node=member)
            time.sleep(1.0)
            lattica.pubsub.publish("pub", "from a member", node=member).result(10)
            got = sub.get(timeout=10).data
            while got != "from a member":
                got = sub.get(timeout=10).data
        finally:
            s.stop()


def test_a_strangers_batch_is_checked_a_few_messages_at_a_turn_of_the_loop(monkeypatch):
    """A stranger's batch of 64 messages on an open topic (within the share) is not checked in
    one go (before: 64 signature checks, and the members' work waiting behind them): a few at
    each turn of the node's loop, members' work served in between, and every one in the end."""
    from test_pubsub_peers import _message

    from lattica._identity import KeyPair
    from lattica.actors.pubsub import strangers, validation
    from lattica.config import PubSubConfig

    checks = [0]
    real = validation.verify_signature

    def counting(*a):
        checks[0] += 1
        return real(*a)

    monkeypatch.setattr(validation, "verify_signature", counting)
    cfg = PubSubConfig(open_topics=["pub"], discover=False, strangers_messages=10_000)
    with lattica.Node([TCP], mesh=MeshKey.generate(), pubsub=cfg) as victim:
        sub = lattica.pubsub.subscribe("pub", node=victim)
        (s,) = _strangers(1, victim)
        try:
            batch = [_message(KeyPair.generate(), "pub", i) for i in range(64)]
            svc = victim._host.services.pubsub

            async def take() -> list[int]:
                svc.on_rpc(s.peer_id, [[], batch, [], [], [], [], []], stranger=True)
                seen = [checks[0]]  # (signatures checked so far, after each turn of the loop)
                for _ in range(200):
                    await asyncio.sleep(0)
                    seen.append(checks[0])
                return seen

            seen = victim.run(take(), timeout=30)
            most = max(b - a for a, b in zip([0, *seen], seen))
            assert 1 <= most <= strangers.SLICE, seen
            assert seen[-1] == 64
            assert sorted(sub.get(timeout=10).data for _ in range(64)) == list(range(64))
        finally:
            s.stop()


def test_strangers_pings_share_one_budget_and_a_members_pings_go_on():
    """Two strangers pipeline pings on two streams each as fast as the node echoes them (one
    identity pegged the victim's loop: echoing had no strangers' share): together they get the
    strangers' share of echoes, and a member's pings are answered meanwhile."""
    from lattica import _ping as ping
    from lattica._host.host import STRANGERS_PINGS

    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key) as victim, lattica.Node([TCP], mesh=key) as member:
        member.connect(victim.addrs[0])
        strangers = _strangers(2, victim)
        try:

            async def flood(s: lattica.Node, until: float) -> int:
                stream = await s._host.open_stream(victim.peer_id, ping.PROTOCOL)
                echoed = 0

                async def reader() -> None:
                    nonlocal echoed
                    while True:
                        data = await stream.read(65536)
                        if not data:
                            return
                        echoed += len(data) // 32

                task = asyncio.ensure_future(reader())
                while time.monotonic() < until:
                    stream.write(b"p" * 32 * 64)
                    await stream.drain()
                    await asyncio.sleep(0.001)
                task.cancel()
                stream.reset()
                return echoed

            t0 = time.monotonic()
            until = t0 + 2.0
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(4) as ex:
                jobs = [ex.submit(s.run, flood(s, until), 30) for s in strangers for _ in range(2)]
                rtts = [member.ping(victim.peer_id) for _ in range(5)]
                echoed = sum(j.result() for j in jobs)
            took = time.monotonic() - t0
            rate, burst = STRANGERS_PINGS
            assert echoed <= burst + rate * took + 4 * 64, (echoed, took)
            assert echoed >= rate, echoed  # (strangers are answered, within their share)
            assert all(r > 0 for r in rtts)
        finally:
            for s in strangers:
                s.stop()


def _live(turns) -> int:
    return sum(1 for fut, _, _ in list(turns._queue) if not fut.done())


@pytest.mark.parametrize("what", ["calls", "pings"])
def test_strangers_waiting_for_their_turn_stop_when_their_connection_goes(what):
    """Hostile review of the turns (issue 46): a stranger's call channel (or ping stream) waiting
    for the strangers' share kept its task, stream and unread frame until its turn after its
    connection was gone, and live strangers queued behind the dead (16 identities reconnecting
    grew the victim by 700 MB). A waiter whose stream or connection goes away stops waiting."""
    from lattica import _ping as ping
    from lattica import _rpc as rpc

    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key, content=False) as victim:
        host = victim._host
        turns = host.runtime.strangers_calls if what == "calls" else host._strangers_pings
        turns.share._bucket._state[None] = [-1e9, time.monotonic()]  # (strangers spent the share for good)
        (s,) = _strangers(1, victim)
        try:

            async def wait_and_go() -> int:
                conn = await s._host.get_connection(victim.peer_id)
                for _ in range(4):
                    if what == "calls":
                        st = await s._host.open_stream_on(conn, rpc.PROTOCOL)
                        st.write(
                            len(b"x" * 4096).to_bytes(4, "big") + b"x" * 4096
                        )  # (a frame: its length, then its bytes)
                    else:
                        st = await s._host.open_stream_on(conn, ping.PROTOCOL)
                        st.write(b"p" * 32)
                for _ in range(100):
                    if _live(turns) >= 4:
                        break
                    await asyncio.sleep(0.02)
                waiting = _live(turns)
                conn.abort("gone")
                return waiting

            assert s.run(wait_and_go(), 10) == 4  # (all four wait their turn)
            assert wait_for(lambda: _live(turns) == 0, timeout=3), _live(turns)
            if what == "calls":
                assert not host.runtime.channels_from(s.peer_id)
        finally:
            s.stop()
