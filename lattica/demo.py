"""``make demo``: two nodes in two processes find each other, say who they are, and ping.

The first node runs in a child process listening on TCP and QUIC; the second dials it on each
transport, prints what identify told it and how the connection was made, then measures RTT.
"""

from __future__ import annotations

from .bench.server import ServerProcess
from .node import Node


def run() -> None:
    print("starting node A (child process) on TCP and QUIC ...")
    with ServerProcess(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"]) as a:
        print(f"  A is {a.peer_id}")
        for addr in a.addrs:
            print(f"  A listens on {addr}")
        for transport in ("tcp", "quic"):
            with Node([]) as b:
                print(f"\nnode B {b.peer_id} dials A over {transport.upper()}")
                info = b.connect(a.addr(transport))
                print(f"  authenticated peer : {info.peer_id}  (matches A: {str(info.peer_id) == a.peer_id})")
                print(f"  connection         : {info.transport}, {info.direction}, to {info.remote_addr}")
                print(f"  A runs             : {info.agent_version} ({info.protocol_version})")
                print(f"  A serves           : {', '.join(info.protocols)}")
                print(f"  A sees B at        : {info.observed_addr}")
                rtts = sorted(b.ping_many(info.peer_id, 1000))
                print(f"  ping RTT           : p50 {rtts[500] * 1e6:.0f} µs, p99 {rtts[990] * 1e6:.0f} µs over 1000 pings")
    print("\ndone.")


if __name__ == "__main__":
    run()
