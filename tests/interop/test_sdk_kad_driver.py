"""The SDK driver (``sdk_peer.py kad`` through lattica.bench._peers.sdk_node) against the SDK
itself (issue 49): two SDK nodes on 127.0.0.1, B bootstrapping from A, store/get, provide/
providers and Bitswap across them. This checks the driver before the driver checks our Kademlia
and Bitswap."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from lattica.bench._peers.sdk_node import SdkError, SdkNode, SdkValue

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


def _cid(data: bytes) -> str:
    """The CIDv1 of ``data`` as a raw block (codec 0x55, sha2-256), base32 as the SDK writes it."""
    binary = bytes([0x01, 0x55, 0x12, 0x20]) + hashlib.sha256(data).digest()
    return "b" + base64.b32encode(binary).decode().lower().rstrip("=")


async def _until(what: str, probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], wait: float = 10) -> T:
    """Call ``probe`` until ``done`` holds of its result; fail after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        got = await probe()
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {got!r} after {wait} s")
        await asyncio.sleep(0.05)


async def _scenario(sdk_python) -> None:
    async with await SdkNode.start(sdk_python) as a:
        async with await SdkNode.start(sdk_python, [a.addr("tcp")]) as b:
            assert a.peer_id != b.peer_id
            await _until("B identified A", b.peers, lambda peers: a.peer_id in peers)
            await _until("A identified B", a.peers, lambda peers: b.peer_id in peers)

            # A value of raw bytes (not a pickle), 300 of them (a two-byte length in bincode)
            value, expiration = os.urandom(300), time.time() + 600
            await a.store("issue-49/value", value, expiration)
            got = await _until("B's get", lambda: b.get("issue-49/value"), lambda v: v is not None)
            assert got == SdkValue(value, expiration)
            # and under a subkey: the key then reads as its subkeys
            await a.store("issue-49/subkeys", b"one", expiration, subkey="s1")
            got = await _until("B's get of subkeys", lambda: b.get("issue-49/subkeys"), lambda v: v is not None)
            assert got == {"s1": SdkValue(b"one", expiration)}
            assert await b.get("issue-49/nothing") is None

            # A provides a key, B's lookup names A
            await a.provide("issue-49/provided")
            await _until(
                "B's providers", lambda: b.providers("issue-49/provided", timeout=2), lambda ps: a.peer_id in ps
            )

            # A block on A, fetched by B over Bitswap by its CID (v1, raw, sha2-256)
            data = os.urandom(1000)
            cid = await a.put_block(data)
            assert cid == _cid(data)
            assert await b.get_block(cid, timeout=10) == data
            # a block nobody has: an error once the (whole-second) timeout has passed, no hang
            t0 = time.monotonic()
            with pytest.raises(SdkError, match="not found"):
                await b.get_block(_cid(b"nobody has this"), timeout=1)
            assert time.monotonic() - t0 < 5


def test_sdk_kad_driver_two_nodes(sdk_python):
    asyncio.run(asyncio.wait_for(_scenario(sdk_python), 30))
