"""libp2p's signed envelopes (RFC 0002) and the peer record they carry (RFC 0003), sans-IO.

An envelope holds a payload, its type, the signer's public key (any libp2p key type) and a
signature over ``uvarint-length-prefixed(domain) || (payload type) || (payload)``; the domain is
not on the wire, so a signature made for one purpose never passes for another. Identify carries a
peer record in one (``signedPeerRecord``): the addresses a peer vouches for itself. Relay
reservation vouchers (issue 50) use the same envelope with their own domain.
"""

from __future__ import annotations

from dataclasses import dataclass

from lattica._identity import KeyPair, PeerId, public_key_from_protobuf, verify_signature
from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields, uvarint
from lattica.errors import CodecError, InvalidPeerId, KeyFileError, MultiaddrError, ProtocolError

# Envelope{public_key = 1, payload_type = 2, payload = 3, signature = 5}
_PUBLIC_KEY, _PAYLOAD_TYPE, _PAYLOAD, _SIGNATURE = 1, 2, 3, 5
# PeerRecord{peer_id = 1, seq = 2, addresses = 3 (AddressInfo{multiaddr = 1})}
_PEER_ID, _SEQ, _ADDRESSES, _MULTIADDR = 1, 2, 3, 1

PEER_RECORD_DOMAIN = "libp2p-peer-record"  # go-, js- and newer rust-libp2p
PEER_RECORD_TYPE = b"\x03\x01"  # the multicodec libp2p-peer-record
LEGACY_PEER_RECORD_DOMAIN = "libp2p-routing-state"  # rust-libp2p before 0.56 signs with these
LEGACY_PEER_RECORD_TYPE = b"/libp2p/routing-state-record"
MAX_RECORD_ADDRS = 64  # addresses of a peer record we keep (as identify's listen addresses)


@dataclass(frozen=True)
class Opened:
    """An envelope whose signature verified: who signed it and what it says."""

    signer: PeerId
    payload: bytes


def _signed_bytes(domain: str, payload_type: bytes, payload: bytes) -> bytes:
    d = domain.encode()
    return uvarint(len(d)) + d + uvarint(len(payload_type)) + payload_type + uvarint(len(payload)) + payload


def seal(keypair: KeyPair, domain: str, payload_type: bytes, payload: bytes) -> bytes:
    """Our envelope around ``payload``, signed for ``domain``."""
    signature = keypair.sign(_signed_bytes(domain, payload_type, payload))
    return encode_fields(
        [
            (_PUBLIC_KEY, keypair.public_key_protobuf()),
            (_PAYLOAD_TYPE, payload_type),
            (_PAYLOAD, payload),
            (_SIGNATURE, signature),
        ]
    )


def open_envelope(data: bytes, domain: str, payload_type: bytes) -> Opened:
    """Check an envelope signed for ``domain`` with a payload of ``payload_type``, by a key of any
    libp2p type; ProtocolError if it is malformed, of another type, or not validly signed."""
    try:
        fields = decode_fields(data)
    except ValueError as e:
        raise ProtocolError(f"malformed signed envelope: {e}") from None
    key_pb, kind, payload, signature = (fields.get(n) for n in (_PUBLIC_KEY, _PAYLOAD_TYPE, _PAYLOAD, _SIGNATURE))
    if not all(isinstance(v, bytes) for v in (key_pb, kind, payload, signature)):
        raise ProtocolError("signed envelope lacks its key, type, payload or signature")
    assert isinstance(key_pb, bytes) and isinstance(payload, bytes) and isinstance(signature, bytes)
    if kind != payload_type:
        raise ProtocolError(f"signed envelope carries a payload of another type ({kind!r})")
    try:
        key = public_key_from_protobuf(key_pb)
    except KeyFileError as e:
        raise ProtocolError(f"signed envelope carries an unusable key: {e}") from None
    if not verify_signature(key, signature, _signed_bytes(domain, payload_type, payload)):
        raise ProtocolError(f"signed envelope's signature is not valid for {domain!r}")
    return Opened(PeerId.from_public_key(key), payload)


def encode_peer_record(peer: PeerId, seq: int, addrs: list[Multiaddr]) -> bytes:
    """A PeerRecord payload: ``peer``'s addresses, newer records with a higher ``seq``."""
    fields: list[tuple[int, int | bytes]] = [(_PEER_ID, peer.to_bytes()), (_SEQ, seq)]
    fields += [(_ADDRESSES, encode_fields([(_MULTIADDR, a.to_bytes())])) for a in addrs]
    return encode_fields(fields)


def seal_peer_record(keypair: KeyPair, seq: int, addrs: list[Multiaddr]) -> bytes:
    """Our signed peer record, as go- and js-libp2p sign theirs."""
    return seal(keypair, PEER_RECORD_DOMAIN, PEER_RECORD_TYPE, encode_peer_record(keypair.peer_id, seq, addrs))


def open_peer_record(data: bytes) -> tuple[PeerId, int, tuple[Multiaddr, ...]]:
    """A signed peer record (either signing convention): the peer, its sequence number and the
    addresses it vouches for (ones we cannot read skipped, at most :data:`MAX_RECORD_ADDRS`).
    ProtocolError unless validly signed by the peer it names."""
    try:
        opened = open_envelope(data, PEER_RECORD_DOMAIN, PEER_RECORD_TYPE)
    except ProtocolError:
        opened = open_envelope(data, LEGACY_PEER_RECORD_DOMAIN, LEGACY_PEER_RECORD_TYPE)
    try:
        fields = decode_fields(opened.payload)
        infos = decode_repeated(opened.payload, _ADDRESSES)
    except ValueError as e:
        raise ProtocolError(f"malformed peer record: {e}") from None
    raw_peer, seq = fields.get(_PEER_ID), fields.get(_SEQ, 0)
    if not isinstance(raw_peer, bytes) or not isinstance(seq, int):
        raise ProtocolError("peer record lacks its peer id or has a malformed sequence number")
    try:
        peer = PeerId.from_bytes(raw_peer)
    except InvalidPeerId as e:
        raise ProtocolError(f"peer record names a malformed peer id: {e}") from None
    if peer != opened.signer:
        raise ProtocolError("peer record is signed by another peer than the one it names")
    addrs: list[Multiaddr] = []
    for info in infos:
        try:
            raw = decode_fields(info).get(_MULTIADDR)
            if isinstance(raw, bytes):
                addrs.append(Multiaddr.from_bytes(raw))
        except (ValueError, MultiaddrError, CodecError):
            continue  # an address we cannot use: skipped, as in identify
        if len(addrs) == MAX_RECORD_ADDRS:
            break
    return peer, seq, tuple(addrs)
