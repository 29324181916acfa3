"""Relayed addresses in a Lattica SDK swarm (issue 50, ``Node(sdk=True)``), on 127.0.0.1: our
relay R serves circuit relay v2; an SDK node S reserves on it and publishes its ``/p2p-circuit``
address on ``p2p-circuit-broadcast``, which R files under S; C reserves on R too and publishes
its own (in the SDK 1.0.21 form: bincode of the address and the swarm's protocol version), which
S reads as an SDK node's."""

from __future__ import annotations

import asyncio
import time

import pytest

import lattica
from lattica.bench import host_of
from lattica.bench._peers.sdk_node import SdkNode
from lattica.config import NatConfig, SdkConfig

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"


async def _until(what: str, cond, wait: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + wait
    while not await cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def _circuit_of(node: lattica.Node, peer: lattica.PeerId) -> list[str]:
    return [str(a) for a in host_of(node).peer_addrs.get(peer, []) if a.is_circuit]


def test_relayed_addresses_travel_both_ways(sdk_python, monkeypatch):
    monkeypatch.setenv("RUST_LOG", "lattica=debug")  # (what the SDK does with a message: only its log says)
    with lattica.Node([TCP], relay=True, sdk=True, membership=False, crdt=False) as r:
        relay = str(r.addrs[0])
        # C republishes every 2 s: what C publishes before it knows S reaches S only through R's
        # gossip, and the SDK asks for gossip (IWANT) at its heartbeat, the first 5 s after it
        # starts, by when R's message cache (5 heartbeats) no longer holds it
        with lattica.Node(
            [TCP],
            sdk=SdkConfig(republish=2.0),
            relays=[relay],
            nat=NatConfig(reachability="private"),
            membership=False,
            crdt=False,
        ) as c:

            async def run() -> None:
                async with await SdkNode.start(sdk_python, [], relays=[relay]) as s:
                    ps = lattica.PeerId.from_string(s.peer_id)
                    # S's relayed address, read on the topic and filed under S
                    await _until(
                        "R never filed S's relayed address",
                        lambda: asyncio.sleep(0, bool(_circuit_of(r, ps))),
                    )
                    assert _circuit_of(r, ps)[0].startswith(
                        f"{relay.rsplit('/p2p/', 1)[0]}/p2p/{r.peer_id}/p2p-circuit"
                    )

                    # C's relayed address (C holds a reservation on R), published: the SDK reads it
                    # (its debug log says so; it files it unless it is connected to C already,
                    # which on loopback it soon is, having found C's own address through Kademlia)
                    def s_read_c() -> bool:
                        log = s.log(whole=True)
                        return f'source: Some(PeerId("{c.peer_id}"))' in log and "p2p-circuit-broadcast" in log

                    await _until("S never read C's relayed address", lambda: asyncio.sleep(0, s_read_c()))
                    assert "is not a Multiaddr" not in s.log(whole=True)

            r.run(run(), timeout=90)
            assert host_of(r).services.sdk_swarm.learned >= 1  # type: ignore[union-attr]
