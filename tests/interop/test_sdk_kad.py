"""Our libp2p Kademlia in a Lattica SDK swarm (rust-libp2p-kad 0.46 on ``/lattica/1.0.0``, issue
49), on 127.0.0.1: our node and two SDK nodes find each other through Kademlia, provider records
go both ways under the SDK's UTF-8 keys, and values go both ways in the SDK's own format (bincode
``ValueWithTime``, through its raw calls: nothing is pickled, nobody unpickles)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

import lattica
from lattica.bench import host_of
from lattica.bench._peers.sdk_node import SdkNode, SdkValue
from lattica.dht._sdk_values import decode_value, encode_value

pytestmark = pytest.mark.timeout(90)

SDK_NET = "/lattica/1.0.0"
T = TypeVar("T")


async def _until(what: str, probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], wait: float = 15) -> T:
    deadline = time.monotonic() + wait
    while True:
        got = await probe()
        if done(got):
            return got
        assert time.monotonic() < deadline, f"{what}: still {got!r} after {wait} s"
        await asyncio.sleep(0.1)


def test_ours_in_an_sdk_swarm(sdk_python):
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False, pubsub=False, crdt=False) as node:
        kad = host_of(node).services.kad[SDK_NET]  # type: ignore[union-attr]
        ours = str(node.addrs[0])

        async def run() -> None:
            async with await SdkNode.start(sdk_python, [ours]) as a, await SdkNode.start(sdk_python, [a.addr()]) as b:
                pa, pb = lattica.PeerId.from_string(a.peer_id), lattica.PeerId.from_string(b.peer_id)
                await _until("A in our table", lambda: asyncio.sleep(0, pa in kad.table), bool)

                # we find B (connected to A only) through A's table, once A has B in it
                await _until("B found through A", lambda: kad.closest_peers(pb.to_bytes()), lambda ps: pb in ps)
                assert await kad.find_peer(pb)

                # providers, under the SDK's UTF-8 keys: A's found by us, ours by B
                await a.provide("issue-49/sdk-provides")
                got = await _until(
                    "our find_providers",
                    lambda: kad.find_providers(b"issue-49/sdk-provides"),
                    lambda ps: pa in [p.peer for p in ps],
                )
                assert next(p for p in got if p.peer == pa).addrs
                assert await kad.provide(b"issue-49/lattica-provides") >= 1
                await _until(
                    "B's providers",
                    lambda: b.providers("issue-49/lattica-provides", timeout=3),
                    lambda ps: str(node.peer_id) in ps,
                )

                # values both ways, as the SDK writes them
                value, expiration = os.urandom(300), time.time() + 600
                assert await kad.put_value(b"issue-49/from-lattica", encode_value(value, expiration)) >= 1
                got_b = await _until("B's get", lambda: b.get("issue-49/from-lattica"), lambda v: v is not None)
                assert got_b == SdkValue(value, expiration)
                await a.store("issue-49/from-sdk", b"\x00raw bytes", expiration)
                raw = await kad.get_value(b"issue-49/from-sdk")
                assert decode_value(raw) == (b"\x00raw bytes", expiration)

        node.run(run(), timeout=80)
