"""Arguments and results over the 64 MiB message cap travel by CID (lattica._runtime.spill): a
user's script against a plain ``lattica node``, from its own thread and from a coroutine, in the
order the calls were made, both ways; what was stored for a call goes when it is over; the
bound (``spill_limit``) on either side is a clear error; a stranger cannot make a node fetch."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lattica
from lattica.errors import FrameTooLarge
from lattica.mesh.process import cli_node
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(180)

SCRIPT = """\
import asyncio, sys, time
import numpy as np
import lattica

@lattica.actor
class Store:
    def __init__(self):
        self.log = []

    def put(self, x, tag, extra=None):
        self.log.append([tag, type(x).__name__, int(x.nbytes if hasattr(x, "nbytes") else len(x)), float(x[-1]) if len(x) else None])
        return tag

    def small(self, tag):
        self.log.append([tag, "small", 0, None])
        return tag

    def seen(self):
        return self.log

    def make(self, n):
        return np.arange(n, dtype=np.int64)

    def blob(self, n):
        return {"data": bytes(n), "n": n}

    def echo(self, *args, **kwargs):
        return args, kwargs

    def held(self):
        st = lattica.content.stat().result()
        return [st["pins"], st["bytes"]]

node = lattica.init(bootstrap=[sys.argv[1]], spill_limit=int(sys.argv[2]))
peer = sys.argv[1].rsplit("/p2p/", 1)[1]
s = Store.options(node=peer).remote()
theirs = lattica.get(s.held.remote())[0]  # (once the actor runs: the script's code package is pinned here)
before = [lattica.content.stat().result()["pins"], theirs]
big = np.arange(10_000_000, dtype=np.float64)  # 80 MB: over the cap

# from the script's own thread, with small calls between: they run in the order made
calls = [s.put.remote(big, "a"), s.small.remote("b"), s.put.remote(bytearray(b"z" * (70 << 20)), "c"), s.small.remote("d")]
print("order", lattica.get(calls), lattica.get(s.seen.remote()), flush=True)

# results over the cap, and an echo of nested big values both ways
r = lattica.get(s.make.remote(10_000_000))
print("make", r.dtype, r.shape, int(r[-1]), r.flags.writeable, flush=True)
r = lattica.get(s.blob.remote(70 << 20))
print("blob", type(r["data"]).__name__, len(r["data"]), r["n"], flush=True)
args, kwargs = lattica.get(s.echo.remote((big, 1), k={"m": memoryview(bytes(70 << 20))}))
print("echo", type(args[0]).__name__, args[0][0].shape, float(args[0][0][-1]), args[0][1], type(kwargs["k"]["m"]).__name__, len(kwargs["k"]["m"]), flush=True)

# from a coroutine on the node's loop: stored off the loop, still in order
async def from_loop():
    x = s.put.remote(big, "e")
    y = s.small.remote("f")
    return [await x, await y]

print("loop", node.run(from_loop(), timeout=60), lattica.get(s.seen.remote())[-2:], flush=True)
time.sleep(1.0)
print("held", lattica.content.stat().result()["pins"] - before[0], lattica.get(s.held.remote())[0] - before[1], flush=True)
"""


@pytest.fixture
def mesh(tmp_path):
    key = tmp_path / "mesh.key"
    MeshKey.generate().save(str(key))
    env = dict(os.environ, HOME=str(tmp_path / "home"), LATTICA_MESH=str(key))
    procs = []

    def node(*flags):
        cwd = tmp_path / f"node{len(procs)}"
        cwd.mkdir()
        proc, addr = cli_node(*flags, cwd=cwd, env=env)
        procs.append(proc)
        return addr

    def run(*args):
        job = tmp_path / "job"
        job.mkdir(exist_ok=True)
        (job / "train.py").write_text(textwrap.dedent(SCRIPT))
        return subprocess.run(
            [sys.executable, str(job / "train.py"), *map(str, args)],
            cwd=job,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )

    try:
        yield node, run, key
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _lines(out):
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines() if " " in line}


def test_big_arguments_and_results_travel_by_cid_in_order_and_nothing_stays(mesh):
    node, run, _ = mesh
    addr = node()
    r = run(addr, 1 << 30)
    assert r.returncode == 0, r.stderr[-3000:]
    got = _lines(r.stdout)
    assert got["order"] == (
        "['a', 'b', 'c', 'd'] [['a', 'ndarray', 80000000, 9999999.0], ['b', 'small', 0, None], "
        "['c', 'bytearray', 73400320, 122.0], ['d', 'small', 0, None]]"
    ), got
    assert got["make"] == "int64 (10000000,) 9999999 True"
    assert got["blob"] == "bytes 73400320 73400320"
    assert got["echo"] == "tuple (10000000,) 9999999.0 1 bytes 73400320"  # (a memoryview comes back as bytes)
    assert got["loop"] == "['e', 'f'] [['e', 'ndarray', 80000000, 9999999.0], ['f', 'small', 0, None]]"
    # nothing pinned for spills on either side once the calls are over (the node's answers stay KEEP_ANSWERS)
    assert got["held"] == "0 3", got["held"]  # (the node's three spilled answers stay KEEP_ANSWERS for their caller)


def test_the_bound_is_a_clear_error_on_either_side(mesh):
    node, run, _ = mesh
    addr = node("--spill-limit", str(50 << 20))
    r = run(addr, 1 << 30)  # the node refuses to fetch 80 MB for a call
    assert r.returncode != 0 and "spill_limit of 52428800" in r.stderr and "did not arrive" in r.stderr, r.stderr[
        -2000:
    ]
    r = run(addr, 0)  # the script spills nothing: the cap's own error, saying what to do
    assert r.returncode != 0 and "FrameTooLarge" in r.stderr and "lattica.content.put" in r.stderr, r.stderr[-2000:]


def test_a_stranger_cannot_make_a_node_fetch(mesh, tmp_path):
    node, _, key = mesh
    addr = node()
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh="open") as stranger:
        stranger.connect(addr)
        from lattica._runtime import ASYNC, ActorRef

        ref = ActorRef(lattica.PeerId.from_string(addr.rsplit("/p2p/", 1)[1]), "dht", {"ping": ASYNC})

        async def call():
            return await ref.ping.remote(np.zeros(10_000_000))

        with pytest.raises(lattica.errors.PermissionDenied, match="only from members"):
            stranger.run(call(), timeout=60)


def test_without_a_content_service_the_cap_stands():
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], content=False) as a, lattica.Node(["/ip4/127.0.0.1/tcp/0"]) as b:
        a.connect(b.addrs[0])
        from lattica._runtime import ASYNC, ActorRef

        ref = ActorRef(b.peer_id, "dht", {"ping": ASYNC})

        async def call():
            return await ref.ping.remote(np.zeros(10_000_000))

        with pytest.raises(FrameTooLarge, match="lattica.content.put"):
            a.run(call(), timeout=30)
