"""Two nodes in one process: connect by multiaddr, identify, ping. Run: python examples/hello.py"""

import lattica

with (
    lattica.Node(listen=["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"]) as a,
    lattica.Node(listen=["/ip4/127.0.0.1/tcp/0"]) as b,
):
    peer = b.connect(a.addrs[0])  # multiaddr ending in /p2p/<PeerId>
    print(peer.peer_id, peer.transport, f"{b.ping(peer.peer_id) * 1e6:.0f} µs")
