"""The identify protocol: on every new connection each side pushes who it is.

One message per side, on a stream the sender opens: agent version, protocol version, public key,
listen addresses, the address it observed the receiver at, the stream protocols it serves, and the
mesh certificates that make it a member of meshes (``lattica.trust``).
Both sides push at once, so a connection is identified after one one-way delay, not a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lattica import _envelope as envelope
from lattica._identity import PeerId, public_key_from_protobuf
from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields
from lattica.errors import CodecError, KeyFileError, MultiaddrError, ProtocolError

PROTOCOL = "/lattica/id/1.0.0"
PROTOCOL_VERSION = "lattica/1"
MAX_MESSAGE = 64 * 1024
_MAX_ADDRS = 64
_MAX_PROTOCOLS = 128
_MAX_STR = 256
_MAX_CERTS, _MAX_CERT = 4, 256  # mesh certificates (lattica.trust: MAX_PRESENTED, MAX_CERT_BYTES)


@dataclass(frozen=True)
class PeerInfo:
    """What we know about a connected peer: who it is, how we reach it, what it told us."""

    peer_id: PeerId
    transport: str  # "tcp" | "quic" | "memory"
    direction: str  # "outbound" if we dialed, else "inbound"
    remote_addr: Multiaddr  # the peer's transport address on this connection
    listen_addrs: tuple[Multiaddr, ...] = ()
    observed_addr: Multiaddr | None = None  # how the peer sees us
    agent_version: str = ""
    protocol_version: str = ""
    protocols: tuple[str, ...] = field(default=())
    circle: str = "stranger"  # what the peer is to us: "self", "member" or "stranger" (lattica.trust)
    circle_reason: str = ""  # what made it a member, or why it is a stranger
    admin: bool = False  # it administers our mesh (holds its key, or a delegated certificate)


def build(
    public_key_pb: bytes,
    agent_version: str,
    listen_addrs: list[Multiaddr],
    observed: Multiaddr,
    protocols: list[str],
    mesh_certs: list[bytes] | None = None,
) -> dict[str, Any]:
    msg = {
        "protocol_version": PROTOCOL_VERSION,
        "agent_version": agent_version,
        "public_key": public_key_pb,
        "listen_addrs": [a.to_bytes() for a in listen_addrs[:_MAX_ADDRS]],
        "observed_addr": observed.to_bytes(),
        "protocols": protocols[:_MAX_PROTOCOLS],
    }
    if mesh_certs:
        msg["mesh_certs"] = mesh_certs
    return msg


def _str(msg: dict, key: str) -> str:
    v = msg.get(key, "")
    if not isinstance(v, str) or len(v) > _MAX_STR:
        raise ProtocolError(f"identify field {key!r} must be a short string")
    return v


def _bytes(v: Any, what: str) -> bytes:
    if not isinstance(v, (bytes, memoryview)):
        raise ProtocolError(f"identify field {what} must be bytes")
    return bytes(v)


def parse(msg: Any, remote_peer: PeerId) -> dict[str, Any]:
    """Validate an identify message from ``remote_peer``; raise ProtocolError if it is unusable."""
    if not isinstance(msg, dict):
        raise ProtocolError("identify message must be a map")
    try:
        key = public_key_from_protobuf(_bytes(msg.get("public_key", b""), "public_key"))
    except KeyFileError:
        raise ProtocolError("identify message carries no valid public key") from None
    if PeerId.from_public_key(key) != remote_peer:
        raise ProtocolError("identify public key does not match the connection's authenticated peer")
    addrs = msg.get("listen_addrs", [])
    protos = msg.get("protocols", [])
    if not isinstance(addrs, list) or len(addrs) > _MAX_ADDRS:
        raise ProtocolError("identify listen_addrs must be a list of at most 64 addresses")
    if not isinstance(protos, list) or len(protos) > _MAX_PROTOCOLS:
        raise ProtocolError("identify protocols must be a list of at most 128 names")
    if not all(isinstance(p, str) and len(p) <= _MAX_STR for p in protos):
        raise ProtocolError("identify protocols must be short strings")
    try:
        listen = tuple(Multiaddr.from_bytes(_bytes(a, "listen_addrs")) for a in addrs)
        observed_raw = msg.get("observed_addr")
        observed = Multiaddr.from_bytes(_bytes(observed_raw, "observed_addr")) if observed_raw else None
    except (MultiaddrError, CodecError) as e:
        raise ProtocolError(f"identify carries a malformed address: {e}") from None
    certs = msg.get("mesh_certs", [])
    if (
        not isinstance(certs, list)
        or len(certs) > _MAX_CERTS
        or not all(isinstance(c, bytes) and len(c) <= _MAX_CERT for c in certs)
    ):
        raise ProtocolError(f"identify mesh_certs must be a list of at most {_MAX_CERTS} short byte strings")
    return {
        "mesh_certs": certs,
        "listen_addrs": listen,
        "observed_addr": observed,
        "agent_version": _str(msg, "agent_version"),
        "protocol_version": _str(msg, "protocol_version"),
        "protocols": tuple(protos),
    }


# -- identify as libp2p defines it -------------------------------------------------------------

LIBP2P_PROTOCOL = "/ipfs/id/1.0.0"
LIBP2P_PUSH_PROTOCOL = "/ipfs/id/push/1.0.0"
LIBP2P_MAX_MESSAGE = 4096  # rust-libp2p refuses a larger identify message
# Identify{publicKey = 1, listenAddrs = 2, protocols = 3, observedAddr = 4, protocolVersion = 5,
# agentVersion = 6, signedPeerRecord = 8}
_KEY, _LISTEN, _PROTOS, _OBSERVED, _PROTO_VERSION, _AGENT, _SIGNED_RECORD = 1, 2, 3, 4, 5, 6, 8


def encode_libp2p(
    public_key_pb: bytes,
    agent_version: str,
    protocol_version: str,
    listen_addrs: list[Multiaddr],
    observed: Multiaddr | None,
    protocols: list[str],
    signed_record: bytes | None = None,
) -> bytes:
    """Our identify for a libp2p peer: the protobuf message (without its length prefix), at most
    :data:`LIBP2P_MAX_MESSAGE` bytes: past what fits, the signed peer record is left out, then
    addresses, then protocols."""
    head: list[tuple[int, int | bytes]] = [
        (_KEY, public_key_pb),
        (_PROTO_VERSION, protocol_version.encode()),
        (_AGENT, agent_version.encode()),
    ]
    if observed is not None:
        head.append((_OBSERVED, observed.to_bytes()))
    addrs = [a.to_bytes() for a in listen_addrs[:_MAX_ADDRS]]
    protos = [p.encode() for p in protocols[:_MAX_PROTOCOLS]]
    record = [(_SIGNED_RECORD, signed_record)] if signed_record else []
    while True:
        fields = head + [(_LISTEN, a) for a in addrs] + [(_PROTOS, p) for p in protos] + record
        out = encode_fields(fields)
        if len(out) <= LIBP2P_MAX_MESSAGE:
            return out
        if record:
            record = []
        elif addrs:
            addrs.pop()
        elif protos:
            protos.pop()
        else:
            raise ValueError("identify message does not fit even without addresses and protocols")


def parse_libp2p(data: bytes, remote_peer: PeerId) -> dict[str, Any]:
    """A libp2p peer's identify message (protobuf, its length prefix removed), in the shape
    :func:`parse` returns. Addresses with protocol codes we do not know are skipped (peers
    advertise websockets, webtransport, certhashes ...); a valid signed peer record's addresses
    stand in for the unsigned ones (the peer vouches for them), an invalid one is ignored;
    ProtocolError if the message is unusable."""
    if len(data) > LIBP2P_MAX_MESSAGE:
        raise ProtocolError(f"identify message of {len(data)} bytes (at most {LIBP2P_MAX_MESSAGE})")
    try:
        fields = decode_fields(data)
        raw_addrs = decode_repeated(data, _LISTEN)
        raw_protos = decode_repeated(data, _PROTOS)
    except ValueError as e:
        raise ProtocolError(f"malformed identify message: {e}") from None
    key_pb = fields.get(_KEY)
    if not isinstance(key_pb, bytes):
        raise ProtocolError("identify message carries no public key")
    try:
        key = public_key_from_protobuf(key_pb)
    except KeyFileError:
        raise ProtocolError("identify message carries no usable public key") from None
    if PeerId.from_public_key(key) != remote_peer:
        raise ProtocolError("identify public key does not match the connection's authenticated peer")
    listen: list[Multiaddr] = []
    for raw in raw_addrs:  # (at most 4 KiB of them: the message's cap bounds the work)
        try:
            listen.append(Multiaddr.from_bytes(raw))
        except (MultiaddrError, CodecError):
            continue  # an address we cannot use: skipped, never fatal, and not counted
        if len(listen) == _MAX_ADDRS:
            break
    raw_record = fields.get(_SIGNED_RECORD)
    if isinstance(raw_record, bytes):
        try:
            signer, _, signed_addrs = envelope.open_peer_record(raw_record)
        except ProtocolError:
            pass  # (a record we cannot check vouches for nothing: the unsigned addresses stand)
        else:
            if signer == remote_peer:
                listen = list(signed_addrs[:_MAX_ADDRS])
    observed = None
    raw_observed = fields.get(_OBSERVED)
    if isinstance(raw_observed, bytes):
        try:
            observed = Multiaddr.from_bytes(raw_observed)
        except (MultiaddrError, CodecError):
            observed = None
    try:
        protos = tuple(p.decode() for p in raw_protos if len(p) <= _MAX_STR)[:_MAX_PROTOCOLS]
        texts = {
            n: v.decode() if isinstance(v, bytes) else "" for n, v in fields.items() if n in (_PROTO_VERSION, _AGENT)
        }
    except UnicodeDecodeError:
        raise ProtocolError("identify strings must be UTF-8") from None
    return {
        "mesh_certs": [],
        "listen_addrs": tuple(listen),
        "observed_addr": observed,
        "agent_version": texts.get(_AGENT, "")[:_MAX_STR],
        "protocol_version": texts.get(_PROTO_VERSION, "")[:_MAX_STR],
        "protocols": protos,
    }
