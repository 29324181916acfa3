"""``lattica bench libp2p``: Lattica beside rust-libp2p, go-libp2p and js-libp2p in one run
(issue 48): handshake time, ping p50 and one-stream throughput, each foreign pair measured next to
the same initiator with a Lattica node as the responder, and our node as the initiator to each.

Every figure of a comparison is timed by the same code: js -> js and js -> Lattica by js-libp2p
itself (peer.mjs's ``bench`` op), go -> go and go -> Lattica through the same p2pd (its control
socket and stream proxy), rust -> rust and rust -> Lattica by the SDK's Python API (all it
exposes: fresh nodes bootstrapping to the responder, rust-libp2p's own ping of each new
connection, and one call of the RPC method ``Echo.sink`` on its ``/rpc/req-resp/1.0.0``, which our
node speaks too: sdk_rpc.py), Lattica -> X by our node. The peers run from ``make
interop-peers``'s ``.interop/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import structlog

from lattica import sdk
from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._node import Node
from lattica.bench import _peers, host_of
from lattica.bench._peers import sdk_rpc
from lattica.bench._peers.js_peer import JsPeer
from lattica.bench._peers.p2pd import Daemon, daemon, read_delimited
from lattica.sdk import _wire as w
from lattica.transports.base import Connection, Stream

log = structlog.get_logger(__name__)

SINK = "/lattica-bench/sink/1.0.0"  # an 8-byte big-endian length, that many bytes, one byte back
PING = "/ipfs/ping/1.0.0"
LISTEN = {"tcp": "/ip4/127.0.0.1/tcp/0", "quic": "/ip4/127.0.0.1/udp/0/quic-v1"}
BLOCK = 1 << 20
IMPLEMENTATIONS = ("rust", "go", "js")


def _on(addrs: list[str], transport: str) -> str:
    """The first of ``addrs`` on ``transport``."""
    return next(a for a in addrs if ("/quic-v1" in a) == (transport == "quic"))


def _p50(values: list[float] | None, digits: int = 3) -> float | None:
    return round(statistics.median(values), digits) if values else None


def _row(
    transport: str,
    initiator: str,
    responder: str,
    handshake_ms: list[float] | None,
    ping_us: list[float] | None,
    mb_per_s: float | None,
) -> dict[str, Any]:
    """One pair's figures; None where the initiator's API gives no way to measure it."""
    return {
        "bench": "libp2p",
        "transport": transport,
        "pair": f"{initiator}->{responder}",
        "handshake_p50_ms": _p50(handshake_ms),
        "handshakes": len(handshake_ms or ()),
        "ping_p50_us": _p50(ping_us, 1),
        "pings": len(ping_us or ()),
        "MB_per_s": None if mb_per_s is None else round(mb_per_s, 1),
    }


# -- processes --------------------------------------------------------------------------------


class _Child:
    """A process that prints one JSON line once ready and serves until its stdin closes."""

    def __init__(self, argv: list[str], **popen: Any) -> None:
        self.argv = argv
        # (its stderr to a file: a pipe nobody reads would stop a chatty child once full)
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, **popen
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError(f"{argv[1]} {argv[2]} exited before it was ready: {self.errors()}")
        self.hello: dict[str, Any] = json.loads(line)

    def report(self) -> dict[str, Any]:
        """Close the child's stdin and return the JSON line it prints as it stops."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.argv[1]} {self.argv[2]} stopped without a report: {self.errors()}")
        return json.loads(line)

    def errors(self) -> str:
        """The end of what the child wrote to stderr."""
        self.stderr.seek(0)
        return self.stderr.read()[-1500:]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if errors := self.errors():
            log.debug("bench child's stderr", argv=self.argv[1:3], stderr=errors)
        self.stderr.close()


@contextlib.contextmanager
def _child(argv: list[str], **popen: Any) -> Iterator[_Child]:
    c = _Child(argv, **popen)
    try:
        yield c
    finally:
        c.close()


def _lattica_responder(transport: str) -> contextlib.AbstractContextManager[_Child]:
    """A Lattica node in a process of its own, listening on ``transport`` only, serving the sink."""
    return _child([sys.executable, "-m", "lattica.bench.libp2p", "serve", LISTEN[transport]])


def _sdk_place() -> dict[str, Any]:
    """Where the SDK's processes run: cwd and HOME a folder of their own (it keeps a key and a DHT
    database there), RUST_LOG unset (its tracing would print on stdout, among our JSON lines)."""
    home = pathlib.Path(tempfile.gettempdir()) / "lattica-sdk-home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}
    return {"cwd": home, "env": {**env, "HOME": str(home)}}


def sdk_responder(sdk_python: pathlib.Path) -> contextlib.AbstractContextManager[_Child]:
    """An SDK node (``sdk_peer.py serve``) on 127.0.0.1, TCP and QUIC, serving ``Echo.echo`` and
    ``Echo.sink`` on its RPC; its hello holds its PeerId and addresses, its report what it echoed."""
    return _child([str(sdk_python), str(_peers.SDK_PEER), "serve"], **_sdk_place())


def _sdk(sdk_python: pathlib.Path, *args: str, timeout: float) -> dict[str, Any]:
    """One run of sdk_peer.py under the SDK's interpreter; its last line of output, parsed."""
    out = subprocess.run(
        [str(sdk_python), str(_peers.SDK_PEER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **_sdk_place(),
    )
    if out.returncode != 0:
        raise RuntimeError(f"the SDK peer failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- Lattica's side -----------------------------------------------------------------------------


async def _read_exactly(stream: Stream, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = await stream.read(n - len(buf))
        if not chunk:
            raise EOFError(f"the stream ended after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


async def serve_sink(stream: Stream, conn: Connection) -> None:
    """The sink protocol's responder: read the length, swallow that many bytes, answer one byte."""
    left = int.from_bytes(await _read_exactly(stream, 8), "big")
    while left > 0:
        chunk = await stream.read(BLOCK)
        if not chunk:
            return
        left -= len(chunk)
    stream.write(b"k")
    await stream.close()


async def _push(node: Node, peer: PeerId, size: int) -> float:
    """MB/s of one stream pushing ``size`` bytes to ``peer``'s sink, first byte to its answer."""
    stream = await node.aopen_stream(peer, SINK)
    block = os.urandom(BLOCK)
    t0 = time.perf_counter()
    stream.write(size.to_bytes(8, "big"))
    sent = 0
    while sent < size:
        n = min(BLOCK, size - sent)
        stream.write(block if n == BLOCK else block[:n])
        await stream.drain()
        sent += n
    ack = await _read_exactly(stream, 1)
    elapsed = time.perf_counter() - t0
    await stream.close()
    assert ack == b"k", ack
    return size / elapsed / 1e6


async def _rpc_push(node: Node, peer: PeerId, size: int) -> float:
    """MB/s of one ``Echo.sink`` call of ``size`` bytes on ``peer``'s SDK RPC (after one of a byte,
    unmeasured), from opening its stream to the decoded answer: what the SDK's call includes."""
    payload = os.urandom(size)
    for data in (b"w", payload):
        t0 = time.perf_counter()
        stream = await node.aopen_stream(peer, sdk_rpc.PROTOCOL)
        answer = await sdk_rpc.call(stream, f"lattica-sink-{len(data)}", "Echo.sink", data, limit=4096)
        elapsed = time.perf_counter() - t0
        if not isinstance(answer, w.Response) or answer.data != b"k":
            raise RuntimeError(f"Echo.sink answered {answer}")
    return size / elapsed / 1e6


Push = Callable[[Node, PeerId, int], Coroutine[Any, Any, float]]  # one stream of N bytes to a peer: its MB/s


def from_lattica(
    addr: str, handshakes: int, pings: int, size: int, push: Push = _push
) -> tuple[list[float], list[float], float]:
    """Our node dials ``addr``: fresh authenticated connections (the transport's dial, after one
    unmeasured dial that finds out which stack the peer speaks), ``pings`` 32-byte pings on one
    stream (/ipfs/ping/1.0.0 to a libp2p peer, ours to a Lattica one), one stream of ``size``
    bytes by ``push`` (to the sink protocol, or to the SDK's RPC sink: ``_rpc_push``)."""
    with Node([]) as node:
        target = Multiaddr(addr)

        async def dial_times() -> list[float]:
            t = host_of(node).transport_for(target)
            assert t is not None  # (a TCP or QUIC address: a node has both)
            times = []
            for _ in range(handshakes + 1):
                t0 = time.perf_counter()
                conn = await t.dial(target)
                times.append((time.perf_counter() - t0) * 1e3)
                conn.abort("benchmark")
            return times[1:]

        ms = node.run(dial_times(), timeout=60 + handshakes)
        info = node.connect(addr)
        node.ping_many(info.peer_id, min(100, pings))  # warm-up
        us = [r * 1e6 for r in node.ping_many(info.peer_id, pings)]
        mbs = node.run(push(node, info.peer_id, size), timeout=120 + size / 1e6)
    return ms, us, mbs


class _SdkSink:
    """What the responder serves SDK nodes (``Echo.sink``): one byte back, whatever came."""

    async def sink(self, request: bytes) -> bytes:
        return b"k"


def _serve(listen: str) -> None:
    """``python -m lattica.bench.libp2p serve ADDR``: the Lattica responder's process, serving the
    sink protocol and, for the SDK's nodes, ``Echo.sink`` through ``lattica.sdk`` (its RPC)."""
    with Node([listen]) as node:
        host_of(node).set_handler(SINK, serve_sink)
        sdk.serve(_SdkSink(), "Echo", node=node)
        hello = {"peer_id": str(node.peer_id), "addrs": [str(a) for a in node.addrs]}
        sys.stdout.write(json.dumps(hello) + "\n")
        sys.stdout.flush()
        sys.stdin.read()


def _unix_sink(path: str) -> None:
    """``python -m lattica.bench.libp2p unix-sink PATH``: the sink behind a p2pd's stream
    handler (the daemon hands each stream over as a unix socket, after a delimited StreamInfo)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_delimited(reader)
        left = int.from_bytes(await reader.readexactly(8), "big")
        while left > 0:
            chunk = await reader.read(BLOCK)
            if not chunk:
                return
            left -= len(chunk)
        writer.write(b"k")
        await writer.drain()
        # (closing at once makes p2pd reset the stream, and over QUIC a reset may overtake the
        # answer: held open until the initiator closes its side)
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(reader.read(), 10)
        writer.close()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, path)
        sys.stdout.write(json.dumps({"sink": path}) + "\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        server.close()

    asyncio.run(main())


# -- go-libp2p ------------------------------------------------------------------------------------


async def _from_go(
    go: Daemon, peer: PeerId, addrs: list[Multiaddr], handshakes: int, pings: int, size: int
) -> tuple[list[float], list[float], float]:
    """p2pd dials ``peer``: CONNECT requests on its control socket, each answered once go-libp2p's
    host connected (and identified: go's Connect waits for it), then DISCONNECT; pings of 32 bytes
    on one /ipfs/ping/1.0.0 stream proxied over a unix socket; one proxied stream to the sink."""
    ms = []
    for _ in range(handshakes + 1):
        t0 = time.perf_counter()
        await go.connect(peer, addrs)
        ms.append((time.perf_counter() - t0) * 1e3)
        await go.disconnect(peer)
    await go.connect(peer, addrs)
    reader, writer = await go.open_stream(peer, PING)
    us = []
    for _ in range(min(100, pings) + pings):
        payload = os.urandom(32)
        t0 = time.perf_counter()
        writer.write(payload)
        echo = await asyncio.wait_for(reader.readexactly(32), 10)
        us.append((time.perf_counter() - t0) * 1e6)
        assert echo == payload
    writer.close()
    return ms[1:], us[min(100, pings) :], await _go_push(go, peer, size)


async def _go_push(go: Daemon, peer: PeerId, size: int) -> float:
    """MB/s of one stream p2pd opens to ``peer``'s sink, fed ``size`` bytes over its unix socket."""
    reader, writer = await go.open_stream(peer, SINK)
    block = memoryview(os.urandom(BLOCK))
    t0 = time.perf_counter()
    writer.write(size.to_bytes(8, "big"))
    for sent in range(0, size, BLOCK):
        writer.write(block[: min(BLOCK, size - sent)])
        await writer.drain()
    ack = await asyncio.wait_for(reader.readexactly(1), 60 + size / 1e6)
    elapsed = time.perf_counter() - t0
    writer.close()
    assert ack == b"k", ack
    return size / elapsed / 1e6


def bench_go(p2pd: pathlib.Path, transport: str, handshakes: int, pings: int, size: int) -> Iterator[dict[str, Any]]:
    """go -> go, go -> Lattica (the same p2pd dialing), Lattica -> go, on ``transport``."""
    listen = (LISTEN[transport],)
    with (
        tempfile.TemporaryDirectory(prefix="bench-go-") as tmp,
        daemon(p2pd, listen) as go,
        daemon(p2pd, listen) as other,
        _child([sys.executable, "-m", "lattica.bench.libp2p", "unix-sink", f"{tmp}/sink.sock"]),
        _lattica_responder(transport) as ours,
    ):

        async def run() -> tuple[tuple[Any, ...], tuple[Any, ...], list[Multiaddr], PeerId]:
            await other.serve(SINK, pathlib.Path(f"{tmp}/sink.sock"))
            other_peer, other_addrs = await other.identify()
            go_go = await _from_go(go, other_peer, other_addrs, handshakes, pings, size)
            our_peer = PeerId.from_string(ours.hello["peer_id"])
            our_addrs = [Multiaddr(a).without_peer_id() for a in ours.hello["addrs"]]
            go_ours = await _from_go(go, our_peer, our_addrs, handshakes, pings, size)
            return go_go, go_ours, other_addrs, other_peer

        go_go, go_ours, other_addrs, other_peer = asyncio.run(run())
        yield _row(transport, "go", "go", *go_go)
        yield _row(transport, "go", "lattica", *go_ours)
        addr = str(other_addrs[0].with_peer_id(other_peer))
        yield _row(transport, "lattica", "go", *from_lattica(addr, handshakes, pings, size))


# -- js-libp2p ------------------------------------------------------------------------------------


def _from_js(js: JsPeer, addr: str, handshakes: int, pings: int, size: int) -> tuple[Any, ...]:
    """js-libp2p dials ``addr``, timed by js (peer.mjs's bench op): fresh connections (``dial``
    with ``force``, closed before the next), pings of 32 bytes on one /ipfs/ping/1.0.0 stream, one
    stream to the sink."""
    ms = js.call("bench", what="handshake", addr=addr, count=handshakes + 1, timeout=60 + handshakes)["ms"]
    js.call("bench", what="ping", addr=addr, count=min(100, pings), timeout=60)  # warm-up
    us = js.call("bench", what="ping", addr=addr, count=pings, timeout=60 + pings / 100)["us"]
    seconds = js.call("bench", what="sink", addr=addr, size=size, timeout=120 + size / 1e6)["seconds"]
    return ms[1:], us, size / seconds / 1e6


def bench_js(root: pathlib.Path, transport: str, handshakes: int, pings: int, size: int) -> Iterator[dict[str, Any]]:
    """js -> js, js -> Lattica (the same js node dialing), Lattica -> js, on ``transport``."""
    with _js_pair(root) as (js, other), _lattica_responder(transport) as ours:
        yield _row(transport, "js", "js", *_from_js(js, other.addr(transport), handshakes, pings, size))
        yield _row(
            transport, "js", "lattica", *_from_js(js, _on(ours.hello["addrs"], transport), handshakes, pings, size)
        )
        yield _row(transport, "lattica", "js", *from_lattica(other.addr(transport), handshakes, pings, size))


@contextlib.contextmanager
def _js_pair(root: pathlib.Path) -> Iterator[tuple[JsPeer, JsPeer]]:
    """Two js-libp2p nodes: the initiator and the js responder."""
    js = JsPeer(root)
    try:
        other = JsPeer(root)
        try:
            yield js, other
        finally:
            other.close()
    finally:
        js.close()


# -- rust-libp2p ----------------------------------------------------------------------------------


def _from_rust(sdk_python: pathlib.Path, addr: str, handshakes: int, size: int) -> tuple[Any, ...]:
    """Fresh SDK nodes bootstrapping to ``addr``: build() returning to the peer connected (polled
    every 0.2 ms), and rust-libp2p's first ping on each connection; then one more calls
    ``Echo.sink`` there with ``size`` bytes through its Python API, timed by it (the SDK opens no
    raw streams: its RPC is what moves bytes)."""
    got = _sdk(sdk_python, "bench", addr, str(handshakes + 1), timeout=60 + handshakes)
    sunk = _sdk(sdk_python, "sink", addr, str(size), timeout=120 + size / 1e6)
    return got["connect_ms"][1:], [r * 1e3 for r in got["rtt_ms"][1:]], size / sunk["seconds"] / 1e6


def bench_rust(
    sdk_python: pathlib.Path, transport: str, handshakes: int, pings: int, size: int
) -> Iterator[dict[str, Any]]:
    """rust -> rust, rust -> Lattica (the same SDK dialing), Lattica -> rust, on ``transport``;
    throughput is one ``Echo.sink`` call on the SDK's RPC (the SDK node serves it, and so does
    our responder, through lattica.sdk)."""
    with sdk_responder(sdk_python) as other, _lattica_responder(transport) as ours:
        theirs = _on(other.hello["addrs"], transport)
        yield _row(transport, "rust", "rust", *_from_rust(sdk_python, theirs, handshakes, size))
        yield _row(
            transport,
            "rust",
            "lattica",
            *_from_rust(sdk_python, _on(ours.hello["addrs"], transport), handshakes, size),
        )
        yield _row(transport, "lattica", "rust", *from_lattica(theirs, handshakes, pings, size, push=_rpc_push))


# -- the bench ------------------------------------------------------------------------------------


def find_peers(peers: pathlib.Path, implementations: tuple[str, ...] = IMPLEMENTATIONS) -> dict[str, pathlib.Path]:
    """Each implementation's installed peer under ``peers`` (``make interop-peers``'s .interop):
    the SDK's interpreter, p2pd, the js folder. Raises FileNotFoundError saying what installs
    the missing ones."""
    where = {"rust": _peers.find_sdk_python, "go": _peers.find_p2pd, "js": _peers.find_js}
    found: dict[str, pathlib.Path] = {}
    missing = []
    for impl in implementations:
        try:
            found[impl] = where[impl](peers.resolve())
        except FileNotFoundError as e:
            missing.append(str(e))
    if missing:
        raise FileNotFoundError("\n".join(missing))
    return found


def bench_libp2p(
    found: dict[str, pathlib.Path],
    transports: list[str],
    handshakes: int = 30,
    pings: int = 1000,
    size: int = 64 << 20,
    progress: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Every pair's row, per transport: Lattica -> Lattica (our own stack), then for each
    implementation X in ``found`` (find_peers): X -> X, X -> Lattica, Lattica -> X."""
    runs = {"rust": bench_rust, "go": bench_go, "js": bench_js}
    for t in transports:
        if progress:
            progress(f"{t}: lattica -> lattica")
        with _lattica_responder(t) as ours:
            yield _row(t, "lattica", "lattica", *from_lattica(_on(ours.hello["addrs"], t), handshakes, pings, size))
        for impl, where in found.items():
            if progress:
                progress(f"{t}: {impl} -> {impl}, {impl} -> lattica, lattica -> {impl}")
            yield from runs[impl](where, t, handshakes, pings, size)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        _serve(sys.argv[2])
    elif sys.argv[1] == "unix-sink":
        _unix_sink(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}")
