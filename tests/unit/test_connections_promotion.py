"""Which of a peer's surviving connections becomes its primary when the primary closes
(lattica/host/connections.py): the best path, TCP before QUIC before a relay."""

from __future__ import annotations

import asyncio

from lattica.host.connections import Connections
from lattica.hostview import HostEvents
from lattica.identity import KeyPair


class _Conn:
    def __init__(self, peer, transport: str, direction: str = "outbound") -> None:
        self.remote_peer, self.transport, self.direction = peer, transport, direction
        self.is_closed = False
        self.num_streams = 0
        self._close = []

    def add_close_callback(self, cb) -> None:
        self._close.append(cb)

    def set_stream_handler(self, handler) -> None:
        pass

    def probe(self, timeout: float) -> None:
        pass

    def closed(self) -> None:
        self.is_closed = True
        for cb in self._close:
            cb(self)


def test_the_best_surviving_path_is_promoted():
    loop = asyncio.new_event_loop()
    try:
        me, peer = KeyPair.generate().peer_id, KeyPair.generate().peer_id
        conns = Connections(me, loop, HostEvents(), spawn=lambda c: c.close(), serve=None, path_changed=lambda p: None)  # type: ignore[arg-type]
        relay, quic, tcp_a, tcp_b = (_Conn(peer, t) for t in ("relay", "quic", "tcp", "tcp"))
        for c in (relay, quic, tcp_a, tcp_b):  # one side dialed each: the newest is the primary
            conns.add(c)  # type: ignore[arg-type]
        assert conns.conns[peer] is tcp_b
        tcp_b.closed()
        assert conns.conns[peer] is tcp_a  # not the QUIC or relayed one
        tcp_a.closed()
        assert conns.conns[peer] is quic
        quic.closed()
        assert conns.conns[peer] is relay
        relay.closed()
        assert peer not in conns.conns
    finally:
        loop.close()
