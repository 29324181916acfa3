"""Transport and node benchmarks: stream throughput, ping RTT, handshake time, start-up and RSS.

Each benchmark runs the server side in a separate process (``lattica.mesh.process``) so client and
server get their own interpreter and core, as two real nodes would.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from lattica._loop import DEFAULT_BUSY_POLL_US
from lattica._multiaddr import Multiaddr
from lattica._node import Node
from lattica.bench import host_of
from lattica.mesh.process import SINK, ServerProcess
from lattica.transports.noise import MAX_PLAINTEXT, Cipher

LOOPBACK = {"tcp": "/ip4/127.0.0.1/tcp/0", "quic": "/ip4/127.0.0.1/udp/0/quic-v1"}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@contextlib.contextmanager
def server(transport: str, *extra: str, link: Any = None) -> Iterator[tuple[ServerProcess, Any]]:
    """A node in another process: on loopback, or across an emulated ``link`` (a profile of
    lattica.bench.linkem, by name or a ``Profile``: the node runs in the link's far namespace).
    Yields (server, link)."""
    if link is None:
        with ServerProcess([LOOPBACK[transport]], *extra) as srv:
            yield srv, None
        return
    from lattica.bench.linkem import EmulatedLink  # (only a --link run builds namespaces)

    with EmulatedLink(link) as lk:
        far = f"/ip4/{lk.far_ip}/tcp/0" if transport == "tcp" else f"/ip4/{lk.far_ip}/udp/0/quic-v1"
        with ServerProcess([far], *extra, wrap=lk.wrap) as srv:
            yield srv, lk


_PLAIN_SINK = r"""
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
n = 0
while True:
    d = c.recv(1 << 20)
    if not d:
        break
    n += len(d)
c.sendall(str(n).encode())
c.close()
"""


def plain_tcp(lk: Any, size: int, chunk: int = 1 << 20) -> float:
    """MB/s of one plain TCP connection (no Noise, no mux) carrying ``size`` bytes across the
    emulated link ``lk``: what the link itself gives one stream, the baseline beside Lattica's."""
    sink = subprocess.Popen([*lk.wrap, sys.executable, "-c", _PLAIN_SINK, lk.far_ip], stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())  # type: ignore[union-attr]
        block = os.urandom(chunk)
        with socket.create_connection((lk.far_ip, port), timeout=600) as s:
            t0 = time.perf_counter()
            sent = 0
            while sent < size:
                n = min(chunk, size - sent)
                s.sendall(block if n == chunk else block[:n])
                sent += n
            s.shutdown(socket.SHUT_WR)
            got = int(s.recv(64) or b"0")
            elapsed = time.perf_counter() - t0
    finally:
        sink.kill()
        sink.wait()
    return round(got / elapsed / 1e6, 1)


_PLAIN_ECHO = r"""
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
buf = memoryview(bytearray(1 << 20))
while True:
    n = c.recv_into(buf)
    if not n:
        break
    c.sendall(buf[:n])
"""


def plain_tcp_echo(lk: Any, seconds: float, warmup: float = 1.0) -> float:
    """MB/s echoed by one plain TCP connection across the emulated link ``lk`` (no Noise, no mux:
    the far side sends back every byte it gets, both directions full): what the link carries for
    an echo workload, the baseline beside large calls over the same link."""
    import threading  # (only a --link run with large calls echoes over plain TCP)

    echo = subprocess.Popen([*lk.wrap, sys.executable, "-c", _PLAIN_ECHO, lk.far_ip], stdout=subprocess.PIPE, text=True)
    try:
        port = int(echo.stdout.readline())  # type: ignore[union-attr]
        block = os.urandom(1 << 20)
        stop = threading.Event()
        with socket.create_connection((lk.far_ip, port), timeout=60) as s:

            def send() -> None:
                try:
                    while not stop.is_set():
                        s.sendall(block)
                except OSError:
                    pass

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            buf = bytearray(1 << 20)
            got, t0, start = 0, time.perf_counter(), None
            while True:
                n = s.recv_into(buf)
                now = time.perf_counter()
                if not n:
                    raise RuntimeError("the plain TCP echo across the link ended early")
                if start is None:
                    if now - t0 >= warmup:
                        start = now
                    continue
                got += n
                if now - start >= seconds:
                    break
            stop.set()
            s.shutdown(socket.SHUT_RDWR)
            sender.join(10)
    finally:
        echo.kill()
        echo.wait()
    return round(got / (now - start) / 1e6, 1)


def bench_stream(
    transport: str = "tcp",
    size: int = 1 << 30,
    chunk: int = 1 << 20,
    busy_poll_us: float = DEFAULT_BUSY_POLL_US,
    link: str | None = None,
) -> dict[str, Any]:
    """One stream, one direction: push ``size`` bytes to a sink in another process (across an
    emulated ``link``, with a plain TCP connection's figure over the same link beside it)."""
    block = os.urandom(chunk)
    poll = ["--busy-poll-us", str(busy_poll_us)]
    with server(transport, "--no-digest", *poll, link=link) as (srv, lk), Node([], busy_poll_us=busy_poll_us) as node:
        node.connect(srv.addr(transport))
        pid = node.peers()[0].peer_id

        async def push() -> tuple[float, str]:
            stream = await node.aopen_stream(pid, SINK)
            t0 = time.perf_counter()
            sent = 0
            while sent < size:
                n = min(chunk, size - sent)
                stream.write(block if n == chunk else block[:n])
                await stream.drain()
                sent += n
            await stream.close()
            reply = (await stream.read(200)).decode()
            return time.perf_counter() - t0, reply

        elapsed, reply = node.run(push(), timeout=None)
        baseline = plain_tcp(lk, size, chunk) if lk is not None else None
    received = int(reply.split(":")[0])
    return {
        "bench": "stream",
        "transport": transport,
        **({"link": link, "plain_tcp_MB_per_s": baseline} if link else {}),
        "busy_poll_us": busy_poll_us,
        "bytes": size,
        "received": received,
        "seconds": round(elapsed, 3),
        "MB_per_s": round(size / elapsed / 1e6, 1),
    }


def bench_ping(
    transport: str = "tcp", count: int = 10000, busy_poll_us: float = DEFAULT_BUSY_POLL_US
) -> dict[str, Any]:
    """Sequential 32-byte pings on one stream to a node in another process."""
    poll = ["--busy-poll-us", str(busy_poll_us)]
    with ServerProcess([LOOPBACK[transport]], *poll) as srv, Node([], busy_poll_us=busy_poll_us) as node:
        info = node.connect(srv.addr(transport))
        node.ping_many(info.peer_id, min(500, count))  # warm-up
        rtts = node.ping_many(info.peer_id, count)
    us = [r * 1e6 for r in rtts]
    return {
        "bench": "ping",
        "transport": transport,
        "busy_poll_us": busy_poll_us,
        "count": count,
        "p50_us": round(pct(us, 0.50), 1),
        "p99_us": round(pct(us, 0.99), 1),
        "mean_us": round(statistics.fmean(us), 1),
    }


def bench_handshake(transport: str = "tcp", count: int = 200) -> dict[str, Any]:
    """Fresh authenticated connections (TCP: connect + Noise XX; QUIC: TLS 1.3), dial to ready."""
    with ServerProcess([LOOPBACK[transport]]) as srv, Node([]) as node:
        addr = Multiaddr(srv.addr(transport))

        async def run() -> list[float]:
            t = host_of(node).transport_for(addr)
            assert t is not None  # (a TCP or QUIC address: a node has both)
            times = []
            for _ in range(count):
                t0 = time.perf_counter()
                conn = await t.dial(addr)
                times.append(time.perf_counter() - t0)
                conn.abort("benchmark")
            return times

        times = node.run(run())
    ms = [x * 1e3 for x in times]
    return {
        "bench": "handshake",
        "transport": transport,
        "count": count,
        "p50_ms": round(pct(ms, 0.5), 3),
        "p99_ms": round(pct(ms, 0.99), 3),
    }


_STARTUP_CHILD = r"""
import sys, time
t_proc = float(sys.argv[1])
t0 = time.perf_counter()
import lattica
t1 = time.perf_counter()
node = lattica.Node(sys.argv[2:])
node.start()
t2 = time.perf_counter()
time.sleep(1.0)
rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
import json  # (after the figures: the harness's own imports are not the node's cost)
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "start_ms": (t2 - t1) * 1e3,
                  "wall_ms": (time.time() - t_proc - 1.0) * 1e3, "rss_kib": rss}))
node.stop()
"""


def bench_startup(transports: tuple[str, ...] = ("tcp", "quic"), runs: int = 5) -> dict[str, Any]:
    """Start-to-listening (import + Node.start, and from exec) and idle RSS of a fresh process.

    Measured as an installed package runs: with its bytecode cached (``pip install`` compiles it;
    one discarded run writes it here even when PYTHONDONTWRITEBYTECODE is set in our environment)."""
    listen = [LOOPBACK[t] for t in transports]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    results = []
    for i in range(runs + 1):
        out = subprocess.run(
            [sys.executable, "-c", _STARTUP_CHILD, repr(time.time()), *listen],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        if i:
            results.append(json.loads(out.stdout))
    med = lambda k: round(statistics.median(r[k] for r in results), 1)  # noqa: E731
    return {
        "bench": "startup",
        "listen": "+".join(transports),
        "runs": runs,
        "node_start_ms": med("start_ms"),
        "import_ms": med("import_ms"),
        "exec_to_listening_ms": med("wall_ms"),
        "idle_rss_mib": round(statistics.median(r["rss_kib"] for r in results) / 1024, 1),
    }


def bench_noise_ciphers(frames: int = 20000) -> dict[str, Any]:
    """The measurement behind the cipher choice: seal 64 KiB frames with each Noise cipher."""
    data = os.urandom(MAX_PLAINTEXT)
    out: dict[str, Any] = {"bench": "noise-ciphers"}
    for name, aes in (("AES-256-GCM", True), ("ChaChaPoly", False)):
        c = Cipher(os.urandom(32), aes)
        t0 = time.perf_counter()
        for _ in range(frames):
            c.encrypt(None, data)
        out[f"{name}_MB_per_s"] = round(frames * len(data) / (time.perf_counter() - t0) / 1e6)
    return out
