"""libp2p GossipSub's RPC (libp2p/specs ``pubsub/README.md``, ``gossipsub/gossipsub-v1.1.md`` and
``-v1.2.md``), sans-IO: ``/meshsub/1.2.0``, ``/meshsub/1.1.0`` and ``/meshsub/1.0.0`` carry a
stream of uvarint-length ``RPC{subscriptions, publish, control}`` messages.

Messages are signed one by one (StrictSign): ``signature`` is the author's signature of
``"libp2p-pubsub:"`` and the message's protobuf without ``signature`` and ``key``; ``key`` (the
author's protobuf public key) is left out when ``from`` inlines it, as an Ed25519 PeerId does.
:func:`sign` makes such a message, :func:`verify` checks one (its author is ``from``).
Message ids are computed per topic by the caller (:func:`default_id`: ``from`` and ``seqno``
joined, go's and js's default).

What we read is bounded: :data:`MAX_RPC` bytes an RPC (go's default, 1 MiB), :data:`MAX_FIELDS`
protobuf fields in all (nested ones included), and at most :data:`MAX_ITEMS` entries in each
repeated field (subscriptions, messages, control entries, ids of all IWANTs, of all
IDONTWANTs); beyond, an RPC is refused whole, as it is read. Of IHAVEs, :data:`MAX_ITEMS` ids in
all are read and the rest skipped (the router asks for no more in a heartbeat), and of a PRUNE's
peer exchange :data:`MAX_PX` peers.

A stranger's RPC is read within a share of fields too (``Reader(share)``: the caller's budget;
past it :class:`Spent`, not the peer's fault), and :func:`skim` tells how many messages an RPC
carries from its top-level tags and lengths alone, each counted, before anything is decoded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from lattica._identity import KeyPair, PeerId, public_key_from_protobuf, verify_signature
from lattica._protobuf import encode_fields, iter_fields, read_uvarint
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
    "skim",
    "Reader",
    "Spent",
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
# protobuf fields of one RPC, nested ones included: 5,000 messages of 6 fields, and control
# (an honest RPC of 1 MiB holds far fewer); beyond, the RPC is refused as it is read
MAX_FIELDS = 64_000
MAX_PX = 16  # peers of a PRUNE's peer exchange read (go sends 16; we use none of them)
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


class Spent(Exception):
    """A :class:`Reader`'s share of fields ran out before the RPC's end (the caller's budget, a
    stranger's: the RPC is dropped, its sender not blamed). Not a LatticaError: a stream reader
    that catches those goes on reading."""


class Reader:
    """Reads an RPC's fields, every field of every nested message counted against
    ``MAX_FIELDS``: in pure Python each costs about a microsecond, so what a peer can make one
    RPC cost is bounded by what it could honestly hold, not by 1 MiB of two-byte fields. With a
    ``share`` smaller than that (what a stranger may still make us read), reading past it raises
    :class:`Spent`; ``read`` is how many fields were counted."""

    __slots__ = ("left", "start", "spent")

    def __init__(self, share: int | None = None) -> None:
        self.left = MAX_FIELDS if share is None else max(min(MAX_FIELDS, share), 0)
        self.start = self.left
        self.spent = share is not None and share < MAX_FIELDS  # (running out is the share's, not a cap)

    @property
    def read(self) -> int:
        return self.start - max(self.left, 0)

    def over(self) -> None:
        """One field past what may be read: Spent (a share) or ProtocolError (the cap)."""
        if self.spent:
            raise Spent(f"a GossipSub RPC of more than the {self.start} protobuf fields its share has left")
        raise ProtocolError(f"a GossipSub RPC of more than {MAX_FIELDS} protobuf fields")

    def fields(self, buf: bytes) -> Iterator[tuple[int, int | bytes]]:
        for pair in iter_fields(buf):
            self.left -= 1
            if self.left < 0:
                self.over()
            yield pair

    def fields_of(self, buf: bytes) -> dict[int, int | bytes]:
        """A message's fields (the last of each number wins)."""
        return dict(self.fields(buf))

    def repeated(self, buf: bytes, numbers: tuple[int, ...]) -> dict[int, list[bytes]]:
        """The length-delimited values of each of ``numbers`` in ``buf``, in one pass;
        ProtocolError past ``MAX_ITEMS`` of one."""
        out: dict[int, list[bytes]] = {n: [] for n in numbers}
        for number, value in self.fields(buf):
            values = out.get(number)
            if values is not None and isinstance(value, bytes):
                values.append(value)
                if len(values) > MAX_ITEMS:
                    raise ProtocolError(f"a GossipSub RPC with more than {MAX_ITEMS} entries in one field")
        return out

    def ids(self, entries: list[bytes]) -> list[bytes]:
        """The message ids of IWANT or IDONTWANT entries; ProtocolError past ``MAX_ITEMS``."""
        out: list[bytes] = []
        for entry in entries:
            for number, value in self.fields(entry):
                if number == 1 and isinstance(value, bytes):
                    out.append(value)
                    if len(out) > MAX_ITEMS:
                        raise ProtocolError(f"a GossipSub RPC names more than {MAX_ITEMS} message ids at once")
        return out


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


def _message(raw: bytes, rd: Reader) -> Message:
    f = rd.fields_of(raw)
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
        return _message(raw, Reader())
    except ValueError as e:  # (the protobuf reader's)
        raise ProtocolError(f"malformed GossipSub message: {e}") from None


def _ihave(raw: bytes, room: int, rd: Reader) -> IHave | None:
    """An IHAVE with at most ``room`` of its ids, read no further (None: its topic was not
    before them; go, js and rust write it first)."""
    topic = None
    ids: list[bytes] = []
    for number, value in rd.fields(raw):
        if number == 1:
            topic = value
        elif number == 2 and isinstance(value, bytes):
            if len(ids) == room:
                break
            ids.append(value)
    if topic is None:
        return None
    return IHave(_text(topic, "IHAVE topic"), tuple(ids))


def _decode_control(raw: bytes, rd: Reader) -> Control:
    c = rd.repeated(raw, (1, 2, 3, 4, 5))
    ihave = []
    room = MAX_ITEMS  # ids of all IHAVEs read: more than a heartbeat's asking (go's MaxIHaveLength) are not
    for h in c[1]:
        if room <= 0:
            break
        entry = _ihave(h, room, rd)
        if entry is not None:
            ihave.append(entry)
            room -= len(entry.ids)
    iwant = rd.ids(c[2])
    graft = [_text(rd.fields_of(g).get(1), "GRAFT topic") for g in c[3]]
    prune = []
    for p in c[4]:
        topic: int | bytes | None = None
        backoff: int | bytes = 0
        peers: list[PeerId] = []
        for number, value in rd.fields(p):
            if number == 1:
                topic = value
            elif number == 3:
                backoff = value
            elif number == 2 and isinstance(value, bytes) and len(peers) < MAX_PX:
                pid = rd.fields_of(value).get(1)
                if isinstance(pid, bytes):
                    try:
                        peers.append(PeerId.from_bytes(pid))
                    except InvalidPeerId:
                        continue  # (one we cannot use: skipped)
        if not isinstance(backoff, int):
            raise ProtocolError("a PRUNE's backoff is a number of seconds")
        prune.append(Prune(_text(topic, "PRUNE topic"), tuple(peers), backoff))
    idontwant = rd.ids(c[5])
    return Control(tuple(ihave), tuple(iwant), tuple(graft), tuple(prune), tuple(idontwant))


def skim(data: bytes, rd: Reader) -> int:
    """How many messages the RPC ``data`` carries, from its top-level fields' tags and lengths
    alone (nothing copied or decoded), each field counted against ``rd``: what knowing it costs
    is charged too. ProtocolError if malformed there (as :func:`decode` would be)."""
    if len(data) > MAX_RPC:
        raise ProtocolError(f"a GossipSub RPC of {len(data)} bytes (at most {MAX_RPC})")
    n = pos = 0
    end = len(data)
    try:
        while pos < end:
            rd.left -= 1
            if rd.left < 0:
                rd.over()
            tag, pos = read_uvarint(data, pos)
            wire = tag & 7
            if wire == 2:
                size, pos = read_uvarint(data, pos)
                pos += size
                if pos > end:
                    raise ValueError("truncated length-delimited field")
                if tag >> 3 == 2:
                    n += 1
            elif wire == 0:
                _, pos = read_uvarint(data, pos)
            else:
                raise ValueError(f"unsupported protobuf wire type {wire}")
    except ValueError as e:
        raise ProtocolError(f"malformed GossipSub RPC: {e}") from None
    return n


def decode(data: bytes, rd: Reader | None = None) -> RPC:
    """A peer's RPC; ProtocolError if it is over :data:`MAX_RPC`, malformed or over the caps
    (IHAVE ids past :data:`MAX_ITEMS` in all are not read: more than the router would ask);
    :class:`Spent` past the share of ``rd`` (a stranger's: see :class:`Reader`)."""
    if len(data) > MAX_RPC:
        raise ProtocolError(f"a GossipSub RPC of {len(data)} bytes (at most {MAX_RPC})")
    if rd is None:
        rd = Reader()
    try:
        top = rd.repeated(data, (1, 2, 3))
        subs = []
        for raw in top[1]:
            f = rd.fields_of(raw)
            flag = f.get(1, 0)
            if not isinstance(flag, int):
                raise ProtocolError("a subscription's flag is a boolean")
            subs.append(SubOpts(bool(flag), _text(f.get(2), "subscription topic")))
        publish = tuple(_message(raw, rd) for raw in top[2])
        control = _decode_control(top[3][-1], rd) if top[3] else Control()
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
