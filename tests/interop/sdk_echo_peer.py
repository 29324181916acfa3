"""An SDK (rust-libp2p 0.54) node serving one RPC, ``Echo.echo``, for the 64 MiB echo test; run
as a script by the SDK venv's own interpreter (its package is also named ``lattica``; never
imported by ours).

The method's request and response are typed with ``Raw``, a class holding bytes as they are:
the SDK treats any class with ``SerializeToString``/``ParseFromString`` as protobuf and hands it
the request's bytes, so nothing is pickled on either side.

It starts on 127.0.0.1 (TCP and QUIC), prints one JSON line (its PeerId and addresses), serves
until stdin ends, then prints one JSON line with the size and sha256 of each request it echoed."""

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

seen: list[dict] = []


class Raw:
    """Raw bytes passed for a protobuf message: the SDK's ``is_protobuf_class`` only asks for
    these two methods, and then neither pickles nor unpickles."""

    def __init__(self) -> None:
        self.data = b""

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        return self.data

    def ParseFromString(self, data: bytes) -> None:  # noqa: N802 (protobuf's name)
        self.data = bytes(data)


class Echo(sdk.ConnectionHandler):
    """The service: ``Echo.echo`` on ``/rpc/req-resp/1.0.0`` answers with the request's bytes."""

    @sdk.rpc_method
    def echo(self, request: Raw) -> Raw:
        if not isinstance(request, Raw):  # (the SDK fell back to unpickling: refuse)
            raise TypeError(f"expected raw bytes, got {type(request).__name__}")
        seen.append({"size": len(request.data), "sha256": hashlib.sha256(request.data).hexdigest()})
        return request


def _listening_ports(proto: str) -> list[int]:
    """This process's listening TCP ports, or its UDP sockets bound to 127.0.0.1 (the SDK does
    not tell its listen addresses)."""
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
            if (parts[3] == "0A" or (proto == "udp" and ip == "0100007F")) and parts[9] in inodes:
                ports.append(int(port, 16))
    return ports


def main() -> None:
    node = (
        sdk.Lattica.builder()
        .with_listen_addrs(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"])
        .with_mdns(False)
        .with_upnp(False)
        .with_autonat(False)
        .build()
    )
    Echo(node)
    deadline = time.time() + 10
    while not ((tcp := _listening_ports("tcp")) and (udp := _listening_ports("udp"))) and time.time() < deadline:
        time.sleep(0.02)
    peer = node.peer_id()
    addrs = [f"/ip4/127.0.0.1/tcp/{p}/p2p/{peer}" for p in tcp]
    addrs += [f"/ip4/127.0.0.1/udp/{p}/quic-v1/p2p/{peer}" for p in udp]
    print(json.dumps({"peer_id": peer, "addrs": addrs}), flush=True)
    sys.stdin.read()
    print(json.dumps({"echoed": seen}), flush=True)
    node.close()


if __name__ == "__main__":
    main()
