"""A rust-libp2p peer for the interop tests and ``lattica bench libp2p``: the GradientHQ Lattica
SDK (rust-libp2p 0.54), run as a script by the SDK's own interpreter (a venv of its own: its
package is also named ``lattica``; never imported by ours).

``sdk_peer.py dial <multiaddr>``: start an SDK node on 127.0.0.1 that dials the address as its
bootstrap peer, wait until it has identified that peer and measured a ping, print one JSON line
(its PeerId, what identify told it, the ping's round trip) and stop.

``sdk_peer.py listen``: start an SDK node on 127.0.0.1, print one JSON line (its PeerId and
addresses), and on each line read from stdin (a PeerId) print what it knows of that peer; stop at
the end of stdin.

``sdk_peer.py bench <multiaddr> <count>``: ``count`` times, a fresh SDK node dials the address as
its bootstrap peer; print one JSON line with, for each, the milliseconds from ``build()`` returning
until the peer is among its connected peers, and the round trip of the first ping rust-libp2p's
ping behaviour measured on that connection (the SDK exposes no dial-and-wait, no ping on demand
and no raw streams: these are what it lets one time)."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any

# the SDK's lattica (this script runs under the SDK's interpreter), not ours: looked up by name
Lattica: Any = importlib.import_module("lattica").Lattica


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


def listen() -> None:
    listen = ["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"]
    node = Lattica.builder().with_listen_addrs(listen).with_mdns(False).with_upnp(False)
    node = node.with_autonat(False).build()
    deadline = time.time() + 10
    while not ((tcp := _listening_ports()) and (udp := _listening_ports("udp"))) and time.time() < deadline:
        time.sleep(0.02)
    addrs = [f"/ip4/127.0.0.1/tcp/{p}/p2p/{node.peer_id()}" for p in tcp]
    addrs += [f"/ip4/127.0.0.1/udp/{p}/quic-v1/p2p/{node.peer_id()}" for p in udp]
    print(json.dumps({"peer_id": node.peer_id(), "addrs": addrs}), flush=True)
    for line in sys.stdin:
        peer = line.strip()
        info = node.get_peer_info(peer)
        print(
            json.dumps({"identify": _known(info) if info else None, "rtt_ms": info.rtt_ms if info else None}),
            flush=True,
        )
    node.close()


def dial(addr: str, wait: float = 15.0) -> dict:
    peer = addr.rsplit("/p2p/", 1)[1]
    node = (
        Lattica.builder()
        .with_listen_addrs(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"])
        .with_bootstraps([addr])
        .with_mdns(False)
        .with_upnp(False)
        .with_autonat(False)
        .build()
    )
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
        node = (
            Lattica.builder()
            .with_listen_addrs(["/ip4/127.0.0.1/tcp/0"])
            .with_bootstraps([addr])
            .with_mdns(False)
            .with_upnp(False)
            .with_autonat(False)
            .build()
        )
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


if __name__ == "__main__":
    if sys.argv[1] == "bench":
        print(json.dumps(bench(sys.argv[2], int(sys.argv[3]))), flush=True)
    elif sys.argv[1] == "dial":
        print(json.dumps(dial(sys.argv[2])), flush=True)
    elif sys.argv[1] == "listen":
        listen()
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}")
