"""A node run as its own process, for local meshes: the demo, the benchmarks, the tests.

``python -m lattica.mesh.process --listen ADDR [--listen ADDR ...]`` prints one JSON line
``{"peer_id": ..., "addrs": [...], "pid": ...}`` once listening, then serves until stdin closes.
``cli_node`` runs the CLI's own ``lattica node`` instead, as a user would. Protocols:
``/lattica/bench/sink/1`` (read to EOF, reply with byte count and sha256) and
``/lattica/bench/echo/1`` (echo until EOF).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any

from lattica._loop import DEFAULT_BUSY_POLL_US
from lattica._node import Node
from lattica.config import DhtConfig, NatConfig, RelayConfig
from lattica.dht._records import StoreLimits
from lattica.logging import configure
from lattica.transports.base import Connection, Stream

SINK = "/lattica/bench/sink/1"
ECHO = "/lattica/bench/echo/1"


async def serve_sink(stream: Stream, conn: Connection, digest: bool = True) -> None:
    """Count (and hash) everything until EOF, then answer ``{bytes}:{sha256 hex}``."""
    h = hashlib.sha256() if digest else None
    n = 0
    while True:
        data = await stream.read(1 << 20)
        if not data:
            break
        n += len(data)
        if h is not None:
            h.update(data)
    stream.write(f"{n}:{h.hexdigest() if h else ''}".encode())
    await stream.close()


async def serve_echo(stream: Stream, conn: Connection) -> None:
    while True:
        data = await stream.read(1 << 20)
        if not data:
            break
        stream.write(data)
        await stream.drain()
    await stream.close()


_CLI = "import sys; from lattica.cli import main; main(sys.argv[1:])"


def cli_node(
    *flags: str, cwd: str | os.PathLike[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """A plain ``lattica node`` (the CLI as a user runs it, without mDNS) listening on loopback
    TCP, in ``cwd``: the process (its output on its stdout pipe) and its address (``.../p2p/<id>``)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, "node", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-mdns", *flags],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("listening: "):
            return proc, line.split(": ", 1)[1].strip()
    raise RuntimeError(f"lattica node exited with {proc.wait()}")


class ServerProcess:
    """Run this module in a child process; ``with ServerProcess([...]) as srv: srv.addrs``."""

    def __init__(
        self, listen: list[str], *extra: str, env: dict[str, str] | None = None, wrap: list[str] | None = None
    ) -> None:
        """``wrap``: an argv prefix the child runs under (``ip netns exec NS``: a benchmark's far
        side, lattica.bench.linkem)."""
        self._env = env  # the child's environment (default: this process's)
        args = [*(wrap or ()), sys.executable, "-m", "lattica.mesh.process"]
        for a in listen:
            args += ["--listen", a]
        self._args = args + list(extra)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            self._args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self._env
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            self.proc.kill()
            raise RuntimeError(f"node process exited with code {self.proc.wait()} before listening")
        info = json.loads(line)
        self.peer_id: str = info["peer_id"]
        self.addrs: list[str] = info["addrs"]
        self.pid: int = info["pid"]
        self.dashboard: str | None = info.get("dashboard")  # its dashboard's address, when it serves one
        return self

    def addr(self, transport: str) -> str:
        """The first listen address of ``transport`` ("tcp" or "quic")."""
        for a in self.addrs:
            if ("/quic-v1" in a) == (transport == "quic"):
                return a
        raise LookupError(f"server has no {transport} address: {self.addrs}")

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lattica.mesh.process")
    p.add_argument("--listen", action="append", default=[])
    p.add_argument("--no-digest", action="store_true", help="sink counts bytes without hashing them")
    p.add_argument("--key", default=None, help="key file (created if absent)")
    p.add_argument("--allow", action="append", default=[], help="class-path pattern peers may spawn (repeatable)")
    p.add_argument("--busy-poll-us", type=float, default=DEFAULT_BUSY_POLL_US, help="node loop busy-poll window")
    p.add_argument("--dht-rate", type=float, default=None, help="DHT stores per second accepted from one peer")
    p.add_argument("--relay", action="store_true", help="relay circuits for private peers")
    p.add_argument("--relay-in-stream", action="store_true", help="relay circuits, never on spliced sockets")
    p.add_argument("--resources", default=None, help='what this node offers placement, as JSON: {"cpu": 4}')
    p.add_argument(
        "--log",
        default=os.environ.get("LATTICA_SERVER_LOG"),
        help="log level on stderr (default: $LATTICA_SERVER_LOG, else off)",
    )
    p.add_argument("--connect", action="append", default=[], help="a peer to connect to once started (repeatable)")
    p.add_argument("--private-via", default=None, help="listen nowhere; be reachable through this relay only")
    p.add_argument(
        "--dashboard", default=None, help="serve the dashboard at HOST:PORT (its address is in the JSON line)"
    )
    args = p.parse_args(argv)
    if args.log:
        configure(args.log)
    dht = None
    if args.dht_rate is not None:
        dht = DhtConfig(limits=StoreLimits(rate=args.dht_rate, burst=2 * args.dht_rate))
    private: dict[str, Any] = {}
    if args.private_via:
        private = {"relays": [args.private_via], "nat": NatConfig(reachability="private")}
    listen = [] if args.private_via else (args.listen or ["/ip4/127.0.0.1/tcp/0"])
    relay: Any = args.relay
    if args.relay_in_stream:
        relay = RelayConfig(splice=False)
    node = Node(
        listen,
        key_path=args.key,
        busy_poll_us=args.busy_poll_us,
        allow=["lattica.bench.*", "lattica.mesh.*", *args.allow],
        dht=dht,
        relay=relay,
        resources=json.loads(args.resources) if args.resources else None,
        dashboard=args.dashboard,
        **private,
    )
    node.start()
    if args.private_via:
        deadline = time.monotonic() + 30
        while not node.nat_status().relays and time.monotonic() < deadline:
            time.sleep(0.02)
    for addr in args.connect:
        node.connect(addr)
    digest = not args.no_digest
    node.set_stream_handler(SINK, lambda s, c: serve_sink(s, c, digest))
    node.set_stream_handler(ECHO, serve_echo)
    addrs = [str(a) for a in node.addrs] or [f"{r}/p2p/{node.peer_id}" for r in node.nat_status().relays]
    print(
        json.dumps({"peer_id": str(node.peer_id), "addrs": addrs, "pid": os.getpid(), "dashboard": node.dashboard_url}),
        flush=True,
    )
    try:
        sys.stdin.read()  # serve until the parent closes our stdin
    finally:
        node.stop()


if __name__ == "__main__":
    main()
