"""Topics a node opens to strangers (``PubSubConfig.open_topics``), sans-IO: which topics are
open, and the part of a router batch about them alone, which is all a stranger may send us or be
sent (the glue, ``lattica.actors.pubsub``, applies it to every batch from or to a stranger)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattica.pubsub._router import Rpc

__all__ = ["is_open", "only_open"]


def is_open(topic: str | None, patterns: Iterable[str]) -> bool:
    """Whether ``topic`` is one of ``patterns`` ("name", or "prefix*")."""
    return topic is not None and any(t == topic or (t.endswith("*") and topic.startswith(t[:-1])) for t in patterns)


def only_open(
    rpc: Rpc, ok: Callable[[str | None], bool], topic_of: Callable[[bytes], str | None], to_stranger: bool
) -> Rpc:
    """The parts of ``rpc`` about open topics (``ok``): what a stranger may send us (it may ask
    only for their messages) or be sent (ids of no other topic's messages). ``topic_of``: the
    topic of a message id the router has seen."""
    iwant = (
        rpc.iwant if to_stranger else [i for i in rpc.iwant if ok(topic_of(i))]
    )  # (ours answer its IHAVEs of open topics)
    idontwant = [i for i in rpc.idontwant if ok(topic_of(i))] if to_stranger else rpc.idontwant
    return replace(
        rpc,
        subscribe=[(t, on) for t, on in rpc.subscribe if ok(t)],
        messages=[m for m in rpc.messages if ok(m.topic)],
        ihave=[(t, ids) for t, ids in rpc.ihave if ok(t)],
        iwant=iwant,
        graft=[t for t in rpc.graft if ok(t)],
        prune=[(t, b) for t, b in rpc.prune if ok(t)],
        idontwant=idontwant,
        choke=[t for t in rpc.choke if ok(t)],
        unchoke=[t for t in rpc.unchoke if ok(t)],
    )
