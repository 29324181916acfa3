"""``lattica bench ceilings``: what this machine does without Lattica, printed beside the data
plane's figures (issue 51) so that each is read as a share of what the machine can do in the same
run: one plain TCP stream between two processes on loopback, sha2-256, AES-256-GCM and
ChaCha20-Poly1305 on one core, and the plain UDP datagrams of QUIC's size one Python process can
send to another (the floor under any QUIC written in Python: two system calls per datagram)."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from typing import Any, NamedTuple

from lattica.bench.transport import bench_noise_ciphers, plain_tcp

__all__ = ["machine_ceilings"]

_UDP_SINK = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
buf = bytearray(65536)
n = 0
first = last = None
s.settimeout(2.0)
while True:
    try:
        k = s.recv_into(buf)
    except socket.timeout:
        break
    if k == 1:  # the sender's end mark
        break
    last = time.perf_counter()
    if first is None:
        first = last
    n += 1
print(n, (last or 0) - (first or 0), flush=True)
"""


class _Loopback(NamedTuple):
    """What ``plain_tcp`` needs of a link, for loopback: no wrapper, 127.0.0.1."""

    wrap: tuple[str, ...] = ()
    far_ip: str = "127.0.0.1"


def udp_datagrams(size: int = 1350, seconds: float = 2.0) -> dict[str, float]:
    """Plain datagrams of ``size`` bytes sent by this process to a receiving process on loopback
    for ``seconds``: those received per second, and the MB/s they make."""
    sink = subprocess.Popen([sys.executable, "-c", _UDP_SINK], stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())  # type: ignore[union-attr]
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("127.0.0.1", port))
        data = os.urandom(size)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(64):  # (what the receiver's buffer cannot take is dropped: counted there)
                s.send(data)
        time.sleep(0.05)
        s.send(b"\x00")
        s.close()
        received, span = sink.stdout.readline().split()  # type: ignore[union-attr]
        per_s = int(received) / float(span) if float(span) > 0 else 0.0
    finally:
        sink.kill()
        sink.wait()
    return {f"udp_{size}B_datagrams_per_s": round(per_s), f"udp_{size}B_MB_per_s": round(per_s * size / 1e6, 1)}


def sha256_rate(size: int = 256 << 20, block: int = 256 << 10) -> float:
    """MB/s of sha2-256 over ``size`` bytes in ``block``-sized pieces (a content block each)."""
    data = os.urandom(block)
    t0 = time.perf_counter()
    for _ in range(size // block):
        hashlib.sha256(data).digest()
    return round(size / (time.perf_counter() - t0) / 1e6)


def machine_ceilings(stream_bytes: int = 1 << 30) -> dict[str, Any]:
    """The machine's own figures, one row (see the module docstring)."""
    ciphers = bench_noise_ciphers(frames=4000)
    return {
        "bench": "ceilings",
        "tcp_stream_MB_per_s": plain_tcp(_Loopback(), stream_bytes),
        "sha256_MB_per_s": sha256_rate(),
        "aes256gcm_MB_per_s": ciphers["AES-256-GCM_MB_per_s"],
        "chacha20poly1305_MB_per_s": ciphers["ChaChaPoly_MB_per_s"],
        **udp_datagrams(1350),
    }
