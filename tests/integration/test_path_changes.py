"""Calls never fail because a node changed the path (issue 43; docs/nat.md, "When the path
changes"). A connection a node no longer wants goes away instead of closing: neither side opens
streams on it, the calls and streams on it finish there, new calls take the new path, and it
closes once empty or after ``Node(drain_grace=...)``. Each cause is tried with calls and a stream
in flight, over an emulated 150 ms link (the far node in its own process and namespace) where
the window for a crossing stream is widest: both nodes dialing each other at once, a relayed path
becoming direct, TCP replacing QUIC, idle connections retired while a call starts. On loopback:
what happens when the grace period ends first, and that calls keep their order across the move.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile

import pytest

import lattica
import path_actors as pa
import sample_actors as sa
from helpers import wait_for
from lattica._identity import KeyPair
from lattica.bench.linkem import EmulatedLink, Profile, available
from lattica.config import RelayConfig
from lattica.errors import LatticaError, PathChanged

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
ALLOW = ["sample_actors.*", "path_actors.*"]

link_ok, link_why = available()
needs_link = pytest.mark.skipif(not link_ok, reason=f"link emulation unavailable here: {link_why}")


class FarPeer:
    """``tests/support/path_peer.py`` in its own process (on the far side of ``link``)."""

    def __init__(self, listen: list[str], *extra: str, wrap: list[str] = ()) -> None:
        argv = [*wrap, sys.executable, "-u", os.path.join(SUPPORT, "path_peer.py")]
        for a in listen:
            argv += ["--listen", a]
        self.proc = subprocess.Popen([*argv, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"path_peer exited with {self.proc.wait()}")
        info = json.loads(line)
        self.peer_id = lattica.PeerId.from_string(info["peer_id"])
        self.addrs: list[str] = info["addrs"]

    def addr(self, transport: str) -> str:
        return next(a for a in self.addrs if ("/quic-v1" in a) == (transport == "quic"))

    def cmd(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


async def drive(
    ref, seconds: float, who: str = "L", concurrency: int = 8, timeout: float = 20.0
) -> tuple[int, list[str]]:
    """``concurrency`` callers calling ``put`` back to back for ``seconds``; every call carries the
    next sequence number, taken as it is made (the callee checks they arrive in that order).
    Returns (calls that succeeded, the errors of those that failed)."""
    loop = asyncio.get_running_loop()
    seq = itertools.count()
    deadline = loop.time() + seconds
    ok = 0
    errors: list[str] = []

    async def caller() -> None:
        nonlocal ok
        while loop.time() < deadline:
            i = next(seq)
            try:
                await ref.put.options(timeout=timeout).remote(who, i)
                ok += 1
            except LatticaError as e:
                errors.append(f"call {i}: {type(e).__name__}: {e}")

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return ok, errors


async def stream_all(ref, n: int, every: float) -> list:
    return [x async for x in ref.ticks.stream(n, every)]


def _watch(node: lattica.Node, peer) -> dict:
    """Count ``node``'s connections to ``peer`` as they come and as they start going away."""
    seen = {"added": [], "away": []}

    def connected(conn) -> None:
        if conn.remote_peer == peer:
            seen["added"].append(conn.transport)
            if conn.going_away:  # (retired as it came: the other of two)
                seen["away"].append(conn.transport)
            prev = conn.on_going_away

            def away(c, prev=prev) -> None:
                seen["away"].append(c.transport)
                if prev is not None:
                    prev(c)

            conn.on_going_away = away

    node.host.events.connected.subscribe(connected)
    return seen


@contextlib.contextmanager
def _over_quic(lk: EmulatedLink, far: FarPeer):
    """Our node (TCP and QUIC) on the near side, connected to ``far`` over QUIC; yields it and
    what ``_watch`` sees of its connections to ``far``."""
    with lattica.Node(
        [f"/ip4/{lk.near_ip}/tcp/0", f"/ip4/{lk.near_ip}/udp/0/quic-v1"], allow=ALLOW, membership=False, mdns=False
    ) as node:
        seen = _watch(node, far.peer_id)
        node.connect(far.addr("quic"))
        yield node, seen


def _keys(local_first: bool) -> tuple[KeyPair, KeyPair]:
    """Two keys, the local one's PeerId the smaller when ``local_first``."""
    a, b = KeyPair.generate(), KeyPair.generate()
    if (a.peer_id < b.peer_id) != local_first:
        a, b = b, a
    return a, b


@needs_link
@pytest.mark.timeout(180)
@pytest.mark.parametrize("local_first", [True, False], ids=["our-dial-kept", "our-dial-retired"])
def test_both_nodes_dial_at_once_over_a_long_link_and_no_call_fails(local_first):
    """Both nodes dial each other at the same moment across 150 ms, with calls (8 at a time) and
    a stream starting on the caller's own dial: both ends keep the connection the smaller PeerId
    dialed; the other goes away under the calls and the stream, which finish on it; the calls
    after them take the kept one, in order."""
    mine, theirs = _keys(local_first)
    with tempfile.TemporaryDirectory() as tmp, EmulatedLink("continent") as lk:
        key_file = os.path.join(tmp, "far.key")
        theirs.save(key_file)
        far = FarPeer([f"/ip4/{lk.far_ip}/tcp/0"], "--key", key_file, wrap=lk.wrap)
        try:
            with lattica.Node(
                [f"/ip4/{lk.near_ip}/tcp/0"], keypair=mine, allow=ALLOW, membership=False, mdns=False
            ) as node:
                node.host.remember_addrs(far.peer_id, [lattica.Multiaddr(far.addr("tcp"))])
                seen = _watch(node, far.peer_id)

                async def go():
                    ref = await lattica.aget_actor("log", node=far.peer_id)  # (this first call dials)
                    return ref

                # both dial at once: the far node on its command, we with our first call
                far.proc.stdin.write(f"connect {node.addrs[0]}\n")  # type: ignore[union-attr]
                far.proc.stdin.flush()  # type: ignore[union-attr]
                ref = node.run(go(), timeout=30)

                async def traffic():
                    stream = asyncio.ensure_future(stream_all(ref, 15, 0.1))
                    calls = await drive(ref, 3.0)
                    return calls, await stream, await ref.report.remote()

                (ok, errors), items, report = node.run(traffic(), timeout=90)
                assert json.loads(far.proc.stdout.readline()) == {"ok": True}  # type: ignore[union-attr]
        finally:
            far.close()
    assert not errors, errors[:5]
    assert items == list(range(15)) and ok > 20
    assert report["out_of_order"] == [], report
    assert len(seen["added"]) >= 2 and seen["away"], seen  # (the race really happened)


@needs_link
@pytest.mark.timeout(180)
def test_a_relayed_path_that_becomes_direct_finishes_its_calls_and_stream():
    """The far node is private (reachable through a relay here); our calls and a stream start on
    the circuit, the far node dials us back directly (connection reversal) and the circuit goes
    away under them: nothing fails, and calls go on direct."""
    with (
        EmulatedLink("continent") as lk,
        lattica.Node([f"/ip4/{lk.near_ip}/tcp/0"], relay=RelayConfig(), membership=False, mdns=False) as relay,
    ):
        far = FarPeer([], "--relay", str(relay.addrs[0]), wrap=lk.wrap)
        try:
            with lattica.Node([f"/ip4/{lk.near_ip}/tcp/0"], allow=ALLOW, membership=False, mdns=False) as node:
                node.connect(relay.addrs[0])
                node.host.remember_addrs(far.peer_id, [lattica.Multiaddr(a) for a in far.addrs])
                seen = _watch(node, far.peer_id)

                async def traffic():
                    ref = await lattica.aget_actor("log", node=far.peer_id)
                    stream = asyncio.ensure_future(stream_all(ref, 20, 0.1))
                    calls = await drive(ref, 4.0)
                    return calls, await stream, await ref.report.remote()

                (ok, errors), items, report = node.run(traffic(), timeout=90)
                final = node.host.conns.get(far.peer_id)
        finally:
            far.close()
    assert not errors, errors[:5]
    assert items == list(range(20)) and ok > 20
    assert report["out_of_order"] == [], report
    assert seen["added"][0] == "relay" and "relay" in seen["away"], seen
    assert final is not None and final.transport == "tcp", seen


@needs_link
@pytest.mark.timeout(180)
def test_tcp_replacing_quic_under_calls_and_a_stream_fails_nothing():
    """A QUIC connection carries calls and a stream when a TCP one to the same peer comes up: both
    ends keep TCP; the QUIC connection goes away and finishes what is on it (its control stream
    tells the other end how many streams are on their way)."""
    with EmulatedLink("continent") as lk:
        far = FarPeer([f"/ip4/{lk.far_ip}/tcp/0", f"/ip4/{lk.far_ip}/udp/0/quic-v1"], wrap=lk.wrap)
        try:
            with _over_quic(lk, far) as (node, seen):

                async def traffic():
                    ref = await lattica.aget_actor("log", node=far.peer_id)
                    stream = asyncio.ensure_future(stream_all(ref, 20, 0.1))
                    calls = asyncio.ensure_future(drive(ref, 4.0))
                    await asyncio.sleep(1.0)
                    await node.host.dial_addrs(far.peer_id, [lattica.Multiaddr(far.addr("tcp"))])
                    return await calls, await stream, await ref.report.remote()

                (ok, errors), items, report = node.run(traffic(), timeout=90)
                final = node.host.conns.get(far.peer_id)
                far_conns = far.cmd("conns")["conns"]
        finally:
            far.close()
    assert not errors, errors[:5]
    assert items == list(range(20)) and ok > 20
    assert report["out_of_order"] == [], report
    # (the QUIC dialer also asks for a TCP path by itself, a TCP-only punch: more connections
    # than ours come and go, each retired by the same rules)
    assert final is not None and final.transport == "tcp" and "quic" in seen["away"], seen
    # the far end retired QUIC too (two TCP ones we both dialed may stay until idle: the ends
    # might disagree on which is older)
    assert {c["transport"] for c in far_conns if not c["going_away"]} == {"tcp"}, far_conns


@needs_link
@pytest.mark.timeout(180)
def test_an_idle_connection_retired_as_a_call_starts_still_serves_the_call():
    """Both ends retire connections idle for 0.3 s; calls start now and then, right around that
    moment, across 150 ms: a call whose stream crosses the going-away on the wire is served on
    the old connection (refusing it would fail the call), the next call dials afresh."""
    with EmulatedLink("continent") as lk:
        far = FarPeer([f"/ip4/{lk.far_ip}/tcp/0"], "--idle-timeout", "0.3", wrap=lk.wrap)
        try:
            with lattica.Node(
                [f"/ip4/{lk.near_ip}/tcp/0"],
                allow=ALLOW,
                membership=False,
                mdns=False,
                idle_timeout=0.3,
                channel_idle=0.05,
            ) as node:
                node.host.remember_addrs(far.peer_id, [lattica.Multiaddr(far.addr("tcp"))])
                seen = _watch(node, far.peer_id)

                async def traffic():
                    ref = await lattica.aget_actor("log", node=far.peer_id)
                    errors = []
                    for i in range(16):
                        await asyncio.sleep(0.25 + (i % 6) * 0.05)  # (around the idle timeout, give or take)
                        try:
                            await ref.put.options(timeout=10).remote("L", i)
                        except LatticaError as e:
                            errors.append(f"call {i}: {type(e).__name__}: {e}")
                    return errors

                errors = node.run(traffic(), timeout=120)
        finally:
            far.close()
    assert not errors, errors[:5]
    assert len(seen["away"]) >= 3, seen  # (connections really went away between the calls)


@needs_link
@pytest.mark.timeout(180)
def test_a_peer_that_dials_again_from_a_new_address_fails_no_call():
    """An address change: the far node dials us again while its first connection still carries
    our calls and a stream (its NAT rebound, or it moved); new streams take the newer connection,
    the older one is probed, finishes what is on it and goes away once idle (0.5 s here)."""
    with EmulatedLink("continent") as lk:
        far = FarPeer([f"/ip4/{lk.far_ip}/tcp/0"], "--idle-timeout", "0.5", wrap=lk.wrap)
        try:
            with lattica.Node(
                [f"/ip4/{lk.near_ip}/tcp/0"],
                allow=ALLOW,
                membership=False,
                mdns=False,
                idle_timeout=0.5,
                channel_idle=0.2,
            ) as node:
                seen = _watch(node, far.peer_id)
                me = f"{node.addrs[0]}/p2p/{node.peer_id}"
                assert far.cmd(f"connect {me}") == {"ok": True}
                assert wait_for(lambda: node.host.conns.get(far.peer_id) is not None, timeout=10)

                async def traffic():
                    ref = await lattica.aget_actor("log", node=far.peer_id)
                    stream = asyncio.ensure_future(stream_all(ref, 30, 0.1))
                    calls = asyncio.ensure_future(drive(ref, 4.0))
                    await asyncio.sleep(1.0)
                    await asyncio.get_running_loop().run_in_executor(None, far.cmd, f"redial {me}")
                    out = await calls, await stream
                    await asyncio.sleep(1.5)  # (the older connection goes idle and goes away)
                    return out, await ref.report.remote()

                ((ok, errors), items), report = node.run(traffic(), timeout=90)
        finally:
            far.close()
    assert not errors, errors[:5]
    assert items == list(range(30)) and ok > 20
    assert report["out_of_order"] == [], report
    assert len(seen["added"]) >= 2 and seen["away"], seen


@needs_link
@pytest.mark.timeout(120)
def test_a_call_made_as_the_path_moves_waits_for_an_earlier_slower_one():
    """A 12 MB call is still crossing a 4 MB/s link on QUIC when TCP replaces it; a small call to the
    same actor made just then would overtake it on TCP, so it waits until the big one has been
    acknowledged: the callee sees them in the order they were made."""
    with EmulatedLink(Profile(rtt=0.04, rate=4e6)) as lk:
        far = FarPeer([f"/ip4/{lk.far_ip}/tcp/0", f"/ip4/{lk.far_ip}/udp/0/quic-v1"], wrap=lk.wrap)
        try:
            with _over_quic(lk, far) as (node, seen):

                async def go():
                    ref = await lattica.aget_actor("log", node=far.peer_id)
                    while node.host.conns[far.peer_id].transport != "quic":  # (our TCP-only punch may have won already)
                        await node.host.dial_addrs(far.peer_id, [lattica.Multiaddr(far.addr("quic"))])
                        await asyncio.sleep(0.05)
                    quic = node.host.conns[far.peer_id]
                    big = asyncio.ensure_future(ref.put.remote("L", 0, 0.0, os.urandom(12 << 20)))
                    await asyncio.sleep(0.3)
                    await node.host.dial_addrs(far.peer_id, [lattica.Multiaddr(far.addr("tcp"))])
                    while not quic.going_away:  # (a QUIC connection beside TCP goes away after QUIC_LINGER)
                        await asyncio.sleep(0.05)
                    assert not big.done()
                    small = await ref.put.remote("L", 1)
                    return await big, small, await ref.report.remote()

                big, small, report = node.run(go(), timeout=90)
        finally:
            far.close()
    assert (big, small) == (0, 1)
    assert report["out_of_order"] == [], report
    assert "quic" in seen["away"], seen


# -- on loopback ------------------------------------------------------------------------------------


def _two_nodes(**kw):
    a = lattica.Node(
        ["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"], allow=ALLOW, membership=False, mdns=False
    )
    b = lattica.Node(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"], membership=False, mdns=False, **kw)
    return a, b


def _addr(node: lattica.Node, transport: str) -> lattica.Multiaddr:
    return next(a for a in node.addrs if ("/quic-v1" in str(a)) == (transport == "quic"))


@pytest.mark.timeout(60)
def test_calls_still_on_a_connection_when_its_grace_ends_fail_with_path_changed_or_are_sent_again():
    """A 6 s call, a 6 s idempotent call and a long stream on a QUIC connection that goes away
    (TCP replaced it) with a 1 s grace: the plain call and the stream fail with PathChanged,
    which says what happened and what to do; the idempotent call runs again on TCP and returns."""
    a, b = _two_nodes(drain_grace=1.0)
    with a, b:
        b.connect(f"{_addr(a, 'quic')}/p2p/{a.peer_id}")

        async def go():
            ref = sa.Worker.options(node=a.peer_id).remote()
            await ref.ping.remote()
            log = pa.OrderLog.options(node=a.peer_id).remote()
            plain = asyncio.ensure_future(
                ref.slow.remote(6.0)
            )  # (QUIC goes away 2 s after TCP is up, then 1 s of grace)
            again = asyncio.ensure_future(ref.slow.options(idempotent=True).remote(6.0))
            stream = asyncio.ensure_future(stream_all(log, 100, 0.1))
            await asyncio.sleep(0.3)
            await b.host.dial_addrs(a.peer_id, [_addr(a, "tcp")])
            out = await asyncio.gather(plain, again, stream, return_exceptions=True)
            after = await ref.ping.remote()  # a new call takes TCP at once
            return out, after, b.host.conns[a.peer_id].transport

        (plain, again, stream), after, path = b.run(go(), timeout=40)
    assert isinstance(plain, PathChanged) and "grace period" in str(plain) and "idempotent=True" in str(plain), plain
    assert isinstance(stream, PathChanged), stream
    assert again == 6.0
    assert after == "pong" and path == "tcp"


@pytest.mark.timeout(60)
def test_pipelined_calls_keep_their_order_across_a_move():
    """Hundreds of calls to one actor made without waiting, while the path moves from QUIC to
    TCP: the callee sees them in the order they were made (calls held at the new path until the
    old one's are acknowledged), and none fails."""
    a, b = _two_nodes()
    with a, b:
        seen = _watch(b, a.peer_id)
        b.connect(f"{_addr(a, 'quic')}/p2p/{a.peer_id}")

        async def go():
            log = pa.OrderLog.options(node=a.peer_id).remote()
            await log.report.remote()
            futs = []
            for i in range(1000):
                futs.append(log.put.remote("b", i, 0.1))  # (each in flight 0.1 s: some always are)
                if i == 100:
                    asyncio.ensure_future(b.host.dial_addrs(a.peer_id, [_addr(a, "tcp")]))
                if i % 20 == 0:
                    await asyncio.sleep(0.07)  # (calls keep coming for 3.5 s: QUIC goes away 2 s after TCP is up)
            got = await asyncio.gather(*futs)
            return got, await log.report.remote(), b.host.conns[a.peer_id].transport

        got, report, path = b.run(go(), timeout=40)
    assert got == list(range(1000))
    assert report == {"calls": 1000, "out_of_order": []}, report
    assert path == "tcp" and "quic" in seen["away"], seen
