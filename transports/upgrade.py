"""libp2p's connection upgrade as a sans-IO object: ``/noise`` chosen by multistream-select, the
Noise XX handshake (ChaChaPoly), then ``/yamux/1.0.0`` chosen inside the handshake or, when the
peer offers no muxer there, by multistream-select over the new session.

Any byte pipe a libp2p peer is met on is upgraded the same way: an accepted or dialed TCP socket,
or a relayed circuit (circuit relay v2 hands over a raw stream). Feed received bytes to
:meth:`Libp2pUpgrade.receive_data`, send :meth:`data_to_send`, and read events:

- :class:`Up` — the peer is authenticated and the session may carry mux frames: make the
  connection. A dialer proposes the muxer lazily, its first frames right behind the proposal, so
  it is up one round trip sooner; a listener is up once it has agreed.
- :class:`MuxData` — the muxer is agreed; the bytes that came behind are the connection's. After
  it the upgrade is :attr:`done` and every further byte goes straight to the connection.

A peer that breaks the protocol raises :class:`HandshakeError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from lattica._identity import KeyPair, PeerId
from lattica.errors import HandshakeError, LatticaError, ProtocolError
from lattica.transports import multistream
from lattica.transports.noise import LIBP2P_PROTOCOL_NAME, NoiseHandshake

__all__ = ["SECURITY", "YAMUX", "Libp2pUpgrade", "MuxData", "Up"]

SECURITY = "/noise"  # the security protocol we speak with libp2p peers
YAMUX = "/yamux/1.0.0"


@dataclass(frozen=True)
class Up:
    """The handshake is done: ``handshake.session`` seals mux frames to ``handshake.remote_peer``."""

    handshake: NoiseHandshake


@dataclass(frozen=True)
class MuxData:
    """The muxer is agreed: ``plain`` was opened already, ``cipher`` not yet (either may be empty)."""

    plain: bytes = b""
    cipher: bytes = b""


Event = Up | MuxData


class Libp2pUpgrade:
    """One side of a libp2p connection upgrade (see the module's docstring)."""

    def __init__(
        self,
        keypair: KeyPair,
        initiator: bool,
        expected: PeerId | None = None,
        *,
        early_data: Callable[[], bytes | None] | None = None,
    ) -> None:
        self.initiator = initiator
        self._select: multistream.Dialer | multistream.Listener | None
        if initiator:
            self._select = multistream.Dialer([SECURITY])
        else:
            self._select = multistream.Listener(lambda p: p == SECURITY, lambda: (SECURITY,))
        self.handshake = NoiseHandshake(
            keypair, initiator, expected, early_data=early_data, protocol_name=LIBP2P_PROTOCOL_NAME, muxers=(YAMUX,)
        )
        self._muxer: multistream.Dialer | multistream.Listener | None = None
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self.done = False  # the muxer is agreed: nothing more to upgrade
        self.heard_a_message = False  # a whole handshake message came (not just a few bytes)

    @property
    def selecting_security(self) -> bool:
        """Still choosing ``/noise`` (no Noise message has come yet)."""
        return self._select is not None

    def start(self) -> None:
        """Queue the opening bytes: a dialer's ``/noise`` proposal and first handshake message
        together (a listener takes data behind a proposal, so it costs no round trip)."""
        if self._select is not None:
            self._out += self._select.data_to_send()
        self._out += self.handshake.start()

    def data_to_send(self) -> bytes:
        out, self._out = bytes(self._out), bytearray()
        return out

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes from the peer; raises HandshakeError when they break the protocol."""
        if self.done:
            raise HandshakeError("the upgrade is done: the connection reads its own bytes")
        if self._select is not None:
            data = self._choose_security(data)
            if not data:
                return
        if self._muxer is not None:
            self._choose_muxer(data)
            return
        hs = self.handshake
        try:
            out = hs.receive(bytes(data))
        except LatticaError as e:
            raise e if isinstance(e, HandshakeError) else HandshakeError(str(e)) from None
        self._out += out
        if out or hs.complete:
            self.heard_a_message = True
        if hs.complete:
            self._secured(hs)

    def _choose_security(self, data: bytes | bytearray | memoryview) -> bytes:
        """Multistream-select on the raw pipe; the bytes behind an agreed ``/noise``."""
        select = self._select
        assert select is not None
        try:
            select.receive(bytes(data))
        except ProtocolError as e:
            raise HandshakeError(f"libp2p peer's multistream-select: {e}") from None
        self._out += select.data_to_send()
        event = select.next_event()
        if event is None:
            return b""
        if not isinstance(event, multistream.Agreed):
            raise HandshakeError(f"the libp2p peer does not speak {SECURITY}")
        self._select = None
        return event.data

    def _secured(self, hs: NoiseHandshake) -> None:
        session, leftover = hs.session, hs.leftover
        assert session is not None
        if hs.muxer is not None:  # chosen inside the handshake
            self.done = True
            self._events.extend((Up(hs), MuxData(cipher=leftover)))
            return
        if self.initiator:
            self._muxer = multistream.Dialer([YAMUX])
            self._out += session.seal(self._muxer.data_to_send())
            self._events.append(Up(hs))
        else:
            self._muxer = multistream.Listener(lambda p: p == YAMUX, lambda: (YAMUX,))
        if leftover:
            self._choose_muxer(leftover)

    def _choose_muxer(self, data: bytes | bytearray | memoryview) -> None:
        """Multistream-select of the muxer inside the Noise session."""
        select, session = self._muxer, self.handshake.session
        assert select is not None and session is not None
        try:
            plain = session.open(data)
            if plain is None:
                return
            select.receive(bytes(plain))
        except LatticaError as e:
            raise HandshakeError(f"libp2p peer's muxer negotiation: {e}") from None
        out = select.data_to_send()
        if out:
            self._out += session.seal(out)
        event = select.next_event()
        if event is None:
            return
        if not isinstance(event, multistream.Agreed):
            raise HandshakeError(f"the libp2p peer does not speak {YAMUX}")
        self._muxer = None
        self.done = True
        if not self.initiator:
            self._events.append(Up(self.handshake))
        self._events.append(MuxData(plain=event.data))
