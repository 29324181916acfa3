"""The pub-sub service's wire form: a router batch as plain lists (the runtime's codec carries
them), parsed strictly.

A batch is ``[subscribe, messages, ihave, iwant, graft, prune, idontwant]``, with ``choke`` and
``unchoke`` (topic lists) after them when it carries any: subscribe
``[[topic, bool], ...]``; a message ``[topic, author (PeerId bytes), seqno, items, signature]``,
then the author's mesh certificates when it has any or names a flood set, then that set's tags
when it names one (a signed bundle of the author's messages: ``lattica.actors.pubsub.bundle``),
or ``[topic, protobuf]``, a libp2p GossipSub message as its author signed it
(``lattica.pubsub._libp2p``);
ihave ``[[topic, [id, ...]], ...]``; iwant and idontwant ``[id, ...]``; graft ``[topic, ...]``;
prune ``[[topic, backoff seconds], ...]``. Anything else (wrong types, too many entries, long
topics or ids) is refused as a whole with ``ProtocolError``: a peer learns its batch was bad,
and nothing of it is acted on.
"""

from __future__ import annotations

from typing import Any

from lattica.actors.pubsub.bundle import MAX_ITEMS, Bundle
from lattica.errors import ProtocolError
from lattica.pubsub import _gossipsub_wire as gs
from lattica.pubsub._libp2p import Signed
from lattica.pubsub._libp2p import envelope as libp2p_envelope
from lattica.pubsub._router import Envelope, Rpc

__all__ = ["NAME", "encode", "decode", "envelope", "check_topic", "MAX_TOPIC", "MAX_ID", "MAX_ITEMS"]

NAME = "pubsub"
MAX_TOPIC = 256  # bytes of a topic's UTF-8
MAX_ID = 96  # bytes of a message id (an author's PeerId bytes, the seqno's 8, a digest's 8)
MIN_ID = 17
MAX_IHAVE_TOPICS = 64  # topics one batch's IHAVE names
MAX_BATCH_IDS = 5000  # ids of all IHAVEs, IWANTs and IDONTWANTs of one batch together
MAX_AUTHOR = 64
MAX_SIGNATURE = 64
MAX_ENTRIES = 1024  # subscriptions, messages, grafts, prunes, IHAVE topics per batch
MAX_IDS = 5000  # ids per IHAVE topic, per IWANT, per IDONTWANT


def envelope(topic: str, author: bytes, seqno: int, bundle: Bundle, signature: bytes) -> Envelope:
    """The router's envelope of a signed bundle (its id covers what ``Bundle.digest`` says)."""
    return Envelope(
        topic,
        author,
        seqno,
        bundle,
        signature,
        bundle.digest(topic, author, seqno, signature),
        bundle.size,
        frozenset(bundle.flooded),
    )


def encode(rpc: Rpc) -> list:
    if rpc.choke or rpc.unchoke:
        return [
            [[t, on] for t, on in rpc.subscribe],
            [_message(m) for m in rpc.messages],
            [[t, ids] for t, ids in rpc.ihave],
            rpc.iwant,
            rpc.graft,
            [[t, b] for t, b in rpc.prune],
            rpc.idontwant,
            rpc.choke,
            rpc.unchoke,
        ]
    return [
        [[t, on] for t, on in rpc.subscribe],
        [_message(m) for m in rpc.messages],
        [[t, ids] for t, ids in rpc.ihave],
        rpc.iwant,
        rpc.graft,
        [[t, b] for t, b in rpc.prune],
        rpc.idontwant,
    ]


def _message(m: Envelope) -> list:
    b = m.data
    if type(b) is Signed:
        return [m.topic, gs.encode_message(b.msg)]
    if b.flooded:
        return [m.topic, m.author, m.seqno, b.wire(), m.signature, list(b.certs), list(b.flooded)]
    return (
        [m.topic, m.author, m.seqno, b.wire(), m.signature, b.certs]
        if b.certs
        else [m.topic, m.author, m.seqno, b.wire(), m.signature]
    )


def decode(raw: Any, max_data: int) -> Rpc:
    """The batch ``raw`` names, or ProtocolError."""
    if type(raw) is not list or len(raw) not in (7, 9):
        raise ProtocolError("a pub-sub batch is a list of 7 parts (9 with choke and unchoke)")
    subs, msgs, ihave, iwant, graft, prune, idontwant = raw[:7]
    rpc = Rpc()
    if len(raw) == 9:
        rpc.choke = [check_topic(t) for t in _entries(raw[7], "chokes")]
        rpc.unchoke = [check_topic(t) for t in _entries(raw[8], "unchokes")]
    for item in _entries(subs, "subscriptions"):
        if type(item) is not list or len(item) != 2 or type(item[1]) is not bool:
            raise ProtocolError("a subscription is [topic, bool]")
        rpc.subscribe.append((check_topic(item[0]), item[1]))
    for item in _entries(msgs, "messages"):
        if type(item) is list and len(item) == 2:
            rpc.messages.append(_libp2p_message(item, max_data))
            continue
        if type(item) is not list or len(item) not in (5, 6, 7):
            raise ProtocolError(
                "a message is [topic, author, seqno, items, signature] (then the author's certificates, then its flood set)"
            )
        topic, author, seqno, items, sig = item[:5]
        if type(author) is not bytes or not 0 < len(author) <= MAX_AUTHOR:
            raise ProtocolError("a message's author is a PeerId's bytes")
        if type(seqno) is not int or not 0 <= seqno < 1 << 64:
            raise ProtocolError("a message's seqno is an unsigned 64-bit integer")
        if type(sig) is not bytes or len(sig) > MAX_SIGNATURE:
            raise ProtocolError("a message's signature is at most 64 bytes")
        bundle = Bundle.from_wire(items, max_data, item[5] if len(item) > 5 else (), item[6] if len(item) == 7 else ())
        if seqno + len(bundle.items) > 1 << 64:
            raise ProtocolError("a message's items' seqnos are unsigned 64-bit integers")
        rpc.messages.append(envelope(check_topic(topic), author, seqno, bundle, sig))
    if type(ihave) is not list or len(ihave) > MAX_IHAVE_TOPICS:
        raise ProtocolError(f"a batch's IHAVE names at most {MAX_IHAVE_TOPICS} topics")
    for item in ihave:
        if type(item) is not list or len(item) != 2:
            raise ProtocolError("an IHAVE is [topic, [id, ...]]")
        rpc.ihave.append((check_topic(item[0]), _ids(item[1])))
    rpc.iwant = _ids(iwant)
    rpc.idontwant = _ids(idontwant)
    if sum(len(ids) for _, ids in rpc.ihave) + len(rpc.iwant) + len(rpc.idontwant) > MAX_BATCH_IDS:
        raise ProtocolError(f"a batch names at most {MAX_BATCH_IDS} message ids")
    rpc.graft = [check_topic(t) for t in _entries(graft, "grafts")]
    for item in _entries(prune, "prunes"):
        if type(item) is not list or len(item) != 2 or type(item[1]) not in (int, float):
            raise ProtocolError("a prune is [topic, backoff seconds]")
        rpc.prune.append((check_topic(item[0]), float(item[1])))
    return rpc


def _libp2p_message(item: list, max_data: int) -> Envelope:
    """The envelope of ``[topic, protobuf]`` (its signature checked later, by the service, if
    the router has not seen it: ``lattica.pubsub._libp2p.screen``)."""
    topic, raw = check_topic(item[0]), item[1]
    if type(raw) is memoryview:
        raw = raw.tobytes()
    if type(raw) is not bytes or len(raw) > max_data + 1024:
        raise ProtocolError(f"a libp2p message is its protobuf, of at most {max_data} bytes of data")
    msg = gs.decode_message(raw)
    if msg.topic != topic or len(msg.data) > max_data:
        raise ProtocolError(f"a libp2p message names another topic than its entry, or is over {max_data} bytes")
    return libp2p_envelope(msg)


def _entries(v: Any, what: str) -> list:
    if type(v) is not list or len(v) > MAX_ENTRIES:
        raise ProtocolError(f"a batch's {what} are a list of at most {MAX_ENTRIES}")
    return v


def check_topic(t: Any) -> str:
    """``t`` if it is a valid topic name, else ProtocolError."""
    if type(t) is not str or not t or len(t.encode()) > MAX_TOPIC:
        raise ProtocolError(f"a topic is a non-empty string of at most {MAX_TOPIC} bytes")
    return t


def _ids(v: Any) -> list[bytes]:
    if type(v) is not list or len(v) > MAX_IDS or not all(type(i) is bytes and MIN_ID <= len(i) <= MAX_ID for i in v):
        raise ProtocolError(f"message ids are a list of at most {MAX_IDS} byte strings of {MIN_ID} to {MAX_ID} bytes")
    return v
