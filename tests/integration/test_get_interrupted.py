"""A get interrupted (Ctrl-C, a node stopping mid-fetch) ends quietly: no task of the fetch is
left to fail after the node's worker threads closed, and ``lattica get`` exits 130 with no
traceback whenever the interrupt comes; a get resumed after one reports from what it holds
(issue 45)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import time

import pytest

import lattica
from helpers import run_on_pty, wait_for
from lattica.config import ContentConfig
from lattica.content._cid import Cid
from lattica.errors import BlockNotFound, ContentError, LatticaError

pytestmark = pytest.mark.timeout(180)

TCP = "/ip4/127.0.0.1/tcp/0"
MiB = 1 << 20


def _node(tmp_path, name: str, **content) -> lattica.Node:
    return lattica.Node([TCP], content=ContentConfig(blocks=str(tmp_path / name), **content))


def _content(node: lattica.Node):
    return node._host.services.content


def _slow(node: lattica.Node, seconds: float) -> None:
    """Every block answer of the node waits ``seconds`` first: a transfer that lasts."""
    svc = _content(node)
    real = svc.on_disk

    async def slow(*args):
        await asyncio.sleep(seconds)
        return await real(*args)

    svc.on_disk = slow


def _loop_errors(node: lattica.Node) -> list[str]:
    """What the node's loop reports to its exception handler from now on (e.g. "Task exception
    was never retrieved")."""
    seen: list[str] = []
    node._loop.set_exception_handler(lambda _loop, ctx: seen.append(f"{ctx.get('message')}: {ctx.get('exception')!r}"))
    return seen


def test_a_node_stopped_mid_fetch_ends_the_fetch_and_its_tasks_before_its_worker_threads(tmp_path):
    with _node(tmp_path, "prov") as prov:
        cid = lattica.content.put(os.urandom(24 * MiB), node=prov).result(30)
        _slow(prov, 0.05)
        me = _node(tmp_path, "me").start()
        errors = _loop_errors(me)
        me.connect(prov.addrs[0])
        lattica.content.get(cid, node=me)
        svc = _content(me)
        assert wait_for(lambda: _content(prov).served_bytes >= 2 * MiB, timeout=30)
        fetches = list(svc._fetches.values())
        pool = svc.pool
        real_shutdown, left = pool.shutdown, []

        def shutdown(*args, **kw):
            left.extend(
                t for f in fetches for t in [getattr(f, "task", None), *f._tasks] if t is not None and not t.done()
            )
            return real_shutdown(*args, **kw)

        pool.shutdown = shutdown
        me.stop()
        gc.collect()
        assert fetches and not left, f"{len(left)} tasks of the fetch still ran when its worker threads closed"
        assert not errors, errors


def test_an_error_in_a_fetch_task_fails_the_fetch_at_once(tmp_path):
    """A fetch task's unexpected error is the fetch's error, not a warning at garbage collection
    while the fetch waits for blocks that never come."""
    with _node(tmp_path, "prov") as prov, _node(tmp_path, "me") as me:
        cid = lattica.content.put(os.urandom(4 * MiB), node=prov).result(30)
        errors = _loop_errors(me)
        me.connect(prov.addrs[0])

        async def broken(*args):
            raise RuntimeError("the disk is on fire")

        _content(me).on_disk = broken
        with pytest.raises(ContentError, match="the disk is on fire"):
            lattica.content.get(cid, node=me).result(15)
        gc.collect()
        assert not errors, errors


def _interrupted_get(cid: str, prov: lattica.Node, tmp_path, when) -> subprocess.CompletedProcess:
    """Run ``lattica get cid`` through ``prov``; SIGINT once ``when()`` holds (after the get
    connected); its exit status and output."""
    blocks = tmp_path / f"get-{time.monotonic_ns()}"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lattica.cli",
            "get",
            cid,
            "-o",
            str(tmp_path / "out.bin"),
            "--bootstrap",
            str(prov.addrs[0]),
            "--blocks",
            str(blocks),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: bool(prov._host.conns) and when(), timeout=30), "the get never reached the moment"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    wait_for(lambda: not prov._host.conns, timeout=10)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_ctrl_c_in_lattica_get_exits_130_without_a_traceback(tmp_path):
    """SIGINT as the get starts (connected), while it looks for the providers of an unknown CID,
    and mid-transfer (several times): exit status 130, nothing on stderr but the progress line."""
    with _node(tmp_path, "prov") as prov:
        cid = lattica.content.put(os.urandom(64 * MiB), node=prov).result(60)
        _slow(prov, 0.03)
        unknown = str(Cid.of(b"nobody holds this"))
        served = lambda: _content(prov).served_bytes  # noqa: E731
        moments = [("start", cid, 0), ("discovery", unknown, 0)] + [
            (f"transfer {i}", cid, (2 + 3 * i) * MiB) for i in range(4)
        ]
        for name, which, into in moments:
            at = served() + into
            got = _interrupted_get(which, prov, tmp_path, lambda: served() >= at)
            lines = [line for line in got.stderr.splitlines() if line.strip()]
            assert got.returncode in (130, -signal.SIGINT), (
                f"{name}: exit status {got.returncode}: {got.stderr[-3000:]}"
            )
            assert len(lines) <= 1 and "Traceback" not in got.stderr and "Task" not in got.stderr, (
                f"{name}: {got.stderr[-3000:]}"
            )


def _half_held(tmp_path, data: bytes) -> tuple[str, int]:
    """A blockstore ``tmp_path/me`` that holds part of ``data``'s object (a get cut short: its
    only provider stopped serving); the CID and the bytes of its leaves held."""
    with _node(tmp_path, "me", find_timeout=2.0) as me, _node(tmp_path, "first") as first:
        cid = lattica.content.put(data, node=first).result(30)
        store = _content(first).store
        real, left = store.get, [6]

        def get(c, **kw):  # six leaves, then "not held"
            if c.codec_name == "raw":
                if left[0] <= 0:
                    raise BlockNotFound(str(c))
                left[0] -= 1
            return real(c, **kw)

        store.get = get
        me.connect(first.addrs[0])
        with pytest.raises(LatticaError):
            lattica.content.get(cid, node=me).result(60)
        mine = _content(me).store
        held = sum(mine.size_of(c) for c in mine if c.codec_name == "raw")
    assert held >= 6 * MiB
    return cid, held


def test_a_resumed_get_reports_from_the_bytes_it_holds(tmp_path):
    """The progress of a get that resumes starts at what the blockstore holds (not at 0), and ends
    at the file's size."""
    data = os.urandom(16 * MiB)
    cid, held = _half_held(tmp_path, data)
    seen: list[dict] = []
    with _node(tmp_path, "me") as me, _node(tmp_path, "second") as second:
        lattica.content.put(data, node=second).result(30)
        me.connect(second.addrs[0])
        assert lattica.content.get(cid, node=me, progress=seen.append).result(60) == data
    assert seen[0]["bytes"] == seen[0]["held"] == held
    assert seen[-1]["done"] and seen[-1]["bytes"] == len(data)


def test_a_resumed_lattica_get_starts_its_bar_at_what_is_held(tmp_path):
    """On a terminal (a pty), the first figure of the bar of a resumed ``lattica get`` is the share
    already held, and the summary says how much was held."""
    import re

    data = os.urandom(16 * MiB)
    cid, held = _half_held(tmp_path, data)
    with _node(tmp_path, "second") as second:
        lattica.content.put(data, node=second).result(30)
        _slow(second, 0.05)
        p, seen = run_on_pty(
            [
                sys.executable,
                "-m",
                "lattica.cli",
                "get",
                cid,
                "-o",
                str(tmp_path / "out.bin"),
                "--bootstrap",
                str(second.addrs[0]),
                "--blocks",
                str(tmp_path / "me"),
            ]
        )
    text = seen.decode(errors="replace")
    assert p.returncode == 0, text[-2000:]
    first = re.search(r"(\d+\.\d)%", text)
    assert first is not None, text[-2000:]
    assert abs(float(first.group(1)) - 100 * held / len(data)) < 0.1, text[-2000:]
    assert f"{held / 1e6:.1f} MB of it held already" in text, text[-2000:]
