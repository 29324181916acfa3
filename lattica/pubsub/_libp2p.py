"""The router's batches as libp2p GossipSub RPCs and back, sans-IO (issue 50).

A libp2p GossipSub message (``lattica.pubsub._gossipsub_wire``: signed one by one, StrictSign)
enters the router as an :class:`~lattica.pubsub._router.Envelope` whose id is libp2p's default
(the author's PeerId bytes, then the 8-byte seqno) followed by ``LIBP2P_MARK``; its ``data`` is a
:class:`Signed` holding the message as the author signed it, so any node can pass it on
unchanged. Our signed bundles never go to libp2p peers, nor do choke or flood sets.

Message ids on the wire are each implementation's default: go-libp2p sends the bytes (``from``
and ``seqno`` joined), js-libp2p (@libp2p/gossipsub 17) the author's protobuf public key and
the seqno joined, rust-libp2p (the Lattica SDK) the text of ``from`` in base58 and the seqno in
decimal. :class:`Dialect` turns ours into a peer's and back; an id we cannot read (a custom id
function, say) is skipped, so gossip with such a peer is lost and its mesh messages still arrive.
"""

from __future__ import annotations

import enum
import math
import string
from collections.abc import Callable

from lattica._identity import PeerId, b58decode, public_key_to_protobuf
from lattica.errors import InvalidPeerId, ProtocolError
from lattica.pubsub import _gossipsub_wire as gs
from lattica.pubsub._router import LIBP2P_MARK, Envelope, GossipParams, Rpc, is_libp2p_id

__all__ = ["Signed", "Dialect", "envelope", "to_gossipsub", "from_gossipsub", "ids_read", "screen", "RPC_BUDGET"]

SEQNO = 8  # bytes of a seqno we take (go's, js's and rust's)
RPC_BUDGET = gs.MAX_RPC - 64 * 1024  # bytes of messages we put in one RPC (under go's 1 MiB cap)
_DIGITS = frozenset(string.digits)
_ED25519_PB = b"\x08\x01\x12\x20"  # an Ed25519 public key's protobuf, before its 32 bytes (js's ids)
_AUTHOR_CHARS = 61  # characters of a PeerId in base58 at most (44 bytes: 2 and an inlined key's 42)
_SEQNO_DIGITS = 20  # digits of a 64-bit seqno at most
# bytes of an id as any dialect writes it, at most (go's 44 + 8, js's 36 + 8, rust's 61 + 20):
# a longer one names no message and is not parsed
MAX_WIRE_ID = 96
_READ = GossipParams()  # what the router looks at of one batch: IHAVEs, ids of an IWANT, IDONTWANTs


class Signed:
    """A libp2p message as its author signed it (``msg``); ``items`` and ``count`` as a bundle's,
    so the service delivers either the same way."""

    __slots__ = ("msg", "items", "count", "size")

    def __init__(self, msg: gs.Message) -> None:
        self.msg = msg
        self.items = [msg.data]
        self.count = 1
        self.size = len(msg.data)


class Dialect(enum.Enum):
    """How a peer writes message ids: ``BYTES`` (go), ``KEY`` (js) or ``TEXT`` (rust)."""

    BYTES = "bytes"
    KEY = "key"
    TEXT = "text"

    @classmethod
    def of(cls, agent_version: str) -> Dialect:
        """A peer's dialect by its identify agent version (rust- and js-libp2p say so; the SDK
        does)."""
        if agent_version.startswith("rust-libp2p"):
            return cls.TEXT
        return cls.KEY if agent_version.startswith("js-libp2p") else cls.BYTES

    def wire(self, mid: bytes) -> bytes | None:
        """Our id of a libp2p message as this dialect writes it (None: it cannot, as js for an
        author whose key its PeerId does not inline)."""
        body = mid[: -len(LIBP2P_MARK)]
        if self is Dialect.BYTES:
            return body
        author, seqno = PeerId.from_bytes(body[:-SEQNO]), body[-SEQNO:]
        if self is Dialect.KEY:
            key = author.public_key()
            return None if key is None else public_key_to_protobuf(key) + seqno
        return (str(author) + str(int.from_bytes(seqno, "big"))).encode()

    def ours(self, wid: bytes) -> bytes | None:
        """Our id of the message a peer names ``wid`` (None: not one we can read). ``BYTES``
        and ``KEY`` read both forms (a PeerId starts 0x00 or 0x12, a key's protobuf 0x08); of
        js's, only an Ed25519 author's (whose PeerId inlines the key: no key to parse). An id
        longer than any dialect writes is not looked at (``MAX_WIRE_ID``)."""
        if len(wid) > MAX_WIRE_ID:
            return None
        if self is not Dialect.TEXT:
            if len(wid) <= SEQNO:
                return None
            head = wid[:-SEQNO]
            if len(head) == len(_ED25519_PB) + 32 and head.startswith(_ED25519_PB):
                return bytes((0, len(head))) + wid + LIBP2P_MARK  # (its PeerId inlines it)
            try:
                PeerId.from_bytes(head)
            except InvalidPeerId:
                return None
            return wid + LIBP2P_MARK
        return _text_id(wid)


def _text_id(wid: bytes) -> bytes | None:
    """Our id of rust's ``wid``: its author's PeerId in base58, then the seqno in decimal, whose
    first digits may be ones base58 shares (1-9): each split is tried, the shortest author
    first (it fits at one at most). The base58 number of the shortest author is read once and
    grown a digit at a time: one pass over an id of at most ``MAX_WIRE_ID`` characters, whatever
    a peer sends (before: a base58 parse per split, of any length: quadratic)."""
    try:
        text = wid.decode("ascii")
    except UnicodeDecodeError:
        return None
    end = len(text)
    cut = end
    while cut > 0 and text[cut - 1] in _DIGITS:
        cut -= 1
    first = max(cut, end - _SEQNO_DIGITS, 1)  # (a seqno of at most 20 digits, an author of a character or more)
    last = min(end - 1, _AUTHOR_CHARS)  # (a seqno of a digit or more)
    if first > last:
        return None
    try:
        raw = b58decode(text[:first])
    except ValueError:
        return None
    ones = len(raw) - len(raw.lstrip(b"\0"))  # (leading '1's: zero bytes)
    n = int.from_bytes(raw, "big")
    for i in range(first, last + 1):
        if i > first:
            digit = text[i - 1]
            if digit == "0":
                return None  # (no base58 digit: no longer author)
            if n == 0 and ones == i - 1 and digit == "1":
                ones += 1
            else:
                n = n * 58 + int(digit) - 1  # (base58's '1'-'9' are 0-8)
        size = (n.bit_length() + 7) // 8
        if not _could_be_peer_id(n, size, ones):
            continue
        digits = text[i:]
        if len(digits) > 1 and digits[0] == "0":
            continue
        seqno = int(digits)
        if seqno >= 1 << 64:
            continue
        body = n.to_bytes(size, "big")
        try:
            author = PeerId.from_bytes(bytes(ones) + body)
        except InvalidPeerId:
            continue
        return author.to_bytes() + seqno.to_bytes(SEQNO, "big") + LIBP2P_MARK
    return None


def _could_be_peer_id(n: int, size: int, ones: int) -> bool:
    """Whether ``ones`` zero bytes then ``n`` (of ``size`` bytes) could be a PeerId's multihash:
    sha2-256's 34 bytes starting 0x12, or an identity one (a zero byte, then its length); a quick
    test before the parse, so most of an id's splits cost a little arithmetic."""
    if ones == 0:
        return size == 34 and n >> 264 == 0x12
    if ones == 1:
        return 0 < size <= 43 and n >> (8 * (size - 1)) == size - 1
    return ones == 2 and n == 0


def envelope(msg: gs.Message) -> Envelope:
    """The router's envelope of a libp2p message whose signature the caller checked
    (``gs.verify``); ProtocolError if its seqno is not 8 bytes (all three implementations')."""
    if msg.author is None or len(msg.seqno) != SEQNO:
        raise ProtocolError(f"a GossipSub message's seqno must be {SEQNO} bytes")
    return Envelope(
        msg.topic,
        msg.author.to_bytes(),
        int.from_bytes(msg.seqno, "big"),
        Signed(msg),
        msg.signature,
        LIBP2P_MARK,
        len(msg.data),
    )


def to_gossipsub(rpc: Rpc, dialect: Dialect, idontwant: bool) -> list[gs.RPC]:
    """What of ``rpc`` a libp2p peer takes, as RPCs each within ``RPC_BUDGET`` bytes of
    messages (none: nothing for it). ``idontwant``: it speaks ``/meshsub/1.2.0``."""

    def ids(mids: list[bytes]) -> tuple[bytes, ...]:
        return tuple(w for w in (dialect.wire(m) for m in mids if is_libp2p_id(m)) if w is not None)

    ihave = tuple(gs.IHave(topic, wids) for topic, mids in rpc.ihave if (wids := ids(mids)))
    control = gs.Control(
        ihave,
        ids(rpc.iwant),
        tuple(rpc.graft),
        tuple(gs.Prune(topic, (), math.ceil(backoff)) for topic, backoff in rpc.prune),
        ids(rpc.idontwant) if idontwant else (),
    )
    subs = tuple(gs.SubOpts(on, topic) for topic, on in rpc.subscribe)
    messages = [m.data.msg for m in rpc.messages if type(m.data) is Signed]
    out: list[gs.RPC] = []
    batch: list[gs.Message] = []
    size = 0
    for m in messages:
        n = len(m.data) + len(m.signature) + len(m.topic) + 64
        if batch and size + n > RPC_BUDGET:
            out.append(gs.RPC(publish=tuple(batch)))
            batch, size = [], 0
        batch.append(m)
        size += n
    first = gs.RPC(subs, tuple(batch), control)
    if first.subscriptions or first.publish or first.control:
        out.append(first)
    return out


def from_gossipsub(rpc: gs.RPC, dialect: Dialect) -> tuple[Rpc, list[str]]:
    """A libp2p peer's RPC as a router batch (its messages' signatures not checked yet:
    :func:`screen`), and the topics of its messages that carry no author or a seqno we cannot
    take (left out: the caller scores the peer). Ids we cannot read are left out, and so are
    those past what the router looks at of one batch (``_READ``: translating rust's costs tens
    of microseconds an id)."""
    out = Rpc()
    bad: list[str] = []
    out.subscribe = [(s.topic, s.subscribe) for s in rpc.subscriptions]
    for m in rpc.publish:
        try:
            out.messages.append(envelope(m))
        except ProtocolError:
            bad.append(m.topic)
    ours = dialect.ours
    c = rpc.control
    out.ihave = [(h.topic, [i for i in map(ours, h.ids) if i is not None]) for h in c.ihave[: _READ.max_ihave_messages]]
    out.iwant = [i for i in map(ours, c.iwant[: _READ.max_iwant_ids]) if i is not None]
    out.idontwant = [i for i in map(ours, c.idontwant[: _READ.max_idontwant]) if i is not None]
    out.graft = list(c.graft)
    out.prune = [(p.topic, float(p.backoff)) for p in c.prune]
    return out, bad


def ids_read(rpc: gs.RPC) -> int:
    """How many message ids :func:`from_gossipsub` translates of ``rpc`` (at most what the
    router looks at of one batch): each costs 2 us (go's, js's) to 12 us (rust's text) in
    pure Python, which a stranger's share is charged before they are read."""
    c = rpc.control
    if not c:
        return 0
    ihave = sum(len(h.ids) for h in c.ihave[: _READ.max_ihave_messages])
    return ihave + min(len(c.iwant), _READ.max_iwant_ids) + min(len(c.idontwant), _READ.max_idontwant)


def screen(rpc: Rpc, seen: Callable[[bytes], bool]) -> list[str]:
    """Check the StrictSign signature of each libp2p message of ``rpc`` the router has not
    ``seen`` (a seen id was some copy's whose signature held), before the router sees it: the
    first that fails is taken out with every message after it, and its topic returned (the
    caller scores the sender). So a forged
    copy sent first cannot take an honest message's id, as libp2p's own routers check first."""
    bad: list[str] = []
    keep: list[Envelope] = []
    for env in rpc.messages:
        data = env.data
        if type(data) is Signed and not seen(env.id):
            try:
                gs.verify(data.msg)
            except ProtocolError:
                bad.append(env.topic)
                break  # (a sender of one forgery gets nothing more of this RPC checked)
        keep.append(env)
    if bad:
        rpc.messages = keep
    return bad
