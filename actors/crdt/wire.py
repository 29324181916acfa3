"""What a document's replicas exchange: the replica actor's name and ref, the document's pub-sub
topic, the limits of one ``sync``, ``push`` or ``checkpoint`` call, a replica's summary as it
travels, and the strict reading of what a peer answers (anything else is a ProtocolError)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lattica._runtime.limits import ASYNC
from lattica._runtime.refs import ActorRef
from lattica.crdt._checkpoint import MAX_SIGNATURES, MAX_STATE, Checkpoint, Signature
from lattica.crdt._envelope import Envelope, decode_any
from lattica.crdt._replica import MAX_CHAINS
from lattica.errors import MalformedUpdate, ProtocolError

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica.crdt._replica import ReplicaState

__all__ = [
    "actor_name",
    "topic_of",
    "replica_ref",
    "summary_wire",
    "parse_summary",
    "parse_answer",
    "parse_signatures",
    "MAX_SUMMARY",
    "MAX_PUSH",
    "PAGE_BYTES",
    "HEAD_ID",
    "MAX_CHECKPOINTS_SENT",
    "MAX_BODY",
]

MAX_SUMMARY = MAX_CHAINS  # chains one summary names
MAX_PUSH = 1024  # envelopes one push or sync answer carries
PAGE_BYTES = 4 << 20  # and about this many bytes
HEAD_ID = 16  # bytes of a head's id a summary carries
MAX_CHECKPOINTS_SENT = 1  # checkpoints (with their states, up to MAX_STATE each) in one answer
MAX_BODY = 8 << 20  # (each replica refuses what is over its own max_update_bytes)


def actor_name(doc: bytes) -> str:
    return "crdt/" + doc.hex()


def topic_of(doc: bytes) -> str:
    return "lattica/crdt/" + doc.hex()


def replica_ref(peer: PeerId, doc: bytes) -> ActorRef:
    """``peer``'s replica actor of document ``doc``."""
    return ActorRef(peer, actor_name(doc), {"sync": ASYNC, "push": ASYNC, "checkpoint": ASYNC})


def summary_wire(state: ReplicaState) -> list:
    """What ``state`` holds as a summary travels: per chain, author, nonce, seq held and the first
    bytes of that envelope's id (equal seqs under different ids are a fork that the seqs alone
    would hide)."""
    return [[a, n, seq, i[:HEAD_ID]] for (a, n), (seq, i) in state.heads.items()]


def parse_summary(raw: Any, ids: dict | None = None) -> dict:
    """Seq per chain; ``ids`` (given) gets the heads' id prefixes."""
    if type(raw) is not list or len(raw) > MAX_SUMMARY:
        raise ProtocolError(f"a replica's summary is a list of at most {MAX_SUMMARY} chains")
    out = {}
    for item in raw:
        if (
            type(item) is not list
            or len(item) not in (3, 4)
            or type(item[0]) is not bytes
            or type(item[1]) is not bytes
            or type(item[2]) is not int
            or not 0 <= item[2] < 1 << 63
            or len(item[0]) > 64
            or len(item[1]) > 16
            or (len(item) == 4 and (type(item[3]) is not bytes or not 0 < len(item[3]) <= 32))
        ):
            raise ProtocolError("a summary's entry is [author, nonce, seq, head id prefix]")
        out[(item[0], item[1])] = item[2]
        if ids is not None and len(item) == 4:
            ids[(item[0], item[1])] = item[3]
    return out


def parse_answer(raw: Any, ids: dict | None = None) -> tuple[dict, list[Envelope], list[tuple[Checkpoint, bytes]]]:
    if (
        type(raw) is not list
        or len(raw) != 3
        or type(raw[1]) is not list
        or len(raw[1]) > MAX_PUSH
        or type(raw[2]) is not list
        or len(raw[2]) > MAX_CHECKPOINTS_SENT
    ):
        raise ProtocolError("a sync answer is [summary, envelopes, checkpoints]")
    envs = []
    for item in raw[1]:
        try:
            envs.append(decode_any(item, MAX_BODY))
        except MalformedUpdate:
            continue
    given = []
    for item in raw[2]:
        state = item[1] if type(item) is list and len(item) == 2 else None
        if type(state) is memoryview:  # (large bytes arrive out of band, as a view)
            state = state.tobytes()
        if type(state) is not bytes or len(state) > MAX_STATE:
            raise ProtocolError("a sync answer's checkpoint is [checkpoint, state]")
        try:
            given.append((Checkpoint.from_bytes(item[0]), state))
        except MalformedUpdate as exc:
            raise ProtocolError(str(exc)) from None
    return parse_summary(raw[0], ids), envs, given


def parse_signatures(raw: Any) -> list[Signature]:
    """Signatures a peer answered a proposal with (checked later, with the checkpoint's)."""
    if type(raw) is not list or len(raw) != 2 or type(raw[0]) is not list or len(raw[0]) > MAX_SIGNATURES:
        raise ProtocolError("a checkpoint answer is [signatures, summary]")
    try:
        return [Signature.from_wire(s) for s in raw[0]]
    except MalformedUpdate as exc:
        raise ProtocolError(str(exc)) from None
