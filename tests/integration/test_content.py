"""The content plane between real nodes on loopback (docs/content.md): put and get by CID (bytes,
files, arrays, weights), providers found through the DHT, a swarm that feeds itself, fetches
that survive bad, silent and dying providers, resumed fetches, bounded answers, and the CLI."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import lattica
from helpers import call_as, wait_for
from lattica._runtime import spawner_ref
from lattica.actors.content import content_ref
from lattica.config import ContentConfig
from lattica.content._cid import Cid
from lattica.errors import BlockNotFound, ContentError, PermissionDenied
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"
MiB = 1 << 20


def _node(tmp_path, name, **kw):
    return lattica.Node([TCP], content=ContentConfig(blocks=str(tmp_path / name), **kw.pop("content", {})), **kw)


def _served(node):
    return node._host.services.content.served_bytes


def test_put_and_get_bytes_files_and_arrays(tmp_path):
    with _node(tmp_path, "a") as a, _node(tmp_path, "b") as b:
        b.connect(a.addrs[0])
        data = os.urandom(3 * MiB + 12345)
        cid = lattica.content.put(data, node=a).result(30)
        assert cid.startswith("bafybei") and Cid.parse(cid).codec_name == "dag-pb"
        assert lattica.content.get(cid, node=b).result(30) == data
        out = tmp_path / "out.bin"
        assert lattica.content.get(cid, path=out, node=b).result(30) == str(out)
        assert out.read_bytes() == data
        assert not [p for p in os.listdir(tmp_path) if p.startswith(".lattica-get-")]  # no temp file left
        small = lattica.content.put(b"hello world", node=a).result(10)
        assert small == "bafkreifzjut3te2nhyekklss27nh3k72ysco7y32koao5eei66wof36n5e"  # the CID IPFS gives
        arr = np.arange(100_000, dtype=np.float32).reshape(100, 1000)
        acid = lattica.content.put(arr, node=a).result(10)
        assert (
            np.frombuffer(lattica.content.get(acid, node=b).result(10), np.float32).reshape(100, 1000).tolist()
            == arr.tolist()
        )
        st = lattica.content.stat(cid, node=b).result(10)
        assert st["complete"] and st["size"] == len(data) and not st["pinned"]
        assert lattica.content.stat(cid, node=a).result(10)["pinned"]  # what a node publishes is pinned


def test_weights_round_trip_memory_mapped_on_disk(tmp_path):
    weights = {
        "layer.0.w": np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32),
        "layer.0.b": np.zeros(32, np.float16),
        "steps": np.array([7], np.int64),
    }
    with _node(tmp_path, "a") as a, _node(tmp_path, "b") as b:
        b.connect(a.addrs[0])
        cid = lattica.content.put_weights(weights, metadata={"model": "tiny"}, node=a).result(30)
        got = lattica.content.get_weights(cid, node=b).result(30)
        assert set(got) == set(weights)
        for k, v in weights.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v)
        assert isinstance(got["layer.0.w"].base, np.memmap) or isinstance(
            got["layer.0.w"], np.memmap
        )  # mapped from a file
        assert not got["layer.0.w"].flags.writeable


def test_a_provider_is_found_through_the_dht(tmp_path):
    """The fetcher knows nobody who holds the object: the provider record leads to the provider."""
    with _node(tmp_path, "boot") as boot, _node(tmp_path, "pub") as pub, _node(tmp_path, "far") as far:
        pub.connect(boot.addrs[0])
        far.connect(boot.addrs[0])
        for n in (boot, pub, far):
            lattica.dht.bootstrap(node=n).result(10)
        data = os.urandom(2 * MiB)
        cid = lattica.content.put(data, node=pub).result(30)
        assert wait_for(lambda: pub.peer_id in lattica.content.providers(cid, node=far).result(10), timeout=10)
        assert lattica.content.get(cid, node=far).result(30) == data


def test_a_swarm_feeds_itself(tmp_path):
    """Fetchers starting together trade blocks: the publisher uploads far less than one copy per
    fetcher, and every fetcher ends up a provider."""
    size, n = 24 * MiB, 4
    with _node(tmp_path, "pub") as pub:
        # a window of 4 MiB (64 MiB by default): with one as large as the object, each fetcher
        # would ask the publisher for every block before it had heard of the others
        fetchers = [_node(tmp_path, f"f{i}", content={"window": 4 * MiB}).start() for i in range(n)]
        try:
            for f in fetchers:
                f.connect(pub.addrs[0])
            data = os.urandom(size)
            cid = lattica.content.put(data, node=pub).result(30)
            futures = [lattica.content.get(cid, node=f) for f in fetchers]
            assert all(fut.result(90) == data for fut in futures)
            uploaded = _served(pub) / size
            fed = sum(_served(f) for f in fetchers) / size
            # a server-only CDN would upload n copies (these nodes share one process and its GIL;
            # `lattica bench content` measures the swarm with a process per node)
            assert uploaded < n, (uploaded, fed)
            assert fed > 0, (uploaded, fed)
            print(f"\ncontent swarm: publisher uploaded {uploaded:.2f}x, fetchers to each other {fed:.2f}x")
        finally:
            for f in fetchers:
                f.stop()


def test_bad_silent_and_dying_providers_are_routed_around(tmp_path):
    """Four providers of one object: one sends wrong bytes (dropped at its first bad block), one
    never answers (timed out), one is stopped mid-transfer; the honest one finishes it."""
    data = os.urandom(12 * MiB)
    with (
        _node(tmp_path, "liar") as liar,
        _node(tmp_path, "mute") as mute,
        _node(tmp_path, "honest") as honest,
        _node(tmp_path, "me", content={"block_timeout": 1.0}) as me,
    ):
        dying = _node(tmp_path, "dying").start()
        try:
            for p in (liar, mute, honest, dying):
                cid = lattica.content.put(data, node=p).result(30)
                me.connect(p.addrs[0])
            _lie(liar)
            _mute(mute)
            midway = threading.Event()
            fut = lattica.content.get(cid, node=me, progress=lambda info: info["bytes"] > 2 * MiB and midway.set())
            assert midway.wait(30)
            dying.stop()  # mid-transfer
            got = fut.result(90)
            assert got == data
        finally:
            dying.stop()
        stats = {str(p): s for p, s in _last_session(me).items()}
        liar_stats = stats[str(liar.peer_id)]
        assert liar_stats.blocks == 0, "no wrong block was ever used"
        # asked for any block, it was dropped at its first answer (it may also never have been
        # asked: the scheduler spreads wants by expected delivery, and the others can finish first)
        assert liar_stats.dropped or liar_stats.asked == 0, liar_stats


def test_a_request_for_blocks_that_came_from_elsewhere_is_cancelled_where_it_waits(tmp_path):
    """Bitswap's CANCEL: blocks asked of a provider that sits on them (here: never answers) and
    then delivered by another are cancelled at the first provider as they arrive, not left to
    run there until the request's own deadline."""
    data = os.urandom(4 * MiB)
    with (
        _node(tmp_path, "mute") as mute,
        _node(tmp_path, "honest") as honest,
        _node(tmp_path, "me", content={"block_timeout": 3.0}, dht=False) as me,
    ):
        for p in (mute, honest):
            cid = lattica.content.put(data, node=p).result(30)
        waiting = {"started": 0, "cancelled": 0}

        async def never(*args):
            waiting["started"] += 1
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                waiting["cancelled"] += 1
                raise

        mute._host.services.content.on_disk = never
        me.connect(mute.addrs[0])  # the only provider at first: it is asked for the root
        fut = lattica.content.get(cid, node=me)
        assert wait_for(lambda: waiting["started"] >= 1, timeout=10)
        me.connect(honest.addrs[0])
        assert fut.result(60) == data
        # a request to the mute provider times out after 3 s and its blocks are asked of the honest
        # one; it could run on at the mute one until its hard deadline (3 s later): it is
        # cancelled when its blocks arrive
        assert wait_for(lambda: waiting["cancelled"] == waiting["started"], timeout=1.5), waiting


def _last_session(node):
    return node._host.services.content.last_stats


def _lie(node):
    """The node's content actor answers every block with garbage of the right size."""
    svc = node._host.services.content
    real = svc.store.get
    svc.store.get = lambda cid, **kw: bytes(len(real(cid)))


def _mute(node):
    """The node's content actor never answers block requests."""
    svc = node._host.services.content

    async def never(*args):
        await asyncio.sleep(3600)

    svc.on_disk = never


def test_an_interrupted_get_resumes_from_the_blocks_it_holds(tmp_path):
    """The only provider stops serving after 6 blocks: the get fails (BlockNotFound, no hang);
    a later get from another provider fetches only what is missing."""
    data = os.urandom(16 * MiB)
    with _node(tmp_path, "me", content={"find_timeout": 2.0}) as me:
        with _node(tmp_path, "first") as first:
            cid = lattica.content.put(data, node=first).result(30)
            me.connect(first.addrs[0])
            _serve_only(first, 6)
            with pytest.raises(BlockNotFound):
                lattica.content.get(cid, node=me).result(60)
        held = lattica.content.stat(cid, node=me).result(10)["blocks_held"]
        assert held >= 6
        with _node(tmp_path, "second") as second:
            lattica.content.put(data, node=second).result(30)
            me.connect(second.addrs[0])
            assert lattica.content.get(cid, node=me).result(60) == data
            assert _served(second) <= len(data) - (held - 1) * MiB  # only what was missing


def _serve_only(node, n):
    """The node's blockstore serves ``n`` more leaves, then says it has none."""
    from lattica.errors import BlockNotFound as Missing

    store = node._host.services.content.store
    real, left = store.get, [n]

    def get(cid, **kw):
        if cid.codec_name == "raw":
            if left[0] <= 0:
                raise Missing(str(cid))
            left[0] -= 1
        return real(cid, **kw)

    store.get = get


def test_no_provider_is_a_clear_error_not_a_hang(tmp_path):
    with _node(tmp_path, "me", content={"find_timeout": 2.0}) as me, _node(tmp_path, "other") as other:
        me.connect(other.addrs[0])
        t0 = time.monotonic()
        with pytest.raises(BlockNotFound):
            lattica.content.get(Cid.of(b"nobody has this").__str__(), node=me).result(30)
        assert time.monotonic() - t0 < 15


def test_answers_are_bounded_and_strangers_are_served(tmp_path):
    """Content is open to strangers (the open network's CDN) but a peer can make us hold only a
    bounded answer: at most max_request_blocks CIDs and max_request_bytes per answer."""
    with (
        lattica.Node(
            [TCP], mesh=MeshKey.generate(), content=ContentConfig(blocks=str(tmp_path / "a"), max_request_bytes=3 * MiB)
        ) as a,
        lattica.Node([TCP], mesh=MeshKey.generate(), content=ContentConfig(blocks="memory")) as stranger,
    ):
        stranger.connect(a.addrs[0])
        data = os.urandom(8 * MiB)
        cid = lattica.content.put(data, node=a).result(30)
        st = a._host.services.content.store
        leaves = [c for c in st if c.codec_name == "raw"]
        ref = content_ref(a.peer_id)
        got = call_as(stranger, ref, "blocks", [c.bytes for c in leaves])
        assert 1 <= len(got) <= 3 and all(len(b) == MiB for b in got)  # cut short at 3 MiB: ask again for the rest
        with pytest.raises(ContentError, match="at most"):
            call_as(stranger, ref, "blocks", [leaves[0].bytes] * 65)
        with pytest.raises(ContentError, match="at most"):
            call_as(stranger, ref, "have", [leaves[0].bytes] * 1025)
        with pytest.raises(ContentError, match="not a CID"):
            call_as(stranger, ref, "have", [b"garbage"])
        assert call_as(stranger, ref, "have", [leaves[0].bytes, Cid.of(b"x").bytes]) == [True, False]
        assert lattica.content.get(cid, node=stranger).result(30) == data
        with pytest.raises(PermissionDenied):  # what is not content stays members-only
            call_as(stranger, spawner_ref(a.peer_id), "names")


def test_a_fresh_process_gets_a_cid_and_exits(tmp_path):
    """Cold start: a script starts a node, gets a CID through its bootstrap peer, prints its hash
    and ends."""
    with _node(tmp_path, "pub") as pub:
        data = os.urandom(5 * MiB)
        cid = lattica.content.put(data, node=pub).result(30)
        script = f"""
import hashlib, lattica
lattica.init([], bootstrap=[{str(pub.addrs[0])!r}])
print(hashlib.sha256(lattica.content.get({cid!r}).result(60)).hexdigest())
"""
        env = {**os.environ, "LATTICA_BLOCKS": str(tmp_path / "fresh")}
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == hashlib.sha256(data).hexdigest()
        print(f"\ncontent cold start: fresh process got 5 MiB and exited in {time.monotonic() - t0:.2f} s")


def test_cli_put_get_and_stat(tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3 * MiB))
    env = {**os.environ, "LATTICA_BLOCKS": str(tmp_path / "cli-pub")}
    put = subprocess.Popen(
        [sys.executable, "-m", "lattica.cli", "put", str(src), "--listen", "/ip4/127.0.0.1/tcp/0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        cid = put.stdout.readline().strip()
        hashed = ""
        while "serving" not in (serving := put.stderr.readline()):  # first the progress bar, while the file is hashed
            hashed += serving
        assert "100.0%" in hashed and "MB/s" in hashed, hashed
        addr = serving.split(" from ")[1].split(" (")[0].split(", ")[0]
        out = tmp_path / "copy.bin"
        got = subprocess.run(
            [
                sys.executable,
                "-m",
                "lattica.cli",
                "get",
                cid,
                "-o",
                str(out),
                "--bootstrap",
                addr,
                "--blocks",
                str(tmp_path / "cli-get"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert got.returncode == 0, got.stderr[-2000:]
        assert out.read_bytes() == src.read_bytes()
        assert "MB/s" in got.stderr and "peers" in got.stderr  # the progress bar
        stat = subprocess.run(
            [sys.executable, "-m", "lattica.cli", "content", "stat", cid, "--blocks", str(tmp_path / "cli-get")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert json.loads(stat.stdout)["complete"] is True
        pin = subprocess.run(
            [
                sys.executable,
                "-m",
                "lattica.cli",
                "content",
                "pin",
                cid,
                "--bootstrap",
                addr,
                "--blocks",
                str(tmp_path / "cli-pin"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pin.returncode == 0 and json.loads(pin.stdout) == {"pinned": cid}, pin.stderr[-2000:]
        assert "MB/s" in pin.stderr and "100.0%" in pin.stderr  # the progress bar while it fetches
    finally:
        put.terminate()
        put.wait(10)


def test_an_object_with_repeated_chunks_is_fetched_once_per_distinct_block(tmp_path):
    """The same chunk at many places is one block: fetched once, read from the blockstore for
    every later place."""
    with _node(tmp_path, "a") as a, _node(tmp_path, "b") as b:
        b.connect(a.addrs[0])
        data = os.urandom(4096) * 3000 + os.urandom(100)
        cid = lattica.content.put(data, chunk_size=4096, node=a).result(30)
        assert lattica.content.get(cid, node=b).result(30) == data
        assert len(b._host.services.content.store) < 10 and _served(a) < 64 * 1024


def test_a_lone_provider_that_never_sends_is_a_clear_error_soon(tmp_path):
    """The only provider says it has the object and then sends nothing: the get fails once no
    block came for find_timeout + block_timeout (not after every retry of every block)."""
    cfg = {"find_timeout": 3.0, "block_timeout": 2.0}
    with _node(tmp_path, "me", content=cfg) as me, _node(tmp_path, "silent") as silent:
        cid = lattica.content.put(os.urandom(4 * MiB), node=silent).result(30)
        me.connect(silent.addrs[0])
        _mute(silent)
        t0 = time.monotonic()
        with pytest.raises(BlockNotFound, match="no block"):
            lattica.content.get(cid, node=me).result(60)
        took = time.monotonic() - t0
        assert 4.0 < took < 12.0, f"failed after {took:.1f} s"


def test_answers_are_not_held_back_by_a_path_the_peer_left(tmp_path):
    """A provider holds answers to a peer while earlier ones wait unsent (it is slow or not
    reading). Only the peer's current connection counts: after a relayed path is replaced by a
    punched one, the old circuit can be dead before anyone knows, its unsent answers stuck there;
    they must not stall the fetch on the new path (they did, until that circuit timed out)."""
    data = os.urandom(4 * MiB)
    with _node(tmp_path, "prov") as prov, _node(tmp_path, "me", dht=False) as me:
        cid = lattica.content.put(data, node=prov).result(30)
        me.connect(prov.addrs[0])
        rt = prov._host.runtime
        # (connect returns as our handshake ends; prov adopts the connection a moment later)
        assert wait_for(lambda: me.peer_id in prov._host.conns)
        primary = prov._host.conns[me.peer_id]

        class _Stuck:  # a serving channel left on the old path, its answers never taken
            def __init__(self, conn):
                self.conn = conn
                self.writer = type("W", (), {"backlog": staticmethod(lambda: 1 << 30)})()

        old = _Stuck(object())
        rt._serving.setdefault(me.peer_id, set()).add(old)
        try:
            assert rt.unsent_to(me.peer_id) == 0  # not the current path: does not count
            assert lattica.content.get(cid, node=me).result(30) == data
            rt._serving[me.peer_id].add(_Stuck(primary))
            assert rt.unsent_to(me.peer_id) >= 1 << 30  # (the current path's backlog does count)
        finally:
            rt._serving.get(me.peer_id, set()).difference_update(
                {c for c in rt._serving.get(me.peer_id, ()) if isinstance(c, _Stuck)}
            )


def test_a_block_just_sent_to_one_fetcher_is_passed_on_to_its_fellow_once(tmp_path):
    """Super-seeding: a provider asked for a block it sent a fellow fetcher of the same root
    under a second ago names that fellow instead ([its peer id]), once per fetcher and block,
    and only for fetchers in a swarm together; asked again, it sends the block."""
    with (
        _node(tmp_path, "pub") as pub,
        _node(tmp_path, "f1") as f1,
        _node(tmp_path, "f2") as f2,
        _node(tmp_path, "loner") as loner,
    ):
        for f in (f1, f2, loner):
            f.connect(pub.addrs[0])
        cid = lattica.content.put(os.urandom(3 * MiB), node=pub).result(30)
        leaves = [c.bytes for c in pub._host.services.content.store if c.codec_name == "raw"]
        ref = content_ref(pub.peer_id)
        for f in (f1, f2):  # both fetch the root (the loner never says so)
            call_as(f, ref, "swarm", Cid.parse(cid).bytes)
        first = call_as(f1, ref, "blocks", leaves[:2])
        assert [len(b) for b in first] == [MiB, MiB]
        got = call_as(f2, ref, "blocks", leaves)
        assert got[:2] == [[f1.peer_id.to_bytes()]] * 2 and len(got[2]) == MiB  # (the third was never sent)
        again = call_as(f2, ref, "blocks", leaves[:2])
        assert [len(b) for b in again] == [MiB, MiB]  # once per fetcher and block
        assert [len(b) for b in call_as(loner, ref, "blocks", leaves[:1])] == [MiB]  # not in a swarm with them
        assert pub._host.services.content.passed_blocks == 2
