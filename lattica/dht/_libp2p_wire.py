"""libp2p Kademlia's messages (the kad-dht spec's ``Message``), sans-IO: bytes in, a checked
:class:`KadMessage` out, and back. The first piece of issue 49: the libp2p DHT beside ours, on
``/ipfs/kad/1.0.0`` or a network's own protocol id, sharing ``_kademlia``'s lookup core.

On the wire each message is a uvarint length and one protobuf ``Message{type = 1, key = 2,
record = 3 (Record{key = 1, value = 2, timeReceived = 5, and rust-libp2p's publisher = 666 and
ttl = 777}), closerPeers = 8, providerPeers = 9
(Peer{id = 1, addrs = 2, connection = 3}), clusterLevelRaw = 10 (unused)}``. What we read is
bounded: a message of at most :data:`MAX_MESSAGE` bytes, :data:`MAX_PEERS` peers per list and
:data:`MAX_PEER_ADDRS` addresses per peer; a peer whose id we cannot read, and addresses we cannot
use, are skipped and not counted (as in identify). What we write stays within rust-libp2p's
16 KiB packets.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields
from lattica.errors import CodecError, InvalidPeerId, MultiaddrError, ProtocolError

MAX_MESSAGE = 64 * 1024  # bytes of a message we read (go writes up to 4 MiB; nothing needs that)
MAX_WRITE = 16 * 1024  # rust-libp2p-kad's default packet cap: what we write stays within it
MAX_PEERS = 64  # closer or provider peers we keep from one message (k is 20)
MAX_PEER_ADDRS = 16  # addresses we keep of one peer
MAX_KEY = 1024  # bytes of a key (a PeerId, a multihash, a /pk/ or /ipns/ name)

# Message{...}; Record{...}; Peer{...}
_TYPE, _KEY, _RECORD, _CLOSER, _PROVIDERS = 1, 2, 3, 8, 9
_R_KEY, _R_VALUE, _R_TIME, _R_PUBLISHER, _R_TTL = 1, 2, 5, 666, 777
_P_ID, _P_ADDRS, _P_CONNECTION = 1, 2, 3


class MessageType(enum.IntEnum):
    """What a message asks (a request) or answers (its response has the same type)."""

    PUT_VALUE = 0
    GET_VALUE = 1
    ADD_PROVIDER = 2
    GET_PROVIDERS = 3
    FIND_NODE = 4
    PING = 5


class ConnectionType(enum.IntEnum):
    """What the sender knows of its connection to a peer it names."""

    NOT_CONNECTED = 0
    CONNECTED = 1
    CAN_CONNECT = 2
    CANNOT_CONNECT = 3


_TYPES = frozenset(int(t) for t in MessageType)
_CONNECTIONS = frozenset(int(c) for c in ConnectionType)


@dataclass(frozen=True)
class KadPeer:
    """A peer a message names, with the addresses the sender gives for it."""

    peer: PeerId
    addrs: tuple[Multiaddr, ...] = ()
    connection: ConnectionType = ConnectionType.NOT_CONNECTED


@dataclass(frozen=True)
class KadRecord:
    """A value under a key; no expiry or signature on the wire (validators judge values).
    ``publisher`` (rust-libp2p's field, unsigned: a claim) is always sent, since the Lattica SDK
    cannot store a record without one; ``ttl`` in seconds, 0 when absent."""

    key: bytes
    value: bytes
    time_received: str = ""
    publisher: PeerId | None = None
    ttl: int = 0


@dataclass(frozen=True)
class KadMessage:
    """One Kademlia request or response."""

    type: MessageType
    key: bytes = b""
    record: KadRecord | None = None
    closer: tuple[KadPeer, ...] = ()
    providers: tuple[KadPeer, ...] = ()


def _encode_peer(p: KadPeer) -> bytes:
    fields: list[tuple[int, int | bytes]] = [(_P_ID, p.peer.to_bytes())]
    fields += [(_P_ADDRS, a.to_bytes()) for a in p.addrs]
    if p.connection:
        fields.append((_P_CONNECTION, int(p.connection)))
    return encode_fields(fields)


def encode(msg: KadMessage) -> bytes:
    """The protobuf message (without its length prefix). Peers past what fits in
    :data:`MAX_WRITE` are left out, the last first; ValueError if even the rest does not fit."""
    head: list[tuple[int, int | bytes]] = [(_TYPE, int(msg.type))]
    if msg.key:
        head.append((_KEY, msg.key))
    if msg.record is not None:
        record: list[tuple[int, int | bytes]] = [(_R_KEY, msg.record.key), (_R_VALUE, msg.record.value)]
        if msg.record.time_received:
            record.append((_R_TIME, msg.record.time_received.encode()))
        if msg.record.publisher is not None:
            record.append((_R_PUBLISHER, msg.record.publisher.to_bytes()))
        if msg.record.ttl:
            record.append((_R_TTL, msg.record.ttl))
        head.append((_RECORD, encode_fields(record)))
    closer = [_encode_peer(p) for p in msg.closer]
    providers = [_encode_peer(p) for p in msg.providers]
    while True:
        out = encode_fields(head + [(_CLOSER, p) for p in closer] + [(_PROVIDERS, p) for p in providers])
        if len(out) <= MAX_WRITE:
            return out
        if closer:
            closer.pop()
        elif providers:
            providers.pop()
        else:
            raise ValueError(f"a Kademlia message of {len(out)} bytes (at most {MAX_WRITE})")


def _decode_peers(data: bytes, number: int) -> tuple[KadPeer, ...]:
    peers: list[KadPeer] = []
    for raw in decode_repeated(data, number):
        fields = decode_fields(raw)
        raw_id = fields.get(_P_ID)
        if not isinstance(raw_id, bytes):
            continue
        try:
            peer = PeerId.from_bytes(raw_id)
        except InvalidPeerId:
            continue  # a peer we cannot name: skipped, not counted
        addrs: list[Multiaddr] = []
        for raw_addr in decode_repeated(raw, _P_ADDRS):
            try:
                addrs.append(Multiaddr.from_bytes(raw_addr))
            except (MultiaddrError, CodecError):
                continue
            if len(addrs) == MAX_PEER_ADDRS:
                break
        connection = fields.get(_P_CONNECTION, 0)
        kind = ConnectionType(connection) if connection in _CONNECTIONS else ConnectionType.NOT_CONNECTED
        peers.append(KadPeer(peer, tuple(addrs), kind))
        if len(peers) == MAX_PEERS:
            break
    return tuple(peers)


def decode(data: bytes) -> KadMessage:
    """A peer's message (its length prefix removed); ProtocolError if it is over the cap,
    malformed, of an unknown type, or has a key or record of the wrong shape."""
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"a Kademlia message of {len(data)} bytes (at most {MAX_MESSAGE})")
    try:
        fields = decode_fields(data)
        kind = fields.get(_TYPE, 0)
        if not isinstance(kind, int) or kind not in _TYPES:
            raise ProtocolError(f"unknown Kademlia message type {kind!r}")
        key = fields.get(_KEY, b"")
        if not isinstance(key, bytes) or len(key) > MAX_KEY:
            raise ProtocolError("a Kademlia message's key must be at most 1 KiB of bytes")
        record = None
        raw_record = fields.get(_RECORD)
        if raw_record is not None:
            if not isinstance(raw_record, bytes):
                raise ProtocolError("a Kademlia record must be a message")
            r = decode_fields(raw_record)
            r_key, value, when = r.get(_R_KEY, b""), r.get(_R_VALUE, b""), r.get(_R_TIME, b"")
            if not (isinstance(r_key, bytes) and isinstance(value, bytes) and isinstance(when, bytes)):
                raise ProtocolError("a Kademlia record's key, value and time must be bytes")
            if len(r_key) > MAX_KEY:
                raise ProtocolError("a Kademlia record's key must be at most 1 KiB")
            publisher = None
            raw_publisher = r.get(_R_PUBLISHER)
            if isinstance(raw_publisher, bytes):
                try:
                    publisher = PeerId.from_bytes(raw_publisher)
                except InvalidPeerId:
                    publisher = None  # a claim we cannot read: as if absent
            ttl = r.get(_R_TTL, 0)
            ttl = ttl if isinstance(ttl, int) and 0 <= ttl < 1 << 32 else 0
            record = KadRecord(r_key, value, when.decode("utf-8", "replace")[:64], publisher, ttl)
        return KadMessage(
            MessageType(kind),
            key,
            record,
            _decode_peers(data, _CLOSER),
            _decode_peers(data, _PROVIDERS),
        )
    except ValueError as e:  # (the protobuf reader's: truncated, or a wire type kad never uses)
        raise ProtocolError(f"malformed Kademlia message: {e}") from None
