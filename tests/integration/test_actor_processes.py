"""Actors in a real child process on 127.0.0.1: spawn there, call it (sync, async, streams both
ways, numpy arrays of a few MiB), graceful shutdown with on_stop, and a child that dies (SIGKILL)
or hangs (SIGSTOP) with calls in flight: the callers fail promptly, they never hang."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

import lattica
import sample_actors as sa
from lattica.errors import ActorDied, ActorNotFound, CallTimeout, PeerUnreachable, RemoteError

pytestmark = pytest.mark.timeout(60)

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
ROOT = os.path.dirname(os.path.dirname(SUPPORT))

CHILD = r"""
import json, os, sys
import lattica
node = lattica.init(["/ip4/127.0.0.1/tcp/0"], allow=["sample_actors.*"])
print(json.dumps({"peer_id": str(node.peer_id), "addrs": [str(a) for a in node.addrs], "pid": os.getpid()}), flush=True)
sys.stdin.read()  # serve until the parent closes our stdin
lattica.shutdown()
"""


class ChildNode:
    """A ``lattica.init()`` node in a child process (mirrors lattica.mesh.process.ServerProcess)."""

    def __enter__(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SUPPORT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
        )
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            raise RuntimeError(f"child node exited with code {self.proc.wait()} before listening")
        info = json.loads(line)
        self.peer_id = lattica.PeerId.from_string(info["peer_id"])
        self.addrs = info["addrs"]
        self.pid = info["pid"]
        return self

    def close(self, timeout=10):
        """Graceful: close stdin, the child shuts its node down and exits."""
        self.proc.stdin.close()
        return self.proc.wait(timeout)

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            try:
                self.close()
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def child(default_node):
    with ChildNode() as c:
        default_node.connect(c.addrs[0])
        yield c


def test_actors_in_a_child_process(default_node, child, tmp_path):
    token = uuid.uuid4().hex
    info = sa.Info.options(node=child.peer_id).remote()
    assert info.pid.remote().result(10) == child.pid != os.getpid()

    # sync and async methods, FIFO from one caller
    c = sa.Counter.options(node=child.peer_id, name="counter").remote(1)
    assert c.incr.remote(2).result(5) == 3
    assert c.aincr.remote(3).result(5) == 6
    assert lattica.get([c.append.remote(i) for i in range(300)], timeout=10) == list(range(1, 301))
    assert c.items_list.remote().result(5) == list(range(300))
    assert lattica.get_actor("counter", node=child.peer_id) == c

    # typed errors across processes
    w = sa.Worker.options(node=child.peer_id).remote()
    with pytest.raises(ValueError) as ei:
        w.raise_value.remote("across processes").result(5)
    assert isinstance(ei.value, RemoteError) and "RAISE_VALUE_LINE" in ei.value.remote_traceback
    with pytest.raises(CallTimeout):
        w.forever.options(timeout=0.2).remote(token).result(5)

    # streaming both ways
    s = sa.Streamer.options(node=child.peer_id).remote()
    assert list(s.agen.stream(200)) == list(range(200))
    assert list(s.gen.stream(50)) == [i * 10 for i in range(50)]

    async def consume():
        return [x async for x in s.agen.stream(100)]

    assert asyncio.run(consume()) == list(range(100))

    async def numbers(n):
        for i in range(n):
            yield i

    assert s.total.remote(numbers(500)).result(10) == sum(range(500))

    # numpy arrays of a few MiB, both ways, verified by value
    n = sa.Numeric.options(node=child.peer_id).remote()
    rng = np.random.default_rng(11)
    a = rng.standard_normal((1024, 512))  # 4 MiB
    b = rng.standard_normal((512, 256)).astype(np.float32)  # 0.5 MiB
    back = n.echo.remote(a).result(10)
    assert back.dtype == a.dtype and back.shape == a.shape
    np.testing.assert_array_equal(back, a)
    np.testing.assert_allclose(
        n.matmul.remote(a.astype(np.float32), b).result(10), a.astype(np.float32) @ b, rtol=1e-4, atol=1e-3
    )
    big = n.make.remote(3 << 20, 21).result(10)  # 12 MiB of float32 made over there
    np.testing.assert_array_equal(big, np.random.default_rng(21).standard_normal(3 << 20).astype(np.float32))
    total, shape, dtype = n.checksum.remote(b).result(10)
    assert (
        total == pytest.approx(float(b.sum(dtype=np.float64)), rel=1e-4) and shape == [512, 256] and dtype == "float32"
    )

    # kill across processes, then graceful shutdown runs on_stop of the actors still alive
    k = sa.Stoppable.options(node=child.peer_id).remote("killed", str(tmp_path / "stops"))
    assert k.ping.remote().result(5) == "pong"
    lattica.kill(k)
    with pytest.raises(ActorNotFound):
        k.ping.remote().result(5)
    st = sa.Stoppable.options(node=child.peer_id).remote(token, str(tmp_path / "stops"))
    assert st.ping.remote().result(5) == "pong"
    assert child.close() == 0
    assert (tmp_path / "stops").read_text().splitlines() == ["stopped killed", f"stopped {token}"]
    with pytest.raises(PeerUnreachable):
        c.get.remote().result(10)


def test_sigkill_with_calls_in_flight_fails_them_promptly(default_node, child):
    w = sa.Worker.options(node=child.peer_id).remote()
    s = sa.Streamer.options(node=child.peer_id).remote()
    assert w.aping.remote().result(5) == "pong"

    in_flight = {
        "async forever": w.forever.remote("t"),
        "async slow": w.slow.remote(60),
        "sync blocked": w.wait_gate.remote("never-opened", 60),
        "sync queued": w.ping.remote(),
    }

    async def endless():
        i = 0
        while True:
            yield i
            i += 1
            await asyncio.sleep(0.001)

    in_flight["client stream"] = s.slow_total.remote(endless(), "t", 0.01)
    stream_outcome = []
    streaming = threading.Event()

    def consume():
        try:
            for _ in s.produce_forever.stream("t"):
                streaming.set()
        except (PeerUnreachable, ActorDied) as e:
            stream_outcome.append(e)
        except BaseException as e:  # noqa: BLE001 -- reported by the assertion below
            stream_outcome.append(e)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert streaming.wait(5)
    assert w.aping.remote().result(5) == "pong"  # everything above has reached the child
    assert not any(f.done() for f in in_flight.values())

    os.kill(child.pid, signal.SIGKILL)
    t0 = time.monotonic()
    for what, fut in in_flight.items():
        with pytest.raises((PeerUnreachable, ActorDied)):
            fut.result(5)
    consumer.join(5)
    elapsed = time.monotonic() - t0
    assert not consumer.is_alive(), "the stream consumer hangs"
    assert len(stream_outcome) == 1 and isinstance(stream_outcome[0], (PeerUnreachable, ActorDied)), stream_outcome
    assert elapsed < 5.0
    child.proc.wait(5)

    # new calls to the dead node fail promptly too
    t0 = time.monotonic()
    with pytest.raises(PeerUnreachable):
        w.aping.remote().result(10)
    with pytest.raises(PeerUnreachable):
        w.ping.remote().result(10)
    assert time.monotonic() - t0 < 5.0
    # and this node is fine
    assert sa.Counter.remote(5).incr.remote(1).result(5) == 6


def _wait_stopped(pid, timeout=5.0):
    """True once the kernel reports ``pid`` stopped (SIGSTOP is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] in ("T", "t"):
                return True
        time.sleep(0.005)
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc to see the child stopped")
def test_hung_peer_calls_end_at_their_deadline(default_node, child):
    w = sa.Worker.options(node=child.peer_id).remote()
    assert w.aping.remote().result(5) == "pong"
    os.kill(child.pid, signal.SIGSTOP)
    try:
        assert _wait_stopped(child.pid), "the child did not stop"
        t0 = time.monotonic()
        futs = [w.aping.options(timeout=0.5).remote(), w.ping.options(timeout=0.5).remote()]
        for f in futs:
            with pytest.raises(CallTimeout):
                f.result(5)
        assert time.monotonic() - t0 < 3.0
    finally:
        os.kill(child.pid, signal.SIGCONT)
    assert w.aping.remote().result(5) == "pong"  # it resumes serving
