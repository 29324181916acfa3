"""A GossipSub topic whose members are two go-libp2p nodes (p2pd 0.32, ``-pubsub``) and two
js-libp2p nodes (@libp2p/gossipsub 17) on public hosts of the NAT lab and two Lattica nodes
behind NATs (port-restricted and symmetric), issue 50: every message published by any member
reaches every other. The Lattica nodes dial the go and js nodes (outbound through their NATs);
those know each other only through them, so go's and js's messages cross Lattica nodes."""

from __future__ import annotations

import asyncio
import pathlib
import tempfile
import time

import pytest
from natlab.lab import Lab, TwoRelays
from natlab.test_matrix import Proc

from lattica.bench._peers.js_peer import JsPeer
from lattica.bench._peers.p2pd import Daemon

pytestmark = pytest.mark.timeout(240)

TOPIC = "lab/libp2p"


@pytest.fixture(scope="module")
def need_lab() -> None:
    ok, why = Lab.available()  # (as tests/natlab/conftest.py's need_lab: root, ip netns, nft)
    if not ok:
        pytest.skip(why)


def _go(lab: Lab, host, binary: pathlib.Path, tmp: str) -> Daemon:
    return Daemon(
        binary,
        pathlib.Path(tmp),
        listen=(f"/ip4/{host.ip}/tcp/4001",),
        flags=("-pubsub",),
        popen=lambda argv, **kw: lab.popen(host, argv, **kw),
    )


async def _drain(sub, out: list, seconds: float) -> None:
    """Messages a go subscription delivers within ``seconds`` (its own included: filtered later)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            out.append(await sub.next(timeout=left))
        except TimeoutError:
            return


def _js(lab: Lab, host, root: pathlib.Path) -> JsPeer:
    options = {"gossipsub": True, "listen": [f"/ip4/{host.ip}/tcp/4001"]}
    return JsPeer(root, options, popen=lambda argv, **kw: lab.popen(host, argv, **kw))


def _js_messages(js: JsPeer) -> set[str]:
    return {bytes.fromhex(m["data_hex"]).decode() for m in js.call("messages", topic=TOPIC)["messages"]}


def test_go_js_and_lattica_behind_nats_share_a_topic(need_lab, p2pd_binary, js_root) -> None:
    with Lab(prefix="ngs") as lab, tempfile.TemporaryDirectory() as t1, tempfile.TemporaryDirectory() as t2:
        relays = TwoRelays(lab)
        hosts = [lab.public_host("goa"), lab.public_host("gob")]
        js_hosts = [lab.public_host("jsa"), lab.public_host("jsb")]
        sites = [lab.add_site("port_restricted"), lab.add_site("symmetric")]
        boot = relays.start().boot
        gos = [_go(lab, h, p2pd_binary, t) for h, t in zip(hosts, (t1, t2))]
        jss: list[JsPeer] = []
        try:
            jss = [_js(lab, h, js_root) for h in js_hosts]
            for js in jss:
                js.call("subscribe", topic=TOPIC)
            ids = [asyncio.run(g.identify())[0] for g in gos]
            addrs = [f"/ip4/{h.ip}/tcp/4001/p2p/{i}" for h, i in zip(hosts, ids)]
            ours = [Proc(lab, s.host, [*boot, "--no-dht-bootstrap", "--libp2p-topic", TOPIC]) for s in sites]
            for node in ours:
                assert node.ask({"cmd": "subscribe", "topic": TOPIC}).get("ok")
                for addr in [*addrs, *(js.addr("tcp") for js in jss)]:
                    assert node.ask({"cmd": "connect", "addr": addr}) == {"ok": True}

            async def run() -> dict:
                subs = [await g.ps_subscribe(TOPIC) for g in gos]
                deadline = time.monotonic() + 30
                want = {o.peer_id for o in ours}
                while True:
                    seen = [{str(p) for p in await g.ps_peers(TOPIC)} for g in gos]
                    if all(want <= s for s in seen):
                        break
                    assert time.monotonic() < deadline, f"go never saw our nodes' subscriptions: {seen}"
                    await asyncio.sleep(0.2)
                for js in jss:
                    while not want <= set(js.call("peers", topic=TOPIC)["subscribers"]):
                        assert time.monotonic() < deadline, "js never saw our nodes' subscriptions"
                        await asyncio.sleep(0.2)
                await asyncio.sleep(2)  # (meshes: a heartbeat or two)
                for i, g in enumerate(gos):
                    await g.ps_publish(TOPIC, f"go {i}".encode())
                for i, js in enumerate(jss):
                    js.call("publish", topic=TOPIC, data_hex=f"js {i}".encode().hex())
                for i, node in enumerate(ours):
                    node.ask({"cmd": "publish", "topic": TOPIC, "data": f"lattica {i}"})
                got: list[list] = [[], []]
                await asyncio.gather(*(_drain(s, out, 10) for s, out in zip(subs, got)))
                for s in subs:
                    s.close()
                return {str(ids[i]): {d.decode() for a, _, d in got[i] if str(a) != str(ids[i])} for i in range(2)}

            at_go = asyncio.run(run())
            everything = {"go 0", "go 1", "js 0", "js 1", "lattica 0", "lattica 1"}
            for i, gid in enumerate(ids):
                assert at_go[str(gid)] == everything - {f"go {i}"}, at_go
            deadline = time.monotonic() + 10
            at_js: list[set[str]] = [set(), set()]
            while True:
                for i, js in enumerate(jss):
                    at_js[i] |= _js_messages(js)
                if all(got == everything - {f"js {i}"} for i, got in enumerate(at_js)):
                    break
                assert time.monotonic() < deadline, at_js
            deadline = time.monotonic() + 10
            while True:
                at_ours = [set(n.ask({"cmd": "received", "topic": TOPIC})["got"]) for n in ours]
                if all(everything - {f"lattica {i}"} <= got for i, got in enumerate(at_ours)):
                    break
                assert time.monotonic() < deadline, at_ours
                time.sleep(0.3)
        finally:
            for g in gos:
                g.stop()
            for js in jss:
                js.close()
