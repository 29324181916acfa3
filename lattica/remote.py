"""``@lattica.actor``: the user's classes as actors, spawned anywhere and called with futures.

Spelling follows Ray: ``Cls.remote(...)`` / ``Cls.options(node=..., name=...).remote(...)`` spawn
and return an ``ActorRef``; ``ref.method.remote(...)`` returns a ``lattica.Future``,
``.tell(...)`` sends without a reply, ``.stream(...)`` iterates a generator method's items.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Callable, TypeVar

from lattica import codec, placement
from lattica.errors import NodeClosed, PeerUnreachable, PlacementError, SpawnError
from lattica.identity import PeerId
from lattica.runtime.refs import PUBLIC_ATTR
from lattica.runtime import DEFAULT_MAX_CONCURRENCY, DEFAULT_WINDOW, ActorRef, MethodHandle, Runtime, StreamCall, current_runtime, method_table, on_loop, spawner_ref

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["actor", "ActorClass", "MethodHandle", "StreamCall", "current_runtime"]


def class_path(cls: type) -> str:
    """``module.Class``, the name a spawner imports. A class defined in the script being run is
    named after the script (``python train.py`` -> ``train.Class``; ``python -m pkg.train`` ->
    ``pkg.train.Class``): other nodes import it under that name, never as ``__main__``."""
    module = cls.__module__
    if module == "__main__":
        module = _main_module_name() or module
    return f"{module}.{cls.__qualname__}"


def _main_module_name() -> str | None:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return spec.name
    path = getattr(main, "__file__", None)
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
    ) -> ActorClass:
        """Spawn options: target ``node`` (PeerId; default this node), actor ``name`` (unique on
        its node), async ``max_concurrency`` (1000), per-caller mailbox ``window`` (1024 calls).
        Without ``node``, any of ``resources`` ({"cpu": 1, "memory": bytes, "gpus": 1}),
        ``labels`` and ``placement`` ("spread" or "pack") choose the node from the membership
        view and reserve the resources there (see ``docs/membership.md``)."""
        opts = dict(self._options)
        for key, value in (
            ("node", node), ("name", name), ("max_concurrency", max_concurrency), ("window", window),
            ("resources", resources), ("labels", labels), ("placement", placement),
        ):
            if value is not None:
                opts[key] = value
        if "node" in opts and any(k in opts for k in ("resources", "labels", "placement")):
            raise ValueError("give node=, or resources/labels/placement for the runtime to choose one, not both")
        return ActorClass(self.cls, opts)

    def remote(self, *args: Any, **kwargs: Any) -> ActorRef:
        """Spawn the actor; returns its ref at once (the constructor runs where the actor lives;
        if it fails, calls through the ref raise SpawnError)."""
        rt = current_runtime()
        node = self._options.get("node")
        target = PeerId.from_string(node) if isinstance(node, str) else (node or rt.peer_id)
        max_conc = self._options.get("max_concurrency", DEFAULT_MAX_CONCURRENCY)
        window = self._options.get("window", DEFAULT_WINDOW)
        name = self._options.get("name")
        if any(k in self._options for k in ("resources", "labels", "placement")):
            return on_loop(rt, lambda: self._spawn_placed(rt, list(args), kwargs, name, max_conc, window))
        if target == rt.peer_id:
            return on_loop(rt, lambda: _spawn_local(rt, self.cls, list(args), kwargs, name, max_conc, window))
        name = name or f"{self.cls.__name__}-{os.urandom(5).hex()}"
        ref = ActorRef(target, name, self._methods, window)
        spawner = spawner_ref(target)
        opts = {"max_concurrency": max_conc, "window": window, "publish": self._options.get("name") is not None}
        call = (class_path(self.cls), list(args), kwargs or None, name, opts)
        ref._spawn = on_loop(rt, lambda: rt.call(spawner, "spawn", call, {}, timeout=None))
        return ref

    def _spawn_placed(self, rt: Runtime, args: list, kwargs: dict, name: str | None, max_conc: int, window: int) -> ActorRef:
        """On the loop: rank the nodes that fit (PlacementError now if none does), aim the ref at
        the best one and return it; the spawn moves down the list while spawners refuse, and calls
        made through the ref wait for the outcome (so they reach the node that accepted)."""
        need = dict(self._options.get("resources") or {})
        labels = dict(self._options.get("labels") or {})
        view = rt.placement_view()
        ranked = placement.candidates(view, need, labels, self._options.get("placement", "spread"), rt.recent_placements(view))
        name = name or f"{self.cls.__name__}-{os.urandom(5).hex()}"
        ref = ActorRef(PeerId.from_string(ranked[0]), name, self._methods, window)
        opts = {"max_concurrency": max_conc, "window": window, "publish": self._options.get("name") is not None, "reserve": need}
        if labels:
            opts["labels"] = labels
        spawn = rt.loop.create_future()
        ref._spawn = spawn
        call = (class_path(self.cls), args, kwargs or None, name, opts)
        rt.placed(ranked[0], view)  # now, so the next .remote() in this same breath ranks with it
        rt.host.spawn(_place(rt, ref, spawn, call, ranked, view))
        return ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor class {self.__name__} cannot be instantiated directly; use {self.__name__}.remote(...)")

    def __repr__(self) -> str:
        return f"<actor class {class_path(self.cls)}>"


async def _place(rt: Runtime, ref: ActorRef, spawn: asyncio.Future, call: tuple, ranked: list[str], view: list) -> None:
    """Settle a placed ref's spawn with the outcome of offering it down the ranking."""

    def trying(peer: PeerId) -> None:
        ref.peer_id = peer  # held calls are sent where the spawn finally lands

    try:
        await offer_spawn(rt, call, ranked, view, trying)
    except BaseException as e:  # noqa: BLE001 -- told to the ref's callers
        if not spawn.done():
            spawn.set_exception(e)
            spawn.exception()
        return
    if not spawn.done():
        spawn.set_result(ref)


async def offer_spawn(rt: Runtime, call: tuple, ranked: list[str], view: list, trying: Callable[[PeerId], None] | None = None) -> ActorRef:
    """Offer a spawn (the spawner's arguments) to each ranked node in turn until one reserves
    and starts it; PlacementError if every one refused or could not be reached."""
    refusals = []
    for i, peer_text in enumerate(ranked):
        peer = PeerId.from_string(peer_text)
        if trying is not None:
            trying(peer)
        if i:
            rt.placed(peer_text, view)
        try:
            if peer == rt.peer_id:
                spawner = rt.actors.get("spawner")
                if spawner is None:
                    raise NodeClosed("this node is shutting down")
                return await spawner.instance.spawn(*call)
            return await rt.call(spawner_ref(peer), "spawn", call, {}, timeout=None)
        except (PlacementError, PeerUnreachable) as e:
            refusals.append(f"{peer.short()}: {e}")
    raise PlacementError(f"every node that fit refused {call[3]!r}: " + "; ".join(refusals))


async def spawn_placed(rt: Runtime, call: tuple, need: dict, labels: dict, strategy: str = "spread", last: set[str] = frozenset()) -> ActorRef:
    """Place and spawn (on the loop): rank the view (the nodes in ``last`` only as a last resort),
    then offer down the ranking."""
    view = rt.placement_view()
    ranked = placement.candidates(view, need, labels, strategy, rt.recent_placements(view))
    ranked = [p for p in ranked if p not in last] + [p for p in ranked if p in last]
    rt.placed(ranked[0], view)
    return await offer_spawn(rt, call, ranked, view)


def _spawn_local(rt: Runtime, cls: type, args: list, kwargs: dict, name: str | None, max_conc: int, window: int) -> ActorRef:
    actor = rt.create(cls, args, kwargs or None, name, max_concurrency=max_conc, window=window, publish=name is not None)
    ref = ActorRef(rt.peer_id, actor.name, actor.methods, window)
    spawn = rt.loop.create_future()

    def started(ready: asyncio.Future) -> None:
        failure = ready.result()
        if failure is None:
            spawn.set_result(ref)
        else:
            spawn.set_exception(SpawnError(f"{class_path(cls)} failed to start: {failure[0]}: {failure[1]}\n{failure[2]}".rstrip()))
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


def actor(cls: type | None = None, *, max_concurrency: int | None = None, window: int | None = None, public: bool = False) -> Any:
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


# an actor class travels as its path (a supervisor's child spec names the class to spawn): every
# node must decode it, so it is registered with the class, not with what sends it
codec.register_ext(20, ActorClass, lambda c: class_path(c.cls), lambda p: p if type(p) is str else _bad_class())


def _bad_class() -> str:
    raise ValueError("malformed actor class path")
