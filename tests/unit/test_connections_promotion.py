"""The connection table's choices (lattica/_host/connections.py), on fake connections: which of a
peer's connections is its primary, which one a new arrival retires (it goes away, never closes
under what is on it), and what happens when a connection goes away or its grace period ends."""

from __future__ import annotations

import asyncio

from lattica._host.connections import QUIC_LINGER, Connections
from lattica._hostview import HostEvents
from lattica._identity import KeyPair


class _Conn:
    def __init__(self, peer, transport: str, direction: str = "outbound") -> None:
        self.remote_peer, self.transport, self.direction = peer, transport, direction
        self.is_closed = False
        self.going_away = False
        self.on_going_away = None
        self.carrier = None
        self.relay_limit = None
        self.num_streams = 0
        self._close = []
        self.close_calls = 0

    def add_close_callback(self, cb) -> None:
        self._close.append(cb)

    def set_stream_handler(self, handler) -> None:
        pass

    def meter_opens(self, gate) -> bool:
        return False  # (as a transport that cannot hold a peer's bytes unread)

    def probe(self, timeout: float) -> None:
        pass

    def go_away(self) -> None:
        if not self.going_away:
            self.going_away = True
            self.on_going_away(self)

    async def close(self) -> None:
        self.close_calls += 1
        self.closed()

    def closed(self) -> None:
        self.is_closed = True
        for cb in self._close:
            cb(self)


def _add(conns: Connections, conn: _Conn) -> None:
    """Adopt ``conn`` and let its peer identify on it (as the early identify of a handshake does)."""
    conns.add(conn)  # type: ignore[arg-type]
    conns.settle(conn)  # type: ignore[arg-type]


def _table(loop, me, grace: float = 300.0):
    seen = {"away": [], "expired": []}
    conns = Connections(
        me,
        loop,
        HostEvents(),
        spawn=loop.create_task,
        serve=None,  # type: ignore[arg-type]
        going_away=seen["away"].append,
        expired=seen["expired"].append,
        grace=grace,
    )
    return conns, seen


def test_the_best_surviving_path_is_promoted():
    loop = asyncio.new_event_loop()
    try:
        me, peer = KeyPair.generate().peer_id, KeyPair.generate().peer_id
        conns, _ = _table(loop, me)
        relay, quic, tcp_a, tcp_b = (_Conn(peer, t) for t in ("relay", "quic", "tcp", "tcp"))
        for c in (tcp_a, tcp_b):  # one side dialed both: the newest is the primary
            _add(conns, c)
        assert conns.conns[peer] is tcp_b
        tcp_b.closed()
        assert conns.conns[peer] is tcp_a
        _add(conns, quic)
        assert conns.conns[peer] is tcp_a and not quic.going_away  # TCP is kept; QUIC goes away 2 s later
        loop.run_until_complete(asyncio.sleep(QUIC_LINGER + 0.1))
        assert quic.going_away
        tcp_a.closed()
        assert peer not in conns.conns  # (a connection going away is never promoted)
        _add(conns, relay)
        assert conns.conns[peer] is relay
    finally:
        loop.close()


def test_each_rule_retires_the_loser_and_keeps_it_serving():
    loop = asyncio.new_event_loop()
    try:
        me, peer = KeyPair.generate().peer_id, KeyPair.generate().peer_id
        conns, seen = _table(loop, me)
        relay = _Conn(peer, "relay")
        _add(conns, relay)
        direct = _Conn(peer, "tcp")
        direct.num_streams = 1
        _add(conns, direct)
        assert conns.conns[peer] is direct and relay.going_away and not relay.is_closed
        assert seen["away"] == [relay]  # the runtime hears of it: its call channel moves
        # both dialed at once: both ends keep the one the smaller PeerId dialed
        inbound = _Conn(peer, "tcp", "inbound")
        _add(conns, inbound)
        keep, lose = (direct, inbound) if me < peer else (inbound, direct)
        assert conns.conns[peer] is keep and lose.going_away and not lose.is_closed
        # our own dial race's late winner: retired at once (the peer may have put calls on it)
        spare = _Conn(peer, keep.transport, keep.direction)
        conns.add(spare, spare=True)  # type: ignore[arg-type]
        assert conns.conns[peer] is keep and spare.going_away
        assert conns.live_count(peer) == 1
    finally:
        loop.close()


def test_the_peer_retiring_our_primary_moves_us_to_the_best_other_one():
    loop = asyncio.new_event_loop()
    try:
        me, peer = KeyPair.generate().peer_id, KeyPair.generate().peer_id
        conns, seen = _table(loop, me)
        a, b = _Conn(peer, "tcp"), _Conn(peer, "tcp")
        _add(conns, a)
        _add(conns, b)
        assert conns.conns[peer] is b
        b.go_away()  # (the peer said go-away on it)
        assert conns.conns[peer] is a and seen["away"] == [b]
        a.go_away()
        assert peer not in conns.conns  # nothing usable: the next stream dials afresh
    finally:
        loop.close()


def test_a_connection_whose_grace_ends_with_streams_on_it_is_closed_after_the_runtime_hears():
    loop = asyncio.new_event_loop()
    try:
        me, peer = KeyPair.generate().peer_id, KeyPair.generate().peer_id
        conns, seen = _table(loop, me, grace=0.05)
        old = _Conn(peer, "relay")
        old.num_streams = 2
        _add(conns, old)
        _add(conns, _Conn(peer, "quic"))
        assert old.going_away and not old.is_closed
        loop.run_until_complete(asyncio.sleep(0.1))
        assert seen["expired"] == [old] and old.is_closed and old.close_calls == 1
    finally:
        loop.close()


def test_a_circuit_inside_a_stream_goes_away_with_the_connection_to_its_relay():
    """An in-stream relayed connection rides a stream of our connection to the relay: when that
    connection goes away, the circuit goes away too (its calls move now, instead of dying with
    the carrier when the grace period ends)."""
    loop = asyncio.new_event_loop()
    try:
        me, relay_id, peer = (KeyPair.generate().peer_id for _ in range(3))
        conns, seen = _table(loop, me)
        to_relay = _Conn(relay_id, "quic")
        _add(conns, to_relay)
        circuit = _Conn(peer, "relay")
        circuit.carrier = to_relay
        _add(conns, circuit)
        _add(conns, _Conn(relay_id, "tcp"))  # TCP to the relay: the QUIC one goes away (a moment later)
        loop.run_until_complete(asyncio.sleep(QUIC_LINGER + 0.1))
        assert to_relay.going_away and circuit.going_away
        assert seen["away"] == [to_relay, circuit] and peer not in conns.conns
    finally:
        loop.close()


def test_a_newcomer_the_peer_never_identifies_on_is_never_used():
    """An AutoNAT dial-back (the peer's fresh-port probe, which says nothing of itself) arrives
    beside a relayed primary: it must not replace it (the prober hangs up a moment later); a
    newcomer that identifies does."""
    loop = asyncio.new_event_loop()
    try:
        me, peer = KeyPair.generate().peer_id, KeyPair.generate().peer_id
        conns, _ = _table(loop, me)
        relay = _Conn(peer, "relay")
        _add(conns, relay)
        probe = _Conn(peer, "tcp", "inbound")
        conns.add(probe)  # type: ignore[arg-type]  # (no identify: unsettled)
        assert conns.conns[peer] is relay and not relay.going_away
        relay.closed()
        assert peer not in conns.conns  # (nor promoted when the primary closes)
        direct = _Conn(peer, "quic", "inbound")
        _add(conns, direct)
        assert conns.conns[peer] is direct
        conns.settle(probe)  # type: ignore[arg-type]  # (had it identified after all: weighed then, TCP wins)
        loop.run_until_complete(asyncio.sleep(QUIC_LINGER + 0.1))
        assert conns.conns[peer] is probe and direct.going_away
    finally:
        loop.close()
