"""Exception types a user can catch.

Every failure that crosses the public API is one of these; each carries a message that says what
went wrong in plain words. Protocol code raises them too, so the node can tell a misbehaving peer
(close that connection, log the reason) from a bug of ours.
"""

from __future__ import annotations

from typing import cast


class LatticaError(Exception):
    """Base class of every error raised by Lattica."""


# -- local input -------------------------------------------------------------------------------


class MultiaddrError(LatticaError, ValueError):
    """A multiaddr string or byte form could not be parsed or is not supported."""


class KeyFileError(LatticaError, ValueError):
    """A key file or encoded key is malformed or of an unsupported type."""


class InvalidPeerId(LatticaError, ValueError):
    """A PeerId string or multihash is malformed."""


class CertificateError(LatticaError, ValueError):
    """A mesh key or certificate that cannot be read, or one that admits another node."""


# -- bytes from the network ------------------------------------------------------------------


class ProtocolError(LatticaError):
    """A peer sent bytes that break the wire protocol (malformed or out-of-order frames)."""


class CodecError(ProtocolError, ValueError):
    """An encoded message is malformed, too large, too deep or contains a forbidden type."""


class FrameTooLarge(ProtocolError):
    """A frame or message exceeds a hard size limit."""


class MessageBudgetExceeded(ProtocolError):
    """A peer's partially received messages exceed what this node holds for it (or for everyone),
    or one did not complete in time: its call channel is reset."""


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


class ConnectionRefused(TransportError):
    """The address answered that nothing listens there (TCP RST to our SYN)."""


class PeerGone(PeerUnreachable):
    """Every address of the peer refused the connection: its process is not listening any more
    (membership takes this as proof of death, not a mere suspicion)."""


class PathChanged(PeerUnreachable):
    """The connection a call was on was replaced (a relayed path became direct, a duplicate was
    closed, ...) and the call did not finish there within the grace period. It may or may not
    have run; calls marked ``.options(idempotent=True)`` are sent again on the new path instead."""


class RelayRefused(PeerUnreachable):
    """A relay refused a circuit or a reservation (no reservation for the peer, over a limit, ...)."""


class UnsupportedProtocol(LatticaError):
    """The peer does not speak the requested stream protocol."""


class NodeClosed(LatticaError):
    """The node is not running (never started, or already stopped)."""


class Timeout(LatticaError, TimeoutError):
    """An operation did not finish before its deadline."""


# -- actors ------------------------------------------------------------------------------------


class ActorError(LatticaError):
    """Base class of errors about actors and calls to them."""


class ActorNotFound(ActorError):
    """No actor of that name lives on the target node (never existed, or already stopped)."""


class ActorDied(ActorError):
    """The actor stopped (killed, crashed in its constructor, or its node shut down) before the
    call completed."""


class ActorRestarted(ActorDied):
    """The call was in flight when its supervised actor died; the ref now follows the actor's
    next incarnation (retry the call if it is safe to run twice)."""


class CallTimeout(ActorError, Timeout):
    """The call's deadline passed before a result arrived (it is also cancelled remotely)."""


class MailboxFull(ActorError):
    """The target's mailbox has no room and the caller asked not to wait (``block=False``)."""


class CheckpointRejected(ActorError):
    """A node refused to keep a copy of a checkpoint (malformed, or over its byte limits)."""


class ShardUnavailable(ActorError):
    """No provider of a shard answered a stub's call: none registered, or every one tried failed
    (the message names the service, the shard and what each provider did)."""


class PlacementError(ActorError):
    """No node in the membership view fits an actor's resources and labels."""


class SpawnError(ActorError):
    """An actor could not be created: class not allowed, not importable, or its constructor failed."""


class CodeError(SpawnError):
    """The code an actor needs could not travel: its package cannot be packed (over the size cap,
    no script to ship), fetched, verified or imported, or a class in the script needs a statement
    that other nodes do not run. The message names the file and line where it can."""


class PermissionDenied(ActorError):
    """The node refused the call: the caller is not a member of its mesh (or not the actor's
    owner) and the actor or method is not open to it. The message says why."""


class MethodNotFound(ActorError, AttributeError):
    """The actor has no public method of that name (an AttributeError too: ``hasattr`` works)."""


class RemoteError(ActorError):
    """An exception raised by the actor's method, carried back to the caller.

    ``type_name`` is the qualified name of the remote exception type, ``remote_traceback`` its
    formatted traceback. For built-in exception types the error also subclasses the built-in
    (``except ValueError`` catches a remote ValueError); other types are never imported.
    """

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.remote_message = message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        base = super().__str__()
        if self.remote_traceback:
            return f"{base}\n\nRemote traceback:\n{self.remote_traceback.rstrip()}"
        return base


# -- the DHT -----------------------------------------------------------------------------------


class SdkCallError(ActorError):
    """A Lattica SDK node answered a call with an error (its message says what failed there)."""


class PickleRefused(ProtocolError):
    """A Lattica SDK peer sent a pickled payload: this node never unpickles what comes from the
    network. Give the SDK method protobuf types (``*_pb2``) or send bytes."""


class SdkStreamIdle(Timeout):
    """A streaming call to a Lattica SDK node (``stub(...).method.stream(...)``) got no item for
    its ``timeout`` seconds: the call was cancelled. A method that pauses longer between items
    needs a longer ``timeout=``."""


class RendezvousError(LatticaError):
    """A rendezvous point refused a request: ``status`` is the spec's code (``E_INVALID_TTL``
    102, ``E_INVALID_COOKIE`` 103, ``E_NOT_AUTHORIZED`` 200, ``E_UNAVAILABLE`` 400, ...), the
    message says which and why."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class DhtError(LatticaError):
    """Base class of DHT errors."""


class RecordRejected(DhtError):
    """A node refused to store a record: too large, expired, badly signed, over quota or rate."""


class StoreFailed(DhtError):
    """No replica accepted a put (the message lists why each refused or failed)."""


class PeerNotFound(DhtError):
    """No address of the peer could be found in the DHT."""


_REMOTE_SUBCLASSES: dict[str, type[RemoteError]] = {}


def remote_error(type_name: str, message: str, remote_traceback: str = "") -> LatticaError:
    """The RemoteError subclass for ``type_name`` (also a subclass of it, if it is a built-in)."""
    if type_name.startswith("lattica.errors."):  # our own error types keep their type
        own = globals().get(type_name.rpartition(".")[2])
        if isinstance(own, type) and issubclass(own, LatticaError) and own is not RemoteError:
            err = own(message)
            err.remote_traceback = remote_traceback  # type: ignore[attr-defined]
            return err
    cls = _REMOTE_SUBCLASSES.get(type_name)
    if cls is None:
        import builtins  # only for the rare remote error that is a builtin exception

        base = getattr(builtins, type_name, None)
        usable = (
            isinstance(base, type)
            and issubclass(base, Exception)
            and not issubclass(base, (SystemExit, KeyboardInterrupt, GeneratorExit))
            and base.__init__ is not object.__init__
        )
        if usable and len(_REMOTE_SUBCLASSES) < 256:
            try:
                cls = type(
                    f"Remote{type_name}",
                    (RemoteError, cast(type, base)),  # usable: base is an Exception subclass
                    {"__init__": RemoteError.__init__, "__str__": RemoteError.__str__},
                )
                cls(type_name, message, remote_traceback)  # some built-ins refuse a plain message
            except Exception:  # e.g. UnicodeDecodeError, ExceptionGroup: plain RemoteError then
                cls = RemoteError
            _REMOTE_SUBCLASSES[type_name] = cls
        else:
            cls = RemoteError
    try:
        return cls(type_name, message, remote_traceback)
    except Exception:
        return RemoteError(type_name, message, remote_traceback)


# -- content (CIDs, blocks, transfers) ---------------------------------------------------------


class DashboardError(LatticaError):
    """The dashboard could not start (its address is taken or cannot be bound)."""


class ContentError(LatticaError):
    """Base class of content-plane errors (CIDs, blocks, UnixFS objects, fetches)."""


class InvalidCid(ContentError, ValueError):
    """A CID's text or bytes are malformed, or name a codec or hash we do not support."""


class BadBlock(ContentError, ProtocolError):
    """A block does not match its CID, is too large, or is not a valid dag-pb/UnixFS node."""


class BlockNotFound(ContentError, KeyError):
    """A block is not in the blockstore (or no provider could supply it)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "block not found"


class StoreFull(ContentError, OSError):
    """The blockstore (or the disk under it) has no room for a block, even after collection."""


# -- CRDT documents ------------------------------------------------------------------------------


class CrdtError(LatticaError):
    """Base class of CRDT store errors (documents, update envelopes, the log)."""


class MalformedUpdate(CrdtError, ProtocolError, ValueError):
    """An update envelope, or the Yjs update inside it, is not well formed."""


class UpdateRejected(CrdtError):
    """An update envelope was refused: its signature, its author's right to write, its chain
    (gap or fork), the CRDT client ids it writes under, or its size. ``reason`` says which."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


class NotAWriter(CrdtError, PermissionError):
    """This node may not change the document: it is neither its owner nor on its writers list
    (or, for a mesh document, not a member of the mesh)."""
