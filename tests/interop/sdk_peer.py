"""A rust-libp2p peer for the interop tests: the GradientHQ Lattica SDK (rust-libp2p 0.54), run
by the SDK's own interpreter (a venv of its own: its package is also named ``lattica``).

``sdk_peer.py dial <multiaddr>``: start an SDK node on 127.0.0.1 that dials the address as its
bootstrap peer, wait until it has identified that peer and measured a ping, print one JSON line
(its PeerId, what identify told it, the ping's round trip) and stop."""

from __future__ import annotations

import json
import sys
import time

from lattica import Lattica


def dial(addr: str, wait: float = 15.0) -> dict:
    peer = addr.rsplit("/p2p/", 1)[1]
    node = (
        Lattica.builder()
        .with_listen_addrs(["/ip4/127.0.0.1/tcp/0"])
        .with_bootstraps([addr])
        .with_mdns(False)
        .with_upnp(False)
        .with_autonat(False)
        .build()
    )
    out: dict = {"peer_id": node.peer_id()}
    deadline = time.time() + wait
    info = None
    while time.time() < deadline:
        info = node.get_peer_info(peer)
        if info is not None and info.protocols and info.rtt_ms:
            break
        time.sleep(0.1)
    if info is not None:
        out["identify"] = {
            "agent_version": info.agent_version,
            "protocol_version": info.protocol_version,
            "listen_addrs": list(info.listen_addresses),
            "protocols": list(info.protocols),
        }
        out["rtt_ms"] = info.rtt_ms
    out["peers"] = node.get_all_peers()
    node.close()
    return out


if __name__ == "__main__":
    if sys.argv[1] == "dial":
        print(json.dumps(dial(sys.argv[2])), flush=True)
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}")
