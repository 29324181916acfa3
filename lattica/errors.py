"""Exception types a user can catch.

Every failure that crosses the public API is one of these; each carries a message that says what
went wrong in plain words. Protocol code raises them too, so the node can tell a misbehaving peer
(close that connection, log the reason) from a bug of ours.
"""

from __future__ import annotations


class LatticaError(Exception):
    """Base class of every error raised by Lattica."""


# -- local input -------------------------------------------------------------------------------


class MultiaddrError(LatticaError, ValueError):
    """A multiaddr string or byte form could not be parsed or is not supported."""


class KeyFileError(LatticaError, ValueError):
    """A key file or encoded key is malformed or of an unsupported type."""


class InvalidPeerId(LatticaError, ValueError):
    """A PeerId string or multihash is malformed."""


# -- bytes from the network ------------------------------------------------------------------


class ProtocolError(LatticaError):
    """A peer sent bytes that break the wire protocol (malformed or out-of-order frames)."""


class CodecError(ProtocolError, ValueError):
    """An encoded message is malformed, too large, too deep or contains a forbidden type."""


class FrameTooLarge(ProtocolError):
    """A frame or message exceeds a hard size limit."""


class HandshakeError(ProtocolError):
    """The secure-channel handshake failed: bad message, bad signature, or decryption failure."""


class PeerIdMismatch(HandshakeError):
    """The remote peer authenticated as a different PeerId than the one we dialed."""


class DecryptError(ProtocolError):
    """A sealed transport frame failed authentication (tampered, replayed or reordered)."""


# -- connections and streams -------------------------------------------------------------------


class TransportError(LatticaError):
    """A transport-level failure (socket error, connection lost)."""


class ConnectionClosed(TransportError):
    """The connection was closed (by either side) while it was being used."""


class StreamReset(TransportError):
    """The stream was reset by the peer or locally; buffered data is discarded."""


class StreamClosed(TransportError):
    """Writing to a stream whose write side is already closed."""


class StreamLimit(TransportError):
    """Opening a stream would exceed the per-connection stream limit."""


class ConnectionLimit(TransportError):
    """The node already holds its maximum number of connections."""


class PeerUnreachable(TransportError):
    """No address of the peer could be dialed (every attempt failed or timed out)."""


class UnsupportedProtocol(LatticaError):
    """The peer does not speak the requested stream protocol."""


class NodeClosed(LatticaError):
    """The node is not running (never started, or already stopped)."""


class Timeout(LatticaError, TimeoutError):
    """An operation did not finish before its deadline."""
