"""Hostile peers against the content plane (docs/content.md, docs/security.md), with real nodes:
garbage CID lists, announcements from peers a fetch never chose, swarm answers that name third
parties, and safetensors headers built to exhaust the parser."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import tempfile
import time

import numpy as np
import pytest

import lattica
from helpers import call_as
from lattica.actors.content import content_ref
from lattica.config import ContentConfig
from lattica.content import _weights as weights
from lattica.content._cid import Cid
from lattica.errors import BadBlock, ContentError

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"


def _node(**kw):
    kw.setdefault("blocks", "memory")
    if kw["blocks"] is None:
        kw["blocks"] = tempfile.mkdtemp(prefix="lattica-test-blocks-")
    return lattica.Node([TCP], content=ContentConfig(**kw))


@pytest.mark.parametrize("bad", [[2**40], [-1], [None], ["bafk"], [b"x" * 65]])
def test_cid_lists_that_are_not_byte_strings_are_refused_cheaply(bad):
    with _node() as a, _node() as b:
        b.connect(a.addrs[0])
        with pytest.raises(ContentError, match="not a CID"):
            call_as(b, content_ref(a.peer_id), "have", bad)


def test_announcements_from_a_peer_the_fetch_did_not_choose_are_ignored():
    """A stranger tells a fetcher it holds every block (to be preferred, then never answer):
    the fetch does not take it in, and finishes from its real provider."""
    import os

    with _node() as pub, _node() as me, _node() as liar:
        me.connect(pub.addrs[0])
        liar.connect(me.addrs[0])
        data = os.urandom(4 << 20)
        cid = lattica.content.put(data, node=pub).result(10)
        svc = me._host.services.content
        seen = []

        def progress(info):
            if not seen:
                seen.append(1)
                fetch = next(iter(svc._fetches.values()))
                blocks = [c.bytes for c in pub._host.services.content.store]
                me._host.loop.call_soon(
                    svc.heard_haves, liar.peer_id, Cid.parse(cid), [Cid.from_bytes(b) for b in blocks], []
                )
                seen.append(fetch)

        assert lattica.content.get(cid, node=me, progress=progress).result(30) == data
        assert liar.peer_id not in svc.last_stats


def _hdr(h, data=b""):
    b = json.dumps(h).encode()
    return struct.pack("<Q", len(b)) + b + data


@pytest.mark.parametrize(
    "blob",
    [
        _hdr(
            {"x": {"dtype": "F32", "shape": [10**4000], "data_offsets": [0, 4]}}, bytes(4)
        ),  # a quadratic-time product
        _hdr({"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, bytes(4)),
        _hdr({"x": {"dtype": "F32", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}}),
        _hdr({"x": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, bytes(4)),
        _hdr({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4)),  # runs past the file
        _hdr(
            {
                "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "y": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]},
            },
            bytes(8),
        ),
        b"",
        b"\x00" * 7,
        struct.pack("<Q", 10**12),
    ],
)
def test_hostile_safetensors_headers_are_bad_blocks(blob):
    with pytest.raises(BadBlock):
        weights.decode(blob)


def test_honest_weights_still_decode():
    got = weights.decode(weights.encode({"a": np.arange(6, dtype=np.int32).reshape(2, 3)}))
    assert got["a"].tolist() == [[0, 1, 2], [3, 4, 5]]


def _repeating_dag(fanout_top: int) -> tuple[Cid, dict]:
    """Four blocks naming 174 * 174 * fanout_top one-byte leaves: one subtree repeated over and
    over, a file of millions of places made from almost nothing."""
    from lattica.content import _dagpb as dagpb
    from lattica.content._cid import DAG_PB, RAW
    from lattica.content._unixfs import FILE, UnixFSData

    def node(links):
        sizes = [s for _, _, s, _ in links]
        data = UnixFSData(type=FILE, filesize=sum(sizes), blocksizes=tuple(sizes)).encode()
        block = dagpb.encode([(c, None, t) for c, _, _, t in links], data)
        return Cid.of(block, DAG_PB), block, sum(sizes), len(block) + sum(t for *_, t in links)

    x = (Cid.of(b"q", RAW), b"q", 1, 1)
    inner = node([x] * 174)
    mid = node([inner] * 174)
    root = node([mid] * fanout_top)
    return root[0], {c: b for c, b, _, _ in (x, inner, mid, root)}


def test_a_dag_repeating_one_subtree_is_refused_past_the_place_limit(monkeypatch):
    """A provider serves four blocks that declare 1.2 million places: the fetcher reads them a
    step at a time and fails with BadBlock once past MAX_PLACES (lowered here so the test takes
    a second), rather than walking them all on its loop."""
    from lattica.content import _unixfs as unixfs

    monkeypatch.setattr(unixfs, "MAX_PLACES", 100_000)
    root, blocks = _repeating_dag(40)
    with _node() as pub, _node() as me:
        me.connect(pub.addrs[0])
        store = pub._host.services.content.store
        for cid, block in blocks.items():
            store.put(cid, block)
        with pytest.raises(BadBlock, match="places"):
            lattica.content.get(root, node=me, path=os.devnull).result(30)
        deadline = (
            time.monotonic() + 5
        )  # (the failed fetch ends its tasks, then leaves the table: a moment after the error)
        while me._host.services.content._fetches and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not me._host.services.content._fetches


def test_get_in_memory_refuses_an_object_over_the_limit_before_fetching_it():
    with _node() as pub, _node(max_get_bytes=1 << 20) as me:
        me.connect(pub.addrs[0])
        data = os.urandom(3 << 20)
        cid = lattica.content.put(data, node=pub, chunk_size=256 << 10).result(10)
        with pytest.raises(ContentError, match="max_get_bytes"):
            lattica.content.get(cid, node=me).result(30)
        svc = me._host.services.content
        deadline = time.monotonic() + 5
        while svc._fetches and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not svc._fetches, "the fetch nobody waits for any more stopped"
        assert svc.store.stats().bytes < 3 << 20, "the object was not fetched anyway"
        out = os.path.join(tempfile.mkdtemp(), "obj")
        assert lattica.content.get(cid, node=me, path=out).result(30) == out
        assert open(out, "rb").read() == data


def test_a_peer_that_does_not_read_its_answers_is_served_no_further():
    """A stranger asks for the same 8 MiB 64 times over and stops reading its socket: the
    provider reads no more answers once two of them wait unsent (not 512 MiB of copies), and
    serves everyone else meanwhile."""
    with _node(blocks=None) as pub, _node() as greedy, _node() as honest:
        greedy.connect(pub.addrs[0])
        honest.connect(pub.addrs[0])
        data = os.urandom(8 << 20)
        cid = lattica.content.put(data, node=pub).result(10)
        svc = pub._host.services.content
        leaves = [c.bytes for c in svc.store if c.codec == 0x55]
        assert len(leaves) == 8

        async def flood():
            conn = greedy._host.conns[pub.peer_id]
            conn._writer.pause_reading()  # the kernel's buffers fill, then the provider's
            rt = greedy._host.runtime
            calls = [
                asyncio.ensure_future(rt.call(content_ref(pub.peer_id), "blocks", (leaves,), {}, timeout=30))
                for _ in range(64)
            ]
            await asyncio.sleep(4)
            for c in calls:
                c.cancel()
            await asyncio.gather(*calls, return_exceptions=True)

        greedy.run(flood(), timeout=30)
        limit = 2 * svc.cfg.max_request_bytes + svc.cfg.serve_per_peer * svc.cfg.max_request_bytes
        assert svc.served_bytes <= limit + (16 << 20), (
            f"served {svc.served_bytes >> 20} MiB to a peer that reads nothing"
        )
        assert lattica.content.get(cid, node=honest).result(30) == data


def test_made_up_roots_cannot_push_a_real_swarm_out():
    """A stranger names 2,000 random roots in swarm calls: none is tracked (we hold none of
    them), and the swarm of a root we hold keeps its members."""
    with _node() as pub, _node() as fetcher, _node() as stranger:
        fetcher.connect(pub.addrs[0])
        stranger.connect(pub.addrs[0])
        cid = lattica.content.put(os.urandom(1 << 16), node=pub).result(10)
        ref = content_ref(pub.peer_id)
        assert call_as(fetcher, ref, "swarm", Cid.parse(cid).bytes) == []
        svc = pub._host.services.content

        async def flood():
            rt = stranger._host.runtime
            for _ in range(20):
                await asyncio.gather(
                    *(rt.call(ref, "swarm", (Cid.of(os.urandom(8), 0x55).bytes,), {}, timeout=10) for _ in range(100))
                )

        stranger.run(flood(), timeout=60)
        assert list(svc._swarms) == [Cid.parse(cid)]
        assert svc.swarm_of(Cid.parse(cid)) == [fetcher.peer_id]
        assert call_as(stranger, ref, "swarm", Cid.parse(cid).bytes)[0][0] == fetcher.peer_id.to_bytes()


def test_a_peer_naming_cids_without_end_is_refused_and_others_are_served():
    """want-have is cheap but not free (a lookup per CID): a peer naming more than NAMED_RATE CIDs
    a second (after a burst) is refused with a clear error, and another peer is served at once."""
    from lattica.actors.content.wire import MAX_NAMED, NAMED_BURST

    with _node() as a, _node() as flood, _node() as honest:
        cid = lattica.content.put(b"x" * 1000, node=a).result(10)
        for n in (flood, honest):
            n.connect(a.addrs[0])
        names = [Cid.of(os.urandom(8)).bytes for _ in range(MAX_NAMED)]

        async def hammer():
            rt = flood.host.runtime
            refused = 0
            for _ in range(int(2 * NAMED_BURST / MAX_NAMED)):
                try:
                    await rt.call(content_ref(a.peer_id), "have", (names,), {}, timeout=10)
                except ContentError as e:
                    assert "too many CIDs named" in str(e)
                    refused += 1
            return refused

        assert flood.run(hammer(), timeout=60) >= NAMED_BURST / MAX_NAMED / 2
        assert call_as(honest, content_ref(a.peer_id), "have", [Cid.parse(cid).bytes]) == [True]


def test_strangers_that_call_swarm_first_are_never_asked_for_what_they_did_not_announce(monkeypatch):
    """Throwaway identities poll a fetcher's ``swarm(root)`` so they join its fetch before the
    real provider answers; they never send a block. A peer that joins this way is asked only for
    blocks it announced, so the fetch goes to the provider at once (it used to wait out one
    block timeout per identity, ~18 s each, or fail)."""
    from lattica.actors.content import service as service_mod

    silent: set = set()
    real_blocks = service_mod.ContentActor.blocks

    async def blocks(self, cids):
        if self._svc.rt.peer_id in silent:
            await asyncio.sleep(3600)
        return await real_blocks(self, cids)

    monkeypatch.setattr(service_mod.ContentActor, "blocks", blocks)
    with _node() as pub, _node() as me, _node() as s1, _node() as s2, _node() as s3:
        me.connect(pub.addrs[0])
        sybils = [s1, s2, s3]
        for s in sybils:
            silent.add(s.peer_id)
            s.connect(me.addrs[0])
        cid = lattica.content.put(os.urandom(4 << 20), node=pub).result(20)
        root = Cid.parse(cid)

        async def poll(node):
            while True:
                try:
                    await node.host.runtime.call(content_ref(me.peer_id), "swarm", (root.bytes,), {}, timeout=5)
                except ContentError:
                    pass
                await asyncio.sleep(0.005)

        polls = [asyncio.run_coroutine_threadsafe(poll(s), s.host.loop) for s in sybils]
        try:
            time.sleep(0.2)
            assert lattica.content.get(cid, node=me).result(15) is not None
        finally:
            for f in polls:
                f.cancel()
        stats = me.host.services.content.last_stats
        assert any(s.peer_id in stats for s in sybils)  # (they did join the fetch)
        assert all(stats[s.peer_id].asked == 0 for s in sybils if s.peer_id in stats)
