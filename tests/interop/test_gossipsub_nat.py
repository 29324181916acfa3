"""A GossipSub topic whose members are go-libp2p nodes (p2pd 0.32, ``-pubsub``) on public hosts
of the NAT lab and Lattica nodes behind NATs (port-restricted and symmetric), issue 50: every
message published by any member reaches every other. The Lattica nodes dial the go nodes
(outbound through their NATs); the go nodes know each other only through them, so go's messages
cross Lattica nodes."""

from __future__ import annotations

import asyncio
import pathlib
import tempfile
import time

import pytest
from natlab.lab import Lab, TwoRelays
from natlab.test_matrix import Proc

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


def test_go_and_lattica_behind_nats_share_a_topic(need_lab, p2pd_binary) -> None:
    with Lab(prefix="ngs") as lab, tempfile.TemporaryDirectory() as t1, tempfile.TemporaryDirectory() as t2:
        relays = TwoRelays(lab)
        hosts = [lab.public_host("goa"), lab.public_host("gob")]
        sites = [lab.add_site("port_restricted"), lab.add_site("symmetric")]
        boot = relays.start().boot
        gos = [_go(lab, h, p2pd_binary, t) for h, t in zip(hosts, (t1, t2))]
        try:
            ids = [asyncio.run(g.identify())[0] for g in gos]
            addrs = [f"/ip4/{h.ip}/tcp/4001/p2p/{i}" for h, i in zip(hosts, ids)]
            ours = [Proc(lab, s.host, [*boot, "--no-dht-bootstrap", "--libp2p-topic", TOPIC]) for s in sites]
            for node in ours:
                assert node.ask({"cmd": "subscribe", "topic": TOPIC}).get("ok")
                for addr in addrs:
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
                await asyncio.sleep(2)  # (meshes: a heartbeat or two)
                for i, g in enumerate(gos):
                    await g.ps_publish(TOPIC, f"go {i}".encode())
                for i, node in enumerate(ours):
                    node.ask({"cmd": "publish", "topic": TOPIC, "data": f"lattica {i}"})
                got: list[list] = [[], []]
                await asyncio.gather(*(_drain(s, out, 10) for s, out in zip(subs, got)))
                for s in subs:
                    s.close()
                return {str(ids[i]): {d.decode() for a, _, d in got[i] if str(a) != str(ids[i])} for i in range(2)}

            at_go = asyncio.run(run())
            everything = {"go 0", "go 1", "lattica 0", "lattica 1"}
            for i, gid in enumerate(ids):
                assert at_go[str(gid)] == everything - {f"go {i}"}, at_go
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
