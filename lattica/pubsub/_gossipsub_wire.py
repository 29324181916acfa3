"""libp2p GossipSub's RPC (libp2p/specs ``pubsub/README.md``, ``gossipsub/gossipsub-v1.1.md`` and
``-v1.2.md``), sans-IO: ``/meshsub/1.2.0``, ``/meshsub/1.1.0`` and ``/meshsub/1.0.0`` carry a
stream of uvarint-length ``RPC{subscriptions, publish, control}`` messages.

Messages are signed one by one (StrictSign): ``signature`` is the author's signature of
``"libp2p-pubsub:"`` and the message's protobuf without ``signature`` and ``key``; ``key`` (the
author's protobuf public key) is left out when ``from`` inlines it, as an Ed25519 PeerId does.
:func:`sign` makes such a message, :func:`verify` checks one (its author is ``from``).
Message ids are computed per topic by the caller (:func:`default_id`: ``from`` and ``seqno``
joined, go's and js's default).

What we read is bounded: :data:`MAX_RPC` bytes an RPC (go's default, 1 MiB), and at most
:data:`MAX_ITEMS` entries in each repeated field (subscriptions, messages, control entries, ids
of one IHAVE/IWANT/IDONTWANT, peers of one PRUNE); beyond, an RPC is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lattica._identity import KeyPair, PeerId, public_key_from_protobuf, verify_signature
from lattica._protobuf import decode_fields, decode_repeated, encode_fields
from lattica.errors import InvalidPeerId, KeyFileError, ProtocolError

__all__ = [
    "MESHSUB_1_2",
    "MESHSUB_1_1",
    "MESHSUB_1_0",
    "MAX_RPC",
    "SubOpts",
    "Message",
    "IHave",
    "Prune",
    "Control",
    "RPC",
    "encode",
    "decode",
    "sign",
    "verify",
    "default_id",
    "encode_message",
    "decode_message",
]

MESHSUB_1_2 = "/meshsub/1.2.0"
MESHSUB_1_1 = "/meshsub/1.1.0"
MESHSUB_1_0 = "/meshsub/1.0.0"
MAX_RPC = 1 << 20
MAX_ITEMS = 5000
MAX_TOPIC = 1024  # bytes of a topic name
SIGN_PREFIX = b"libp2p-pubsub:"

Fields = list[tuple[int, int | bytes]]


@dataclass(frozen=True)
class SubOpts:
    subscribe: bool
    topic: str


@dataclass(frozen=True)
class Message:
    """A published message; ``author`` is ``from`` (None in an anonymous one, which StrictSign
    refuses)."""

    topic: str
    data: bytes = b""
    author: PeerId | None = None
    seqno: bytes = b""
    signature: bytes = b""
    key: bytes = b""


@dataclass(frozen=True)
class IHave:
    topic: str
    ids: tuple[bytes, ...]


@dataclass(frozen=True)
class Prune:
    topic: str
    peers: tuple[PeerId, ...] = ()  # peer exchange (their signed records are not kept)
    backoff: int = 0


@dataclass(frozen=True)
class Control:
    ihave: tuple[IHave, ...] = ()
    iwant: tuple[bytes, ...] = ()  # message ids, all IWANT entries together
    graft: tuple[str, ...] = ()
    prune: tuple[Prune, ...] = ()
    idontwant: tuple[bytes, ...] = ()  # message ids, all IDONTWANT entries together (1.2)

    def __bool__(self) -> bool:
        return bool(self.ihave or self.iwant or self.graft or self.prune or self.idontwant)


@dataclass(frozen=True)
class RPC:
    subscriptions: tuple[SubOpts, ...] = ()
    publish: tuple[Message, ...] = ()
    control: Control = field(default_factory=Control)


# -- encoding ----------------------------------------------------------------------------------


def _message_fields(m: Message, signed: bool = True) -> Fields:
    fields: Fields = []
    if m.author is not None:
        fields.append((1, m.author.to_bytes()))
    if m.data:
        fields.append((2, m.data))
    if m.seqno:
        fields.append((3, m.seqno))
    fields.append((4, m.topic.encode()))
    if signed and m.signature:
        fields.append((5, m.signature))
    if signed and m.key:
        fields.append((6, m.key))
    return fields


def _control(c: Control) -> bytes:
    fields: Fields = []
    for h in c.ihave:
        fields.append((1, encode_fields([(1, h.topic.encode()), *((2, i) for i in h.ids)])))
    if c.iwant:
        fields.append((2, encode_fields([(1, i) for i in c.iwant])))
    for t in c.graft:
        fields.append((3, encode_fields([(1, t.encode())])))
    for p in c.prune:
        inner: Fields = [(1, p.topic.encode())]
        inner += [(2, encode_fields([(1, peer.to_bytes())])) for peer in p.peers]
        if p.backoff:
            inner.append((3, p.backoff))
        fields.append((4, encode_fields(inner)))
    if c.idontwant:
        fields.append((5, encode_fields([(1, i) for i in c.idontwant])))
    return encode_fields(fields)


def encode_message(m: Message) -> bytes:
    """One message's protobuf, signature and key included (as it travels inside an RPC)."""
    return encode_fields(_message_fields(m))


def encode(rpc: RPC) -> bytes:
    """An RPC's protobuf (without its length prefix)."""
    fields: Fields = [(1, encode_fields([(1, int(s.subscribe)), (2, s.topic.encode())])) for s in rpc.subscriptions]
    fields += [(2, encode_fields(_message_fields(m))) for m in rpc.publish]
    if rpc.control:
        fields.append((3, _control(rpc.control)))
    return encode_fields(fields)


# -- decoding ----------------------------------------------------------------------------------


def _items(buf: bytes, number: int) -> list[bytes]:
    items = decode_repeated(buf, number)
    if len(items) > MAX_ITEMS:
        raise ProtocolError(f"a GossipSub RPC with more than {MAX_ITEMS} entries in one field")
    return items


def _text(raw: object, what: str) -> str:
    if not isinstance(raw, bytes) or len(raw) > MAX_TOPIC:
        raise ProtocolError(f"a GossipSub {what} must be a topic name of at most {MAX_TOPIC} bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"a GossipSub {what} is not UTF-8") from None


def _bytes(f: dict[int, int | bytes], n: int) -> bytes:
    v = f.get(n, b"")
    if not isinstance(v, bytes):
        raise ProtocolError("a GossipSub bytes field holds a number")
    return v


def _message(raw: bytes) -> Message:
    f = decode_fields(raw)
    author_raw = f.get(1)
    author = None
    if author_raw is not None:
        if not isinstance(author_raw, bytes):
            raise ProtocolError("a GossipSub message's from must be a PeerId")
        try:
            author = PeerId.from_bytes(author_raw)
        except InvalidPeerId as e:
            raise ProtocolError(f"a GossipSub message names no valid author: {e}") from None
    return Message(_text(f.get(4), "message topic"), _bytes(f, 2), author, _bytes(f, 3), _bytes(f, 5), _bytes(f, 6))


def decode_message(raw: bytes) -> Message:
    """One message's protobuf (``encode_message``'s); ProtocolError if malformed (the
    signature is not checked: ``verify``)."""
    if len(raw) > MAX_RPC:
        raise ProtocolError(f"a GossipSub message of {len(raw)} bytes (at most {MAX_RPC})")
    try:
        return _message(raw)
    except ValueError as e:  # (the protobuf reader's)
        raise ProtocolError(f"malformed GossipSub message: {e}") from None


def _decode_control(raw: bytes) -> Control:
    ihave = []
    for h in _items(raw, 1):
        ihave.append(IHave(_text(decode_fields(h).get(1), "IHAVE topic"), tuple(_items(h, 2))))
    iwant = [i for w in _items(raw, 2) for i in _items(w, 1)]
    graft = [_text(decode_fields(g).get(1), "GRAFT topic") for g in _items(raw, 3)]
    prune = []
    for p in _items(raw, 4):
        f = decode_fields(p)
        peers = []
        for info in _items(p, 2):
            pid = decode_fields(info).get(1)
            if isinstance(pid, bytes):
                try:
                    peers.append(PeerId.from_bytes(pid))
                except InvalidPeerId:
                    continue  # (one we cannot use: skipped)
        backoff = f.get(3, 0)
        if not isinstance(backoff, int):
            raise ProtocolError("a PRUNE's backoff is a number of seconds")
        prune.append(Prune(_text(f.get(1), "PRUNE topic"), tuple(peers), backoff))
    idontwant = [i for w in _items(raw, 5) for i in _items(w, 1)]
    if max(len(iwant), len(idontwant)) > MAX_ITEMS:
        raise ProtocolError(f"a GossipSub RPC names more than {MAX_ITEMS} message ids at once")
    return Control(tuple(ihave), tuple(iwant), tuple(graft), tuple(prune), tuple(idontwant))


def decode(data: bytes) -> RPC:
    """A peer's RPC; ProtocolError if it is over :data:`MAX_RPC`, malformed or over the caps."""
    if len(data) > MAX_RPC:
        raise ProtocolError(f"a GossipSub RPC of {len(data)} bytes (at most {MAX_RPC})")
    try:
        subs = []
        for raw in _items(data, 1):
            f = decode_fields(raw)
            flag = f.get(1, 0)
            if not isinstance(flag, int):
                raise ProtocolError("a subscription's flag is a boolean")
            subs.append(SubOpts(bool(flag), _text(f.get(2), "subscription topic")))
        publish = tuple(_message(raw) for raw in _items(data, 2))
        controls = _items(data, 3)
        control = _decode_control(controls[-1]) if controls else Control()
        return RPC(tuple(subs), publish, control)
    except ValueError as e:  # (the protobuf reader's)
        raise ProtocolError(f"malformed GossipSub RPC: {e}") from None


# -- StrictSign ----------------------------------------------------------------------------------


def sign(keypair: KeyPair, topic: str, data: bytes, seqno: bytes) -> Message:
    """Our message on ``topic``, signed (its key inlined in our Ed25519 PeerId, so not sent)."""
    m = Message(topic, data, keypair.peer_id, seqno)
    signature = keypair.sign(SIGN_PREFIX + encode_fields(_message_fields(m, signed=False)))
    return Message(topic, data, keypair.peer_id, seqno, signature)


def verify(m: Message) -> None:
    """Check a message's StrictSign signature by its author; ProtocolError if it has none, its
    key is not its author's, or the signature does not verify."""
    if m.author is None or not m.signature or not m.seqno:
        raise ProtocolError("a GossipSub message must name its author, carry a seqno and be signed (StrictSign)")
    try:
        key = public_key_from_protobuf(m.key) if m.key else m.author.public_key()
    except KeyFileError as e:
        raise ProtocolError(f"a GossipSub message carries an unusable key: {e}") from None
    if key is None or (m.key and not m.author.matches_public_key(key)):
        raise ProtocolError("a GossipSub message's key is not its author's")
    if not verify_signature(key, m.signature, SIGN_PREFIX + encode_fields(_message_fields(m, signed=False))):
        raise ProtocolError("a GossipSub message's signature does not verify")


def default_id(m: Message) -> bytes:
    """go's and js's default message id: the author's PeerId bytes, then the seqno."""
    return (m.author.to_bytes() if m.author is not None else b"") + m.seqno
