"""Pub-sub: topics over a GossipSub-style mesh of the node's members (docs/pubsub.md).

    sub = lattica.pubsub.subscribe("weights")          # from now on
    n = lattica.pubsub.publish("weights", {"v": 3}).result()   # signed; the peers it went to
    msg = sub.get(timeout=5)                            # or: async for msg in sub
    msg.author, msg.seqno, msg.data

Every message is signed by its author and checked by every node before it is delivered or passed
on; ``validator(topic, fn)`` adds the application's own check. The router itself
(``lattica.pubsub._router``) and its peer scores (``lattica.pubsub._score``) are sans-IO.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica._future import Future
from lattica._runtime import on_loop, run_coroutine
from lattica.errors import NodeClosed
from lattica.pubsub._subscription import Message, Subscription

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._node import Node
    from lattica._runtime import Runtime
    from lattica.actors.pubsub import PubSubService

__all__ = ["Message", "Subscription", "subscribe", "unsubscribe", "publish", "topics", "peers", "validator"]


def _service(node: Node | None) -> tuple[Runtime, PubSubService]:
    # the table imports every service, and services import parts of this package
    from lattica.services import running_services

    rt, services = running_services(node)
    if services.pubsub is None:
        raise NodeClosed("this node runs without pub-sub (Node(pubsub=False))")
    return rt, services.pubsub


def subscribe(
    topic: str, *, handler: Callable[[Message], Any] | None = None, maxsize: int | None = None, node: Node | None = None
) -> Subscription | None:
    """Receive the messages of ``topic`` published from now on: a :class:`Subscription` (``async
    for``, ``get(timeout)``; it keeps at most ``maxsize`` unread, dropping the oldest). With
    ``handler`` (an actor method such as ``ref.on_message``, which is told each message, or a
    function run on the node loop) nothing is returned."""
    rt, svc = _service(node)
    sub: Subscription | None = on_loop(rt, lambda: svc.subscribe(topic, maxsize, handler))
    return sub


def unsubscribe(topic: str, *, handler: Callable[[Message], Any] | None = None, node: Node | None = None) -> None:
    """Stop ``handler`` (or every subscription and handler of ``topic`` on the node)."""
    rt, svc = _service(node)
    on_loop(rt, lambda: svc.unsubscribe(topic, handler))


def publish(topic: str, data: Any, *, node: Node | None = None) -> Future:
    """Sign ``data`` (anything the codec carries) and send it to ``topic``; resolves to the
    number of peers it was sent to (0: nobody else subscribes). A node that has just connected
    waits up to 2 s for its members' topics first, so a script that starts, publishes and ends
    reaches the subscribers already there."""
    rt, svc = _service(node)
    return run_coroutine(rt, lambda: svc.publish_soon(topic, data))


def topics(*, node: Node | None = None) -> list[str]:
    """The topics this node subscribes to."""
    rt, svc = _service(node)
    names: list[str] = on_loop(rt, svc.topics)
    return names


def peers(topic: str | None = None, *, node: Node | None = None) -> list[PeerId]:
    """The peers in ``topic``'s mesh on this node (or every peer that speaks pub-sub with it)."""
    rt, svc = _service(node)
    members: list[PeerId] = on_loop(rt, lambda: svc.peers(topic))
    return members


def validator(topic: str, fn: Callable[[Message], Any] | None, *, node: Node | None = None) -> None:
    """Check every new message of ``topic`` with ``fn(message)`` before it is delivered or passed
    on: True or "accept"; False or "reject" (dropped; the peer that sent it is scored down); None
    or "ignore" (dropped). ``fn`` may be a coroutine function. None removes the validator."""
    rt, svc = _service(node)
    on_loop(rt, lambda: svc.set_validator(topic, fn))
