"""A node in its own process for the path-change tests (tests/integration/test_path_changes.py),
usually in the far namespace of an emulated link. It holds an ``OrderLog`` named ``log``.

    python path_peer.py --listen ADDR [--listen ADDR] [--key FILE] [--relay ADDR] [--idle-timeout S]

Prints one JSON line ``{"peer_id", "addrs"}`` once listening, then takes commands on stdin, one
per line, and answers each with one JSON line: ``connect ADDR`` (dial it; answered at once, the
dial goes on in the background: ``{"ok": true}``), ``redial ADDR/p2p/ID`` (a new connection to
it beside any we have, answered once up), ``conns`` (its connections to peers: transport,
direction, going away). Ends when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

import lattica
import path_actors
from lattica._identity import KeyPair
from lattica.config import NatConfig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", action="append", default=[])
    p.add_argument("--key", default=None)
    p.add_argument("--relay", default=None, help="be private, reachable through this relay")
    p.add_argument("--idle-timeout", type=float, default=300.0)
    a = p.parse_args()
    extra: dict = {}
    if a.relay:
        extra = {"relays": [a.relay], "nat": NatConfig(reachability="private")}
    node = lattica.Node(
        a.listen,
        keypair=KeyPair.load_or_create(a.key) if a.key else None,
        membership=False,
        mdns=False,
        idle_timeout=a.idle_timeout,
        channel_idle=min(60.0, a.idle_timeout),
        **extra,
    )
    node.start()
    if a.relay:
        while not node.nat_status().relays:
            threading.Event().wait(0.02)

    async def spawn() -> None:
        await path_actors.OrderLog.options(name="log").remote().report.remote()

    node.run(spawn(), timeout=30)
    addrs = [str(x) for x in node.addrs] or [f"{r}/p2p/{node.peer_id}" for r in node.nat_status().relays]
    print(json.dumps({"peer_id": str(node.peer_id), "addrs": addrs}), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "connect":
            threading.Thread(target=lambda: _quietly(node.connect, arg), daemon=True).start()
            out: dict = {"ok": True}
        elif cmd == "redial":  # a fresh connection beside the one we have (as after an address change)

            async def redial(h, addr=arg):
                peer = lattica.Multiaddr(addr).peer_id
                await h.dial_addrs(peer, [lattica.Multiaddr(addr).without_peer_id()])

            node.run(redial(node.host), timeout=30)
            out = {"ok": True}
        elif cmd == "conns":

            async def conns(h):
                return [
                    {"transport": c.transport, "direction": c.direction, "going_away": c.going_away}
                    for c in h.all_conns
                ]

            out = {"conns": node.run(conns(node.host))}
        else:
            out = {"error": f"unknown command {cmd!r}"}
        print(json.dumps(out), flush=True)
    node.stop()


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except lattica.errors.LatticaError as e:
        print(f"connect failed: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
