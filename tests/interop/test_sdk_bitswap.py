"""Blocks with the Lattica SDK over Bitswap 1.2.0 (its beetswap, issue 49), on 127.0.0.1: our node
fetches a block the SDK's ``put_block`` stored, by CID, and the SDK's ``get_block`` fetches each
block of what we ``put``: a small object (one raw block) and one large enough to be a UnixFS DAG
(a dag-pb root over raw leaves). Every block is checked against its CID on both sides."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import lattica
from lattica.bench import host_of
from lattica.bench._peers.sdk_node import SdkNode
from lattica.content._cid import Cid
from lattica.content._dagpb import decode as decode_node

pytestmark = pytest.mark.timeout(120)


async def _connected(node: lattica.Node, peer: lattica.PeerId, wait: float = 15.0) -> None:
    deadline = time.monotonic() + wait
    host = host_of(node)
    while not (peer in host.conns and host.info.get(host.conns[peer]) is not None):
        assert time.monotonic() < deadline, "the SDK node never identified with ours"
        await asyncio.sleep(0.05)


def test_blocks_both_ways_with_the_sdk(sdk_python):
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False, pubsub=False, crdt=False) as node:
        ours = str(node.addrs[0])
        small = os.urandom(100_000)
        large = os.urandom(3 * 1024 * 1024 + 12345)  # four 1 MiB leaves under a dag-pb root
        small_cid = lattica.content.put(small, node=node).result(30)
        large_cid = lattica.content.put(large, node=node).result(30)
        store = host_of(node).services.content.store  # type: ignore[union-attr]
        root = Cid.parse(large_cid)
        leaves = [link.cid for link in decode_node(store.get(root)).links]
        assert root.codec_name == "dag-pb" and len(leaves) == 4

        async def run() -> None:
            async with await SdkNode.start(sdk_python, [ours]) as sdk:
                peer = lattica.PeerId.from_string(sdk.peer_id)
                await _connected(node, peer)
                assert host_of(node).services.content.bitswap.speaks_only_bitswap(peer)  # type: ignore[union-attr]

                # the SDK's block, fetched by us over its Bitswap
                theirs = os.urandom(500_000)
                cid = await sdk.put_block(theirs)
                content = host_of(node).services.content
                assert content is not None
                reports: list[dict] = []
                got = await lattica.content.get(cid, progress=reports.append, node=node)
                assert got == theirs and content.bitswap.received_bytes == len(theirs)
                # the progress line names the provider's kind and implementation (its identify)
                assert reports[-1]["done"] and reports[-1]["kinds"].startswith("1 libp2p ("), reports[-1]

                # ours, fetched by the SDK block by block
                assert await sdk.get_block(small_cid, timeout=20) == small
                assert await sdk.get_block(large_cid, timeout=20) == store.get(root)
                assert b"".join([await sdk.get_block(str(c), timeout=20) for c in leaves]) == large
                assert content.served_blocks == 6  # (over Bitswap: the SDK has no actor calls)

        node.run(run(), timeout=100)


def test_leaves_from_an_sdk_node_that_lacks_the_root(sdk_python):
    """The SDK stores no dag-pb node: a fetch of our object gets its root from a Lattica node and
    its leaves, which only the SDK node holds, over Bitswap, with nobody naming the SDK node to
    it (it is asked want-have for the blocks no provider has, as a connected peer)."""
    data = os.urandom(3 * 1024 * 1024 + 999)
    with (
        lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False, pubsub=False, crdt=False) as holder,
        lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False, pubsub=False, crdt=False) as fetcher,
    ):
        root = Cid.parse(lattica.content.put(data, pin=False, node=holder).result(30))
        store = host_of(holder).services.content.store  # type: ignore[union-attr]
        leaves = [link.cid for link in decode_node(store.get(root)).links]
        for leaf in leaves:
            store.delete(leaf)

        async def run() -> None:
            async with await SdkNode.start(sdk_python) as sdk:
                for i, leaf in enumerate(leaves):
                    assert await sdk.put_block(data[i << 20 : (i + 1) << 20]) == str(leaf)
                await fetcher.aconnect(holder.addrs[0])
                await fetcher.aconnect(sdk.addr())
                content = host_of(fetcher).services.content
                assert content is not None
                got = await lattica.content.get(str(root), node=fetcher)
                assert got == data and content.bitswap.received_bytes == len(data)

        fetcher.run(run(), timeout=60)
