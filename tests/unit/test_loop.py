"""The node loop's busy-poll selector: it delivers events, and its polling window adapts."""

import asyncio
import socket
import subprocess
import sys
import threading
import time

from lattica._loop import BUSY_POLL_US, DEFAULT_BUSY_POLL_US, BusyPollSelector, CpuPressure, new_loop


def test_busy_poll_window_shrinks_when_idle_and_grows_on_traffic():
    sel = BusyPollSelector(200e-6)
    a, b = socket.socketpair()
    sel.register(a, 1)  # EVENT_READ
    for _ in range(5):
        assert sel.select(0.001) == []  # nothing arrives: each call halves the window
    assert sel._spin == sel._min
    b.send(b"x")
    events = sel.select(1.0)
    assert [key.fileobj for key, _ in events] == [a]
    assert sel._spin == 2 * sel._min  # polling caught it: the window grows again
    sel.close()
    a.close()
    b.close()


def test_busy_poll_window_recovers_when_a_longer_window_would_have_caught_the_event():
    # Wide windows (max 400 ms, min 50 ms) so thread scheduling jitter cannot flip the outcome.
    sel = BusyPollSelector(0.4)
    a, b = socket.socketpair()
    sel.register(a, 1)
    for _ in range(4):
        sel.select(0.0001)
    assert sel._spin == sel._min

    def send_after(delay: float) -> threading.Timer:
        t = threading.Timer(delay, b.send, (b"x",))
        t.start()
        return t

    t = send_after(0.15)  # missed by the 50 ms spin, but within the 400 ms maximum
    assert sel.select(5.0) and a.recv(8) == b"x"
    t.join()
    assert sel._spin == 2 * sel._min  # grows: this round trip needs a longer window, not a shorter one
    t = send_after(0.8)  # slower than the maximum window: polling for it would be wasted
    assert sel.select(5.0) and a.recv(8) == b"x"
    t.join()
    assert sel._spin == sel._min
    sel.close()
    a.close()
    b.close()


def _psi(path, total_us: int) -> None:
    path.write_text(
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={total_us}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )


def test_cpu_pressure_reads_the_stall_time_of_the_last_period(tmp_path):
    psi = tmp_path / "cpu"
    _psi(psi, 1_000_000)
    p = CpuPressure(str(psi), threshold=0.1, period=0.25)
    _psi(psi, 1_010_000)  # 10 ms of stall in the next second: 1 %
    assert p.contended(1.0) is False
    _psi(psi, 1_210_000)  # 200 ms in the next 0.5 s: 40 %
    assert p.contended(1.1) is False  # within the period: the last answer stands
    assert p.contended(1.5) is True
    _psi(psi, 1_215_000)
    assert p.contended(2.0) is False
    assert CpuPressure(str(tmp_path / "absent")).contended(5.0) is False  # no PSI: never contended
    psi.write_text("garbage")
    assert p.contended(9.0) is False  # unreadable: treated as absent from then on


def test_busy_poll_does_not_spin_while_cpus_are_contended():
    class Contended:
        def contended(self, now: float) -> bool:
            return True

    sel = BusyPollSelector(0.3, pressure=Contended())
    a, b = socket.socketpair()
    sel.register(a, 1)
    cpu = time.thread_time()
    assert sel.select(0.2) == []  # would spin for all 0.2 s were the CPUs free
    assert time.thread_time() - cpu < 0.05  # it blocked instead
    sel.close()
    a.close()
    b.close()


def test_loops_run_real_io():
    for busy in (200.0, 0.0):
        loop = new_loop(busy, None)
        try:

            async def echo_once():
                r, w = await asyncio.open_connection(*server.sockets[0].getsockname())
                w.write(b"ping")
                data = await r.read(4)
                w.close()
                return data

            async def handle(r, w):
                w.write(await r.read(4))
                await w.drain()
                w.close()

            server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
            assert loop.run_until_complete(echo_once()) == b"ping"
            server.close()
        finally:
            loop.close()


def test_a_node_loop_polls_only_when_asked():
    """``busy_poll_us=0`` is the plain loop, the window the busy poll; the default is the busy
    poll until the suite is green on the plain loop (docs/benchmarks.md)."""

    def polls(loop: asyncio.AbstractEventLoop) -> bool:
        return isinstance(getattr(loop, "_selector", None), BusyPollSelector)

    for busy, expected in ((0.0, False), (BUSY_POLL_US, True), (DEFAULT_BUSY_POLL_US, True)):
        loop = new_loop(busy, None)
        try:
            assert polls(loop) is expected
        finally:
            loop.close()


def test_importing_lattica_does_not_import_numpy_or_aioquic():
    code = (
        "import sys, lattica, lattica.codec as c\n"
        "assert c.decode(c.encode_bytes({'a': [1, b'x']})) == {'a': [1, b'x']}\n"
        "assert 'numpy' not in sys.modules and 'aioquic' not in sys.modules, sorted(sys.modules)\n"
        "import numpy as np\n"
        "assert (c.decode(c.encode_bytes(np.arange(3))) == np.arange(3)).all()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
