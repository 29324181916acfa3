"""Module-level API (Ray's spelling): ``lattica.init``, ``shutdown``, ``kill``, ``get_actor``.

``init`` starts one embedded node per process (idempotent); actor calls made from ordinary threads
go through it. Code running on a node's own loop or actor threads uses that node instead.
"""

from __future__ import annotations

import asyncio
import atexit
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any

from lattica import _context as context
from lattica import dht
from lattica._future import Future
from lattica._identity import PeerId
from lattica._monitors import Monitor
from lattica._multiaddr import Multiaddr
from lattica._node import Node
from lattica._remote import current_runtime, on_loop
from lattica._runtime import ActorRef, current_actor, spawner_ref
from lattica.errors import ActorNotFound, LatticaError, Timeout
from lattica.logging import get_logger
from lattica.nat._manager import NatStatus

log = get_logger("lattica.api")

__all__ = [
    "init",
    "shutdown",
    "kill",
    "akill",
    "get_actor",
    "aget_actor",
    "node",
    "nat_status",
    "nodes",
    "monitor",
    "link",
    "exit_actor",
]

_lock = threading.Lock()  # one init at a time
NAME_GRACE = 1.0  # s get_actor looks again for a name not found (Ray raises at once)
_init_arguments: dict[int, dict[str, Any]] = {}  # the default node -> what init() started it with
_DEFAULT_ARGUMENTS = {"listen": ["/ip4/127.0.0.1/tcp/0"], "bootstrap": [], "allow": [], "key_path": None}


def init(
    listen: Iterable[str | Multiaddr] | str = ("/ip4/127.0.0.1/tcp/0",),
    *,
    bootstrap: Iterable[str | Multiaddr] | str = (),
    allow: Iterable[str] = (),
    key_path: str | None = None,
    **node_options: Any,
) -> Node:
    """Start this process's node (once; later calls return the same node). ``bootstrap``: peers to
    join through: returns once the listeners are bound and one of them is connected (the rest,
    AutoNAT and the DHT's table filling go on in the background; raises if none answers).
    ``allow``: class-path patterns peers may spawn here (e.g. ``"myapp.*"``). ``listen`` and
    ``bootstrap`` take one address or a list. Called again: the same node (LatticaError if the
    arguments differ: ``shutdown()`` first)."""
    listen = [listen] if isinstance(listen, (str, Multiaddr)) else list(listen)
    bootstrap = [bootstrap] if isinstance(bootstrap, (str, Multiaddr)) else list(bootstrap)
    asked = {
        "listen": [str(a) for a in listen],
        "bootstrap": [str(a) for a in bootstrap],
        "allow": list(allow),
        "key_path": key_path,
        **node_options,
    }
    with _lock:
        current = context.default_node()
        if isinstance(current, Node) and current.running:
            given = _init_arguments.get(id(current))
            if given is not None and asked != given and asked != _DEFAULT_ARGUMENTS:
                changed = sorted(k for k in {*asked, *given} if asked.get(k) != given.get(k))
                raise LatticaError(
                    f"lattica.init() already started this process's node with other arguments ({', '.join(changed)}): "
                    "call lattica.shutdown() first to start it anew, or lattica.init() without arguments to get it"
                )
            return current
        node = Node(listen, key_path=key_path, allow=allow, **node_options)
        _init_arguments.clear()
        _init_arguments[id(node)] = asked
        node.start()
        context.set_default_node(node)
        goodbye_on_sigterm()
    try:
        addrs = [Multiaddr(a) for a in bootstrap]
        if addrs:
            node._call(lambda h: h.join(addrs, node.config.dial_timeout))
    except BaseException:
        shutdown()  # a failed init leaves no half-joined default node: calling init again retries
        raise
    return node


def goodbye_on_sigterm() -> None:
    """Let SIGTERM (``kill``, systemd, ``docker stop``) end this process as Ctrl-C does: the exit
    runs, the node says goodbye (its peers see it left, not dead) and its actors' jobs end at
    once. Only from the main thread, and only if nobody set a SIGTERM handler of their own."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        return
    signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def nat_status(refresh: bool = False) -> NatStatus:
    """Reachability, NAT mapping type, observed addresses and relay reservations of this
    process's node (see ``Node.nat_status``)."""
    return node().nat_status(refresh)


def monitor(ref: ActorRef, on_down: Callable[[ActorRef, str], Any]) -> Monitor:
    """Call ``on_down(ref, reason)`` once when the actor stops or its node dies (see
    ``lattica._monitors``); ``.cancel()`` the returned Monitor to stop watching."""
    rt = current_runtime()
    mon: Monitor = on_loop(rt, lambda: rt.monitors.watch(ref, on_down))
    return mon


def link(ref: ActorRef) -> None:
    """Link the calling actor with ``ref`` (OTP's link): when either goes down, the other is
    stopped too. Call it from inside an actor method. The other side holds only if we control
    ``ref`` (docs/security.md, ownership); if its node refuses, a warning is logged and only
    this side holds (we stop when ``ref`` goes down)."""
    rt = current_runtime()
    me = current_actor()
    if me is None:
        raise LatticaError("lattica.link is called from inside an actor method")

    async def both() -> None:
        rt.host.services.spawner.bindings.bind(me.name, ref)
        try:
            await rt.call(spawner_ref(ref.peer_id), "link", (ref.name, me), {}, timeout=10.0)
        except LatticaError as e:
            log.warning("link holds on this side only", actor=me.name, other=ref.name, reason=str(e))

    on_loop(rt, lambda: rt.host.spawn(both()))


def unlink(ref: ActorRef) -> None:
    """Undo ``lattica.link(ref)`` from inside the calling actor: neither going down stops the
    other any more (a supervisor's hold on its child is not affected)."""
    rt = current_runtime()
    me = current_actor()
    if me is None:
        raise LatticaError("lattica.unlink is called from inside an actor method")

    async def both() -> None:
        rt.host.services.spawner.bindings.unbind(me.name, ref)
        try:
            await rt.call(spawner_ref(ref.peer_id), "unlink", (ref.name, me), {}, timeout=10.0)
        except LatticaError as e:
            log.warning("unlink done on this side only", actor=me.name, other=ref.name, reason=str(e))

    on_loop(rt, lambda: rt.host.spawn(both()))


def exit_actor(reason: str = "normal") -> None:
    """End the calling actor once its running calls have answered (Ray's ``exit_actor``). Its
    monitors see ``reason``; a supervisor does not restart a transient child that ended
    "normal"."""
    rt = current_runtime()
    me = current_actor()
    if me is None:
        raise LatticaError("lattica.exit_actor is called from inside an actor method")
    on_loop(rt, lambda: rt.actors[me.name].exit_when_idle(str(reason)[:200]) if me.name in rt.actors else None)


def nodes() -> list[dict[str, Any]]:
    """The live membership view of this process's node (see ``Node.nodes``): peers, their
    resources, labels, load and state."""
    return node().nodes()


def node() -> Node:
    """The node ``init`` started (raises if there is none)."""
    current = context.default_node()
    if not isinstance(current, Node) or not current.running:
        raise LatticaError("no Lattica node is running here: call lattica.init() first")
    return current


def shutdown() -> None:
    """Stop the node ``init`` started (actors stop, on_stop hooks run, connections close)."""
    with _lock:
        n = context.set_default_node(None)
    if n is not None:
        n.stop()


atexit.register(shutdown)


def kill(ref: ActorRef, timeout: float = 10.0) -> None:
    """Stop the actor: calls in flight fail with ActorDied, its ``on_stop`` hook runs."""
    rt = current_runtime()
    _spawner_call(rt, ref.peer_id, "kill", (ref.name,), timeout).result(timeout + 1)


def get_actor(name: str, node: PeerId | str | None = None, timeout: float = 10.0) -> ActorRef:
    """The ref of the actor named ``name``: on ``node`` (a PeerId) if given, else on this node,
    else wherever on the mesh it was registered (``.options(name=...)`` publishes it in the DHT;
    a name not found there is looked up again for about a second, then ActorNotFound).
    PermissionDenied if only nodes outside this node's mesh hold the name."""
    ref: ActorRef = _get_actor(name, node, timeout).result(timeout + 1)
    return ref


def _get_actor(name: str, node: PeerId | str | None, timeout: float) -> Future:
    rt = current_runtime()
    if node is None:
        actor = rt.actors.get(name)
        if actor is not None:
            return _resolved(rt, actor.ref)
        # a name nobody registered is ActorNotFound after NAME_GRACE (one registered a moment ago
        # may still be on its way), not after the whole timeout
        return dht.run_with_service(
            None,
            lambda svc: _within(
                svc.resolve_name(name, within=min(timeout, NAME_GRACE)), timeout, f"resolving the actor name {name!r}"
            ),
        )
    peer = PeerId.from_string(node) if isinstance(node, str) else node
    if peer == rt.peer_id:
        actor = rt.actors.get(name)
        if actor is None:
            return _resolved(rt, None, ActorNotFound(f"no actor named {name!r} on this node"))
        return _resolved(rt, actor.ref)
    return _spawner_call(rt, peer, "lookup", (name,), timeout)


def _resolved(rt: Any, value: Any, error: BaseException | None = None) -> Future:
    """A Future already holding ``value`` (or ``error``), usable from any thread or loop."""

    def make() -> Future:
        fut = Future(rt.loop)
        fut._reject(error) if error is not None else fut._resolve(value)
        return fut

    resolved: Future = on_loop(rt, make)
    return resolved


def _spawner_call(rt: Any, peer: PeerId, method: str, args: tuple[Any, ...], timeout: float) -> Future:
    fut: Future = on_loop(rt, lambda: rt.call(spawner_ref(peer), method, args, {}, timeout=timeout))
    return fut


async def _within(coro: Any, timeout: float, what: str) -> Any:
    try:
        async with asyncio.timeout(timeout):
            return await coro
    except TimeoutError:
        raise Timeout(f"{what} took longer than {timeout} s") from None


async def akill(ref: ActorRef, timeout: float = 10.0) -> None:
    """``kill`` for async code (e.g. inside an async actor method): awaits instead of blocking."""
    rt = current_runtime()
    await _spawner_call(rt, ref.peer_id, "kill", (ref.name,), timeout)


async def aget_actor(name: str, node: PeerId | str | None = None, timeout: float = 10.0) -> ActorRef:
    """``get_actor`` for async code: awaits instead of blocking."""
    ref: ActorRef = await _get_actor(name, node, timeout)
    return ref
