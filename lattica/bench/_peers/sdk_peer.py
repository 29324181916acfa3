"""A rust-libp2p peer for the interop tests and ``lattica bench libp2p``: the GradientHQ Lattica
SDK (rust-libp2p 0.54), run as a script by the SDK's own interpreter (a venv of its own: its
package is also named ``lattica``; never imported by ours).

``sdk_peer.py dial <multiaddr>``: start an SDK node on 127.0.0.1 that dials the address as its
bootstrap peer, wait until it has identified that peer and measured a ping, print one JSON line
(its PeerId, what identify told it, the ping's round trip) and stop.

``sdk_peer.py listen``: start an SDK node on 127.0.0.1, print one JSON line (its PeerId and
addresses), and on each line read from stdin (a PeerId) print what it knows of that peer; stop at
the end of stdin.

``sdk_peer.py serve``: start an SDK node on 127.0.0.1 serving the ``Echo`` service on its RPC
(``/rpc/req-resp/1.0.0``, see lattica/bench/_peers/sdk_rpc.py): ``Echo.echo`` answers with the
request's bytes, ``Echo.sink`` with one byte. Print one JSON line (its PeerId and addresses), serve
until stdin ends, then print one JSON line with the size and sha256 of each request it echoed.

``sdk_peer.py bench <multiaddr> <count>``: ``count`` times, a fresh SDK node dials the address as
its bootstrap peer; print one JSON line with, for each, the milliseconds from ``build()`` returning
until the peer is among its connected peers, and the round trip of the first ping rust-libp2p's
ping behaviour measured on that connection (the SDK exposes no dial-and-wait, no ping on demand
and no raw streams: these are what it lets one time).

``sdk_peer.py sink <multiaddr> <size>``: a fresh SDK node dials the address as its bootstrap peer
and, through its Python API (``Echo(node).get_stub(peer).sink``), calls ``Echo.sink`` there once
with one byte (unmeasured) and once with ``size`` random bytes; print one JSON line with the
seconds of the second call, from the stub's call to its answer.

The RPC's data is typed with ``Raw``, a class holding bytes as they are: the SDK treats any class
with ``SerializeToString``/``ParseFromString`` as protobuf and hands it the bytes, so nothing is
pickled on either side (and nobody unpickles)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
from typing import Any

# the SDK's lattica (this script runs under the SDK's interpreter), not ours: looked up by name
sdk: Any = importlib.import_module("lattica")

LISTEN = ["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"]
echoed: list[dict] = []  # what Echo.echo answered, for serve's last line


class Raw:
    """Raw bytes passed for a protobuf message: the SDK's ``is_protobuf_class`` only asks for
    these two methods, and then neither pickles nor unpickles."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        return self.data

    def ParseFromString(self, data: bytes) -> None:  # noqa: N802 (protobuf's name)
        self.data = bytes(data)


class Echo(sdk.ConnectionHandler):
    """The service ``serve`` offers on ``/rpc/req-resp/1.0.0`` (and ``sink`` calls)."""

    @sdk.rpc_method
    def echo(self, request: Raw) -> Raw:
        """The request's bytes back; their size and sha256 kept for serve's report."""
        _raw(request)
        echoed.append({"size": len(request.data), "sha256": hashlib.sha256(request.data).hexdigest()})
        return request

    @sdk.rpc_method
    def sink(self, request: Raw) -> Raw:
        """One byte back, whatever came (the throughput bench's responder)."""
        _raw(request)
        return Raw(b"k")


def _raw(request: object) -> None:
    """Refuse a request the SDK did not hand over as raw bytes (it fell back to unpickling)."""
    if not isinstance(request, Raw):
        raise TypeError(f"expected raw bytes, got {type(request).__name__}")


def _node(listen: list[str], bootstraps: list[str] | None = None) -> Any:
    """An SDK node on ``listen``, dialing ``bootstraps``; no mDNS, UPnP or AutoNAT."""
    builder = sdk.Lattica.builder().with_listen_addrs(listen)
    if bootstraps:
        builder = builder.with_bootstraps(bootstraps)
    return builder.with_mdns(False).with_upnp(False).with_autonat(False).build()


def _known(info) -> dict:
    return {
        "agent_version": info.agent_version,
        "protocol_version": info.protocol_version,
        "listen_addrs": list(info.listen_addresses),
        "protocols": list(info.protocols),
    }


def _listening_ports(proto: str = "tcp") -> list[int]:
    """The TCP ports this process listens on, or its UDP sockets' (the SDK does not tell its
    listen addresses)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    with open(f"/proc/self/net/{proto}") as f:
        next(f)
        for line in f:
            parts = line.split()
            ip, port = parts[1].split(":")
            # (listening: TCP's LISTEN state; a UDP socket bound to 127.0.0.1, where we listen)
            if (parts[3] == "0A" or (proto == "udp" and ip == "0100007F")) and parts[9] in inodes:
                ports.append(int(port, 16))
    return ports


def _hello(node: Any) -> None:
    """Once the node listens on TCP and QUIC, print its PeerId and addresses as one JSON line."""
    deadline = time.time() + 10
    while not ((tcp := _listening_ports()) and (udp := _listening_ports("udp"))) and time.time() < deadline:
        time.sleep(0.02)
    addrs = [f"/ip4/127.0.0.1/tcp/{p}/p2p/{node.peer_id()}" for p in tcp]
    addrs += [f"/ip4/127.0.0.1/udp/{p}/quic-v1/p2p/{node.peer_id()}" for p in udp]
    print(json.dumps({"peer_id": node.peer_id(), "addrs": addrs}), flush=True)


def listen() -> None:
    node = _node(LISTEN)
    _hello(node)
    for line in sys.stdin:
        peer = line.strip()
        info = node.get_peer_info(peer)
        print(
            json.dumps({"identify": _known(info) if info else None, "rtt_ms": info.rtt_ms if info else None}),
            flush=True,
        )
    node.close()


def serve() -> None:
    node = _node(LISTEN)
    Echo(node)
    _hello(node)
    sys.stdin.read()
    print(json.dumps({"echoed": echoed}), flush=True)
    node.close()


def dial(addr: str, wait: float = 15.0) -> dict:
    peer = addr.rsplit("/p2p/", 1)[1]
    node = _node(LISTEN, [addr])
    out: dict = {"peer_id": node.peer_id()}
    deadline = time.time() + wait
    info = None
    rtt = None
    while time.time() < deadline:
        info = node.get_peer_info(peer)
        try:
            rtt = node.get_peer_rtt(peer)  # (seconds, once a ping came back)
        except RuntimeError:
            rtt = None
        if info is not None and info.protocols and rtt:
            break
        time.sleep(0.05)
    if info is not None:
        out["identify"] = _known(info)
        out["rtt_ms"] = rtt * 1e3 if rtt else None
    out["peers"] = node.get_all_peers()
    node.close()
    return out


def bench(addr: str, count: int) -> dict:
    peer = addr.rsplit("/p2p/", 1)[1]
    connect_ms: list[float] = []
    rtt_ms: list[float] = []
    for _ in range(count):
        node = _node(LISTEN[:1], [addr])
        t0 = time.perf_counter()
        deadline = t0 + 10
        while peer not in node.get_all_peers() and time.perf_counter() < deadline:
            time.sleep(0.0002)
        connect_ms.append((time.perf_counter() - t0) * 1e3)
        rtt = None
        while not rtt and time.perf_counter() < deadline:
            try:
                rtt = node.get_peer_rtt(peer)  # (seconds, once a ping came back)
            except RuntimeError:
                time.sleep(0.0002)
        if rtt:
            rtt_ms.append(rtt * 1e3)
        node.close()
    return {"connect_ms": connect_ms, "rtt_ms": rtt_ms}


def sink(addr: str, size: int) -> dict:
    peer = addr.rsplit("/p2p/", 1)[1]
    node = _node(LISTEN[:1], [addr])
    deadline = time.perf_counter() + 10
    while peer not in node.get_all_peers() and time.perf_counter() < deadline:
        time.sleep(0.001)
    stub = Echo(node).get_stub(peer)
    payload = Raw(os.urandom(size))
    stub.sink(Raw(b"w")).result(timeout=60)  # warm-up: the stub's first call
    t0 = time.perf_counter()
    answer = stub.sink(payload).result(timeout=180)
    seconds = time.perf_counter() - t0
    node.close()
    if not isinstance(answer, Raw) or answer.data != b"k":
        raise RuntimeError(f"Echo.sink answered {answer!r}")
    return {"seconds": seconds, "size": size}


if __name__ == "__main__":
    if sys.argv[1] == "bench":
        print(json.dumps(bench(sys.argv[2], int(sys.argv[3]))), flush=True)
    elif sys.argv[1] == "sink":
        print(json.dumps(sink(sys.argv[2], int(sys.argv[3]))), flush=True)
    elif sys.argv[1] == "dial":
        print(json.dumps(dial(sys.argv[2])), flush=True)
    elif sys.argv[1] == "listen":
        listen()
    elif sys.argv[1] == "serve":
        serve()
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}")
