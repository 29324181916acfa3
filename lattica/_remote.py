"""``@lattica.actor``: the user's classes as actors, spawned anywhere and called with futures.

Spelling follows Ray: ``Cls.remote(...)`` / ``Cls.options(node=..., name=...).remote(...)`` spawn
and return an ``ActorRef``; ``ref.method.remote(...)`` returns a ``lattica.Future``,
``.tell(...)`` sends without a reply, ``.stream(...)`` iterates a generator method's items.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Set
from importlib.machinery import ModuleSpec
from typing import Any, NamedTuple, TypeVar

from lattica import _placement as placement
from lattica import codec
from lattica._code.tickets import NAMESPACE_PREFIX, Ticket, known_ticket
from lattica._identity import PeerId
from lattica._runtime import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_WINDOW,
    ActorRef,
    MethodHandle,
    Runtime,
    StreamCall,
    current_actor,
    current_runtime,
    method_table,
    on_loop,
    spawner_ref,
)
from lattica._runtime.refs import PUBLIC_ATTR
from lattica.errors import NodeClosed, PeerUnreachable, PlacementError, SpawnError

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["actor", "ActorClass", "MethodHandle", "StreamCall", "current_runtime"]


def class_path(cls: type) -> str:
    """``module.Class``, the name a spawner imports. A class defined in the script being run is
    named after the script (``python train.py`` -> ``train.Class``; ``python -m pkg.train`` ->
    ``pkg.train.Class``): other nodes import it under that name, never as ``__main__``."""
    module = cls.__module__
    if module == "__main__":
        module = _main_module_name() or module
    elif module.startswith(NAMESPACE_PREFIX):
        module = module.partition(".")[2]  # loaded from a code package: the name its driver gave it
    return f"{module}.{cls.__qualname__}"


def _main_module_name() -> str | None:
    main = sys.modules.get("__main__")
    spec: ModuleSpec | None = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return spec.name
    path: str | None = getattr(main, "__file__", None)
    if path:
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem.isidentifier():
            return stem
    return None


class ActorClass:
    """What ``@lattica.actor`` returns: spawns actors of the class (the class itself is ``.cls``)."""

    def __init__(self, cls: type, options: dict[str, Any]) -> None:
        self.cls = cls
        self._lattica_cls = cls  # the spawner unwraps this when it imports the decorated name
        self._options = options
        self._methods = method_table(cls)
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__module__ = cls.__module__
        self.__doc__ = cls.__doc__

    def options(
        self,
        *,
        node: PeerId | str | None = None,
        name: str | None = None,
        max_concurrency: int | None = None,
        window: int | None = None,
        resources: dict[str, float] | None = None,
        labels: dict[str, str] | None = None,
        placement: str | None = None,
        lifetime: str | None = None,
        get_if_exists: bool | None = None,
    ) -> ActorClass:
        """Spawn options: target ``node`` (PeerId; default this node), actor ``name`` (unique on
        its node), async ``max_concurrency`` (1000), per-caller mailbox ``window`` (1024 calls).
        Without ``node``, any of ``resources`` ({"cpu": 1, "memory": bytes, "gpus": 1}),
        ``labels`` and ``placement`` ("spread" or "pack") choose the node from the membership
        view and reserve the resources there (see ``docs/membership.md``). ``lifetime="detached"``:
        the actor outlives the process that spawned it (else it ends with it); ``get_if_exists``
        (with ``name``): the live actor of that name if there is one, instead of SpawnError."""
        opts = dict(self._options)
        for key, value in (
            ("node", node),
            ("name", name),
            ("max_concurrency", max_concurrency),
            ("window", window),
            ("resources", resources),
            ("labels", labels),
            ("placement", placement),
            ("lifetime", lifetime),
            ("get_if_exists", get_if_exists),
        ):
            if value is not None:
                opts[key] = value
        if "node" in opts and any(k in opts for k in ("resources", "labels", "placement")):
            raise ValueError("give node=, or resources/labels/placement for the runtime to choose one, not both")
        if opts.get("lifetime") not in (None, "detached"):
            raise ValueError(
                f"lifetime is None (the actor ends with the process that spawned it) or 'detached', not {opts['lifetime']!r}"
            )
        if opts.get("get_if_exists") and "name" not in opts:
            raise ValueError("get_if_exists=True needs name=")
        return ActorClass(self.cls, opts)

    def _spawn_options(self, max_conc: int, window: int) -> dict[str, Any]:
        """What the target's spawner is told besides the class and arguments (caller's thread:
        the job is the calling actor's, if an actor spawns)."""
        opts: dict[str, Any] = {
            "max_concurrency": max_conc,
            "window": window,
            "publish": self._options.get("name") is not None,
        }
        if self._options.get("lifetime") == "detached":
            opts["detached"] = True
        else:
            job = _current_job()
            if job is not None:
                opts["job"] = str(job)
        if self._options.get("get_if_exists"):
            opts["get_if_exists"] = True
        return opts

    def remote(self, *args: Any, **kwargs: Any) -> ActorRef:
        """Spawn the actor; returns its ref at once (the constructor runs where the actor lives;
        if it fails, calls through the ref raise SpawnError). A class the target node does not
        have installed travels with the spawn (docs/api.md, "Code that travels")."""
        rt = current_runtime()
        node = self._options.get("node")
        target = PeerId.from_string(node) if isinstance(node, str) else (node or rt.peer_id)
        max_conc = self._options.get("max_concurrency", DEFAULT_MAX_CONCURRENCY)
        window = self._options.get("window", DEFAULT_WINDOW)
        name = self._options.get("name")
        opts = self._spawn_options(max_conc, window)
        if any(k in self._options for k in ("resources", "labels", "placement")):
            placed: ActorRef = on_loop(rt, lambda: self._spawn_placed(rt, list(args), kwargs, name, opts))
            return placed
        if target == rt.peer_id:
            local: ActorRef = on_loop(rt, lambda: _spawn_local(rt, self.cls, list(args), kwargs, name, opts))
            return local
        name = name or f"{self.cls.__name__}-{os.urandom(5).hex()}"
        ref = ActorRef(target, name, self._methods, window)
        call = (class_path(self.cls), list(args), kwargs or None, name, opts)
        if _code_travels(rt, self.cls, call):
            ref._spawn = on_loop(rt, lambda: _settle(rt, _spawn_on(rt, target, call, self.cls)))
        else:  # sent now, in order: a lookup or a call by name made right after finds the actor
            ref._spawn = on_loop(rt, lambda: rt.call(spawner_ref(target), "spawn", call, {}, timeout=None))
        return ref

    def _spawn_placed(
        self, rt: Runtime, args: list[Any], kwargs: dict[str, Any], name: str | None, opts: dict[str, Any]
    ) -> ActorRef:
        """On the loop: rank the nodes that fit (PlacementError now if none does), aim the ref at
        the best one and return it; the spawn moves down the list while spawners refuse, and calls
        made through the ref wait for the outcome (so they reach the node that accepted)."""
        need = dict(self._options.get("resources") or {})
        labels = dict(self._options.get("labels") or {})
        view = rt.placement_view()
        code = rt.host.services.code
        shipped = code is not None and code.shipper.travels(self.cls)
        what = placement.Spawnable(
            class_path(self.cls), code.shipper.admin if shipped and code is not None else None, str(rt.peer_id)
        )
        ranked = placement.candidates(
            view,
            need,
            labels,
            self._options.get("placement", "spread"),
            rt.recent_placements(view),
            what,
            rt.host.trust.admin,
        )
        name = name or f"{self.cls.__name__}-{os.urandom(5).hex()}"
        ref = ActorRef(PeerId.from_string(ranked[0]), name, self._methods, opts["window"])
        opts["reserve"] = need
        if labels:
            opts["labels"] = labels
        call = (class_path(self.cls), args, kwargs or None, name, opts)
        rt.placed(ranked[0], view)  # now, so the next .remote() in this same breath ranks with it

        def trying(peer: PeerId) -> None:
            ref.peer_id = peer  # held calls are sent where the spawn finally lands

        ref._spawn = _settle(rt, offer_spawn(rt, call, ranked, view, trying, code_for=self.cls))
        return ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor class {self.__name__} cannot be instantiated directly; use {self.__name__}.remote(...)")

    def __repr__(self) -> str:
        return f"<actor class {class_path(self.cls)}>"


def _settle(rt: Runtime, spawning: Any) -> asyncio.Future[ActorRef]:
    """A future for a ref's spawn, settled by the coroutine ``spawning`` (run on the loop); calls
    made through the ref wait for it."""
    spawn = rt.loop.create_future()

    async def run() -> None:
        try:
            ref = await spawning
        except BaseException as e:  # noqa: BLE001 -- told to the ref's callers
            if not spawn.done():
                spawn.set_exception(e)
                spawn.exception()
            return
        if not spawn.done():
            spawn.set_result(ref)

    rt.host.spawn(run())
    return spawn


async def _spawn_on(rt: Runtime, peer: PeerId, call: tuple[Any, ...], cls: type) -> ActorRef:
    """Spawn on the node the caller named: its answer (or refusal) is the outcome."""
    await _attach_code(rt, cls, call)
    ref: ActorRef = await rt.call(spawner_ref(peer), "spawn", call, {}, timeout=None)
    return ref


def _code_travels(rt: Runtime, cls: type, call: tuple[Any, ...]) -> bool:
    """Whether a spawn has code to attach (its class's, or an actor class's among its arguments),
    or a class of the script that must be refused at once."""
    code = rt.host.services.code
    if code is None:
        return False
    return cls.__module__ == "__main__" or any(
        code.shipper.travels(c) for c in (cls, *_actor_classes([call[1], call[2]], 6))
    )


async def _attach_code(rt: Runtime, cls: type | None, call: tuple[Any, ...]) -> None:
    """Put the ticket of the package ``cls`` travels in into the spawn's options, and make sure
    the actor classes among its arguments (a supervisor's children) have theirs: they travel with
    their class (the codec writes it)."""
    code = rt.host.services.code
    if code is None:
        return  # (a node without the content plane ships nothing: targets must have the class)
    opts = call[4]
    if cls is not None and "code" not in opts:
        ticket = await code.shipper.ticket(cls)
        if ticket is not None:
            opts["code"] = ticket.to_wire()
    for other in _actor_classes([call[1], call[2]], 6):
        await code.shipper.ticket(other)


def _actor_classes(value: Any, depth: int) -> list[type]:
    """The classes of the ActorClass objects in ``value`` (lists, tuples and maps, ``depth`` deep)."""
    if isinstance(value, ActorClass):
        return [value.cls]
    if depth <= 0:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [c for v in value for c in _actor_classes(v, depth - 1)]
    return []


def _current_job() -> PeerId | None:
    """The job an actor spawned now belongs to: the calling actor's (None outside an actor, or for
    an actor this node owns itself: the target then takes the calling node as the job)."""
    me = current_actor()
    if me is None:
        return None
    rt = current_runtime()
    spawner = rt.host.services.spawner
    return spawner.jobs.of(me.name) if spawner is not None else None


async def offer_spawn(
    rt: Runtime,
    call: tuple[Any, ...],
    ranked: list[str],
    view: list[dict[str, Any]],
    trying: Callable[[PeerId], None] | None = None,
    code_for: type | None = None,
) -> ActorRef:
    """Offer a spawn (the spawner's arguments) to each ranked node in turn until one reserves
    and starts it; PlacementError if every one refused or could not be reached. ``code_for``:
    the class being spawned, whose code package (if it travels) goes with the offers."""
    await _attach_code(rt, code_for, call)
    refusals = []
    for i, peer_text in enumerate(ranked):
        peer = PeerId.from_string(peer_text)
        if trying is not None:
            trying(peer)
        if i:
            rt.placed(peer_text, view)
        try:
            if peer == rt.peer_id:
                if "spawner" not in rt.actors:  # (its actor stopped: the node is stopping)
                    raise NodeClosed("this node is shutting down")
                spawned: ActorRef = await rt.host.services.spawner.spawn(*call)
                return spawned
            ref: ActorRef = await rt.call(spawner_ref(peer), "spawn", call, {}, timeout=None)
            return ref
        except (PlacementError, PeerUnreachable) as e:
            refusals.append(f"{peer.short()}: {e}")
    raise PlacementError(f"every node that fit refused {call[3]!r}: " + "; ".join(refusals))


async def spawn_placed(
    rt: Runtime,
    call: tuple[Any, ...],
    need: dict[str, float],
    labels: dict[str, str],
    strategy: str = "spread",
    last: Set[str] = frozenset(),
) -> ActorRef:
    """Place and spawn (on the loop): rank the view (the nodes in ``last`` only as a last resort),
    then offer down the ranking."""
    view = rt.placement_view()
    code = call[4].get("code")
    what = placement.Spawnable(
        call[0], Ticket.from_wire(code).claims_admin() if code is not None else None, str(rt.peer_id)
    )
    ranked = placement.candidates(view, need, labels, strategy, rt.recent_placements(view), what, rt.host.trust.admin)
    ranked = [p for p in ranked if p not in last] + [p for p in ranked if p in last]
    rt.placed(ranked[0], view)
    return await offer_spawn(rt, call, ranked, view)


def _spawn_local(
    rt: Runtime, cls: type, args: list[Any], kwargs: dict[str, Any], name: str | None, opts: dict[str, Any]
) -> ActorRef:
    window = opts["window"]
    existing = rt.actors.get(name) if name is not None and opts.get("get_if_exists") else None
    if existing is not None and not existing.system:
        return existing.ref
    actor = rt.create(
        cls,
        args,
        kwargs or None,
        name,
        max_concurrency=opts["max_concurrency"],
        window=window,
        publish=name is not None,
    )
    spawner = rt.host.services.spawner
    if spawner is not None and "job" in opts:
        spawner.jobs.adopt(actor.name, PeerId.from_string(opts["job"]))  # spawned by an actor of that job
    ref = ActorRef(rt.peer_id, actor.name, actor.methods, window)
    spawn = rt.loop.create_future()

    def started(ready: asyncio.Future[Any]) -> None:
        failure = ready.result()
        if failure is None:
            spawn.set_result(ref)
        else:
            spawn.set_exception(
                SpawnError(f"{class_path(cls)} failed to start: {failure[0]}: {failure[1]}\n{failure[2]}".rstrip())
            )
            spawn.exception()

    actor.ready.add_done_callback(started)
    ref._spawn = spawn
    return ref


def public(method: F) -> F:
    """Method decorator: strangers (peers outside this node's mesh) may call this method of an
    ``@lattica.actor`` class; its other methods stay members-only. Check who is calling with
    ``lattica.current_caller()`` inside it if it must tell callers apart."""
    setattr(method, PUBLIC_ATTR, True)
    return method


def actor(
    cls: type | None = None, *, max_concurrency: int | None = None, window: int | None = None, public: bool = False
) -> Any:
    """Class decorator: ``@lattica.actor`` or ``@lattica.actor(max_concurrency=..., window=...)``.
    Actors serve the members of their node's mesh only; ``public=True`` opens every method to
    strangers too (a public inference service), ``@lattica.public`` opens one method."""

    def wrap(c: type) -> ActorClass:
        if not isinstance(c, type):
            raise TypeError("@lattica.actor decorates classes")
        if public:
            setattr(c, PUBLIC_ATTR, True)
        opts = {k: v for k, v in (("max_concurrency", max_concurrency), ("window", window)) if v is not None}
        return ActorClass(c, opts)

    return wrap(cls) if cls is not None else wrap


class ShippedClass(NamedTuple):
    """An actor class received from a peer whose code travels: its path and the ticket of its
    package (the spawner checks the ticket when a spawn uses it)."""

    path: str
    code: list[Any]


def _encode_class(c: ActorClass) -> Any:
    """A class in a call (a supervisor's child): its path, and the ticket of its code if it travels
    (made now if this is the first time: the call cannot wait for it)."""
    ticket = known_ticket(c.cls)
    if ticket is None:
        try:
            code = current_runtime().host.services.code
        except NodeClosed:
            code = None
        ticket = code.shipper.ticket_now(c.cls) if code is not None else None
    return class_path(c.cls) if ticket is None else [class_path(c.cls), ticket.to_wire()]


def _decode_class(value: Any) -> str | ShippedClass:
    if type(value) is str:
        return value
    if type(value) is list and len(value) == 2 and type(value[0]) is str and type(value[1]) is list:
        return ShippedClass(value[0], value[1])
    raise ValueError("malformed actor class")


# an actor class travels as its path, with its code's ticket if it has one (a supervisor's child
# spec names the class to spawn): every node must decode it, so it is registered with the class
codec.register_ext(20, ActorClass, _encode_class, _decode_class)
