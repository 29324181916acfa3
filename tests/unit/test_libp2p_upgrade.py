"""libp2p's connection upgrade (transports/upgrade.py), sans-IO: two upgrades, or one against a
peer written out by hand from multistream-select and Noise, exchange bytes in memory."""

from __future__ import annotations

import pytest

from lattica._identity import KeyPair
from lattica.errors import HandshakeError
from lattica.transports import multistream
from lattica.transports.noise import LIBP2P_PROTOCOL_NAME, NoiseHandshake
from lattica.transports.upgrade import SECURITY, YAMUX, Libp2pUpgrade, MuxData, Up


def events(up: Libp2pUpgrade) -> list:
    out = []
    while (event := up.next_event()) is not None:
        out.append(event)
    return out


def test_two_upgrades_agree_on_yamux_inside_the_handshake() -> None:
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = Libp2pUpgrade(ka, True, kb.peer_id), Libp2pUpgrade(kb, False)
    a.start()
    b.start()
    b.receive_data(a.data_to_send())  # header, /noise and message 1
    a.receive_data(b.data_to_send())  # the echo and message 2
    b.receive_data(a.data_to_send())  # message 3
    got_a, got_b = events(a), events(b)
    assert a.done and b.done
    assert [type(e) for e in got_a] == [Up, MuxData] == [type(e) for e in got_b]
    assert got_a[0].handshake.remote_peer == kb.peer_id and got_b[0].handshake.remote_peer == ka.peer_id
    assert got_a[0].handshake.muxer == YAMUX
    # the sessions work: what a seals, b opens
    assert got_b[0].handshake.session.open(got_a[0].handshake.session.seal(b"frames")) == b"frames"


class _HandListener:
    """A libp2p listener that offers no muxer in its handshake: the muxer is chosen after it."""

    def __init__(self, key: KeyPair, *, muxer: str = YAMUX) -> None:
        self.select = multistream.Listener(lambda p: p == SECURITY)
        self.hs = NoiseHandshake(key, False, protocol_name=LIBP2P_PROTOCOL_NAME)
        self.muxer = multistream.Listener(lambda p: p == muxer)
        self.agreed: bytes | None = None

    def receive(self, data: bytes) -> bytes:
        out = b""
        if not self.select.done:
            self.select.receive(data)
            out += self.select.data_to_send()
            event = self.select.next_event()
            if event is None:
                return out
            data = event.data
        if not self.hs.complete:
            out += self.hs.receive(data)
            if not self.hs.complete:
                return out
            data = self.hs.leftover
        if data:
            session = self.hs.session
            plain = session.open(data)
            if plain:
                self.muxer.receive(bytes(plain))
                answer = self.muxer.data_to_send()
                event = self.muxer.next_event()
                if isinstance(event, multistream.Agreed):
                    self.agreed = event.data
                    answer += b"yamux frames"
                if answer:
                    out += session.seal(answer)
        return out


def test_a_dialer_is_up_before_the_listener_answers_its_lazy_muxer_proposal() -> None:
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a, b = Libp2pUpgrade(ka, True, kb.peer_id), _HandListener(kb)
    a.start()
    a.receive_data(b.receive(a.data_to_send()))  # header + /noise + msg 1 -> echo + msg 2
    third = a.data_to_send()  # msg 3 and the sealed muxer proposal
    [up] = events(a)
    assert isinstance(up, Up) and up.handshake.muxer is None and not a.done
    answer = b.receive(third)
    assert b.agreed == b""  # the proposal came whole behind the handshake
    a.receive_data(answer)
    assert events(a) == [MuxData(plain=b"yamux frames")] and a.done
    with pytest.raises(HandshakeError):
        a.receive_data(b"more")


def test_a_listener_is_up_once_it_agrees_to_the_muxer() -> None:
    ka, kb = KeyPair.generate(), KeyPair.generate()
    b = Libp2pUpgrade(kb, False)
    b.start()
    assert b.data_to_send() == b""
    dialer = multistream.Dialer([SECURITY])
    hs = NoiseHandshake(ka, True, kb.peer_id, protocol_name=LIBP2P_PROTOCOL_NAME)  # offers no muxer
    b.receive_data(dialer.data_to_send() + hs.start())
    assert b.selecting_security is False and b.heard_a_message
    reply = b.data_to_send()
    dialer.receive(reply)
    event = dialer.next_event()
    assert isinstance(event, multistream.Agreed)
    third = hs.receive(event.data)
    assert hs.complete
    b.receive_data(third)
    assert events(b) == [] and not b.done  # not up before the muxer is chosen
    proposal = multistream.Dialer([YAMUX])
    b.receive_data(hs.session.seal(proposal.data_to_send() + b"first frames"))
    [up, data] = events(b)
    assert isinstance(up, Up) and up.handshake.remote_peer == ka.peer_id
    assert data == MuxData(plain=b"first frames") and b.done
    proposal.receive(bytes(hs.session.open(b.data_to_send())))
    assert isinstance(proposal.next_event(), multistream.Agreed)


def test_a_listener_refuses_what_is_not_noise() -> None:
    b = Libp2pUpgrade(KeyPair.generate(), False)
    with pytest.raises(HandshakeError, match="multistream"):
        b.receive_data(multistream.encode("GET / HTTP/1.1"))
    b = Libp2pUpgrade(KeyPair.generate(), False)
    b.receive_data(multistream.encode(multistream.HEADER) + multistream.encode("/tls/1.0.0"))
    assert b.data_to_send().endswith(multistream.encode("na")) and events(b) == [] and b.selecting_security


def test_a_dialer_fails_when_the_listener_refuses_noise_or_yamux() -> None:
    ka, kb = KeyPair.generate(), KeyPair.generate()
    a = Libp2pUpgrade(ka, True, kb.peer_id)
    a.start()
    with pytest.raises(HandshakeError, match="/noise"):
        a.receive_data(multistream.encode(multistream.HEADER) + multistream.encode("na"))
    a, b = Libp2pUpgrade(ka, True, kb.peer_id), _HandListener(kb, muxer="/mplex/6.7.0")
    a.start()
    a.receive_data(b.receive(a.data_to_send()))
    events(a)
    with pytest.raises(HandshakeError, match=YAMUX):
        a.receive_data(b.receive(a.data_to_send()))


def test_a_handshake_from_the_wrong_peer_fails() -> None:
    ka, kb, kc = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    a, b = Libp2pUpgrade(ka, True, kc.peer_id), Libp2pUpgrade(kb, False)
    a.start()
    b.receive_data(a.data_to_send())
    with pytest.raises(HandshakeError):
        a.receive_data(b.data_to_send())
