"""libp2p rendezvous (``/rendezvous/1.0.0``, docs/protocols.md): meet the peers of a namespace
through a rendezvous point, a node every one of them can reach.

    point = "/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."       # or its PeerId, once connected
    lattica.rendezvous.register(point, "my-app").result()      # the TTL granted, in seconds
    found, cookie = lattica.rendezvous.discover(point, "my-app").result()
    for r in found:
        r.peer, r.addrs                                         # signed by the peer itself
    more, cookie = lattica.rendezvous.discover(point, "my-app", cookie=cookie).result()  # only new ones
    lattica.rendezvous.unregister(point, "my-app").result()

Every node is a client; a node is a rendezvous point with
``Node(rendezvous=RendezvousConfig(serve=True))``. A registration carries our signed peer
record (the addresses we advertise) and is renewed until unregistered; the addresses discovery
returns are the registered peers' own signed records, and go into the node's address book, so
``node.connect(r.peer)`` or a call to an actor there dials them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._runtime import on_loop, run_coroutine
from lattica.config import RendezvousConfig
from lattica.errors import NodeClosed, RendezvousError
from lattica.rendezvous._wire import Registration

if TYPE_CHECKING:
    from lattica._future import Future
    from lattica._node import Node
    from lattica._runtime import Runtime
    from lattica.actors.rendezvous import RendezvousService

__all__ = [
    "Registration",
    "RendezvousConfig",
    "RendezvousError",
    "register",
    "unregister",
    "discover",
    "registered",
]


def _service(node: Node | None) -> tuple[Runtime, RendezvousService]:
    # the table imports every service, and the service imports this package
    from lattica.services import running_services

    rt, services = running_services(node)
    if services.rendezvous is None:
        raise NodeClosed("this node runs without rendezvous (Node(rendezvous=False))")
    return rt, services.rendezvous


def _point(rt: Runtime, point: PeerId | Multiaddr | str) -> PeerId:
    """The rendezvous point's PeerId; an address (ending in ``/p2p/<id>``) is remembered for it."""
    if isinstance(point, PeerId):
        return point
    if isinstance(point, str) and not point.startswith("/"):
        return PeerId.from_string(point)
    addr = Multiaddr(point) if isinstance(point, str) else point
    peer = addr.peer_id
    if peer is None:
        raise ValueError(f"a rendezvous point's address ends in /p2p/<PeerId>: {addr}")
    on_loop(rt, lambda: rt.host.remember_addrs(peer, [addr]))
    return peer


def register(
    point: PeerId | Multiaddr | str, namespace: str, ttl: int | None = None, *, node: Node | None = None
) -> Future:
    """Register this node in ``namespace`` at the rendezvous ``point`` (a PeerId, or an address
    ending in ``/p2p/<PeerId>``) for ``ttl`` seconds (None: the point's default, 2 h); a Future
    of the TTL granted. Renewed before it runs out, and when our addresses change, until
    :func:`unregister` (``RendezvousConfig(refresh=False)``: not renewed). Fails with
    :class:`~lattica.errors.RendezvousError` if the point refuses (its ``status`` says why)."""
    rt, svc = _service(node)
    peer = _point(rt, point)
    return run_coroutine(rt, lambda: svc.register(peer, namespace, ttl))


def unregister(point: PeerId | Multiaddr | str, namespace: str, *, node: Node | None = None) -> Future:
    """End this node's registration in ``namespace`` at ``point``, and its renewals."""
    rt, svc = _service(node)
    peer = _point(rt, point)
    return run_coroutine(rt, lambda: svc.unregister(peer, namespace))


def discover(
    point: PeerId | Multiaddr | str,
    namespace: str | None = None,
    limit: int | None = None,
    cookie: bytes | None = None,
    *,
    node: Node | None = None,
) -> Future:
    """The peers registered in ``namespace`` (None: in every namespace) at ``point``: a Future
    of ``(registrations, cookie)``, a list of :class:`Registration` (at most ``limit``; a point
    gives at most 1,000 at once) and the cookie that, passed back, asks only for registrations
    made or renewed since (and for the rest, when ``limit`` cut the answer short). Each peer's
    addresses go into this node's address book."""
    rt, svc = _service(node)
    peer = _point(rt, point)
    return run_coroutine(rt, lambda: svc.discover(peer, namespace, limit, cookie))


def registered(*, node: Node | None = None) -> list[tuple[PeerId, str]]:
    """This node's registrations being renewed: (rendezvous point, namespace)."""
    rt, svc = _service(node)
    out: list[tuple[PeerId, str]] = on_loop(rt, svc.registered)
    return out
