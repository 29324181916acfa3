"""An SDK node (the GradientHQ Lattica SDK, rust-libp2p 0.54) behind a NAT of the NAT lab, for
tests/interop/test_sdk_nat.py: run by the SDK venv's interpreter inside a lab namespace, with its
working directory a temporary folder (the SDK leaves ``<uuid>.key`` and ``<uuid>.storage`` there).

    sdk_nat_peer.py --ip 10.1.0.2 --relay /ip4/198.51.100.10/tcp/4001/p2p/<relay> [--bootstrap ADDR ...]

It listens on ``--ip`` port 4001 (TCP and QUIC), reserves a slot on ``--relay`` (circuit relay
v2; the address ends in the relay's ``/p2p/`` id, never ``/p2p-circuit``) and punches holes with
DCUtR (``with_dcutr(True)``); no AutoNAT, mDNS or UPnP. ``--bootstrap`` addresses go to its
Kademlia, which dials them at start (a ``/p2p-circuit`` address of another peer makes the SDK
dial that peer through the relay). The relay must not also be a bootstrap: the Kademlia dial to
it races the relay client's and the reservation is dropped.

Prints ``{"event": "ready", "peer_id": ..., "addrs": [...], "circuit": [...]}`` once the
reservation shows among its visible addresses (``circuit``: the ``/p2p-circuit`` ones; an empty
list after 20 s), then answers one JSON line per command read from stdin:

* ``{"cmd": "status", "peer": P}`` -> ``{"visible": [...], "peers": [...], "addresses": [...]}``:
  its visible addresses, its address book's peers (those it had a direct connection to), and the
  remote addresses of the connections it saw to ``P`` (``/p2p-circuit`` ones were relayed)
* ``{"cmd": "connect", "peer": P}`` -> ``{"ok": true}``: dial ``P`` at the addresses the node
  knows (its Kademlia's), an error if it knows none
* ``{"cmd": "quit"}``

The SDK's tracing (``RUST_LOG``) writes to file descriptor 1, which this script points at its
stderr; the JSON lines go to a copy of the original stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

# the SDK's lattica (this script runs under the SDK's interpreter), not ours: looked up by name
sdk: Any = importlib.import_module("lattica")


def _own_stdout() -> None:
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(fd, "w", buffering=1)


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ip", required=True)
    p.add_argument("--relay", required=True)
    p.add_argument("--bootstrap", action="append", default=[])
    args = p.parse_args()
    _own_stdout()
    builder = sdk.Lattica.builder().with_listen_addrs([f"/ip4/{args.ip}/tcp/4001", f"/ip4/{args.ip}/udp/4001/quic-v1"])
    if args.bootstrap:
        builder = builder.with_bootstraps(args.bootstrap)
    node = (
        builder.with_relay_servers([args.relay])
        .with_dcutr(True)
        .with_autonat(False)
        .with_mdns(False)
        .with_upnp(False)
        .build()
    )
    raw = node._lattica_instance
    deadline = time.time() + 20
    while not (circuit := [a for a in raw.get_visible_maddrs() if "/p2p-circuit" in a]) and time.time() < deadline:
        time.sleep(0.1)
    _say({"event": "ready", "peer_id": raw.peer_id(), "addrs": list(raw.get_visible_maddrs()), "circuit": circuit})
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "status":
                peer = cmd.get("peer")
                _say(
                    {
                        "visible": list(raw.get_visible_maddrs()),
                        "peers": list(raw.get_all_peers()),
                        "addresses": list(raw.get_peer_addresses(peer)) if peer else [],
                    }
                )
            elif cmd["cmd"] == "connect":
                raw.connect(cmd["peer"])
                _say({"ok": True})
            elif cmd["cmd"] == "quit":
                break
            else:
                _say({"ok": False, "error": f"unknown command {cmd['cmd']!r}"})
        except Exception as e:  # noqa: BLE001 -- reported to the test, which decides
            _say({"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
    sys.stdout.flush()
    os._exit(0)  # (not the interpreter's shutdown: the SDK's runtime threads may linger)


if __name__ == "__main__":
    main()
