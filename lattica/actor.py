"""``@lattica.actor``: the user's classes as actors, spawned anywhere and called with futures.

Spelling follows Ray: ``Cls.remote(...)`` / ``Cls.options(node=..., name=...).remote(...)`` spawn
and return an ``ActorRef``; ``ref.method.remote(...)`` returns a ``lattica.Future``,
``.tell(...)`` sends without a reply, ``.stream(...)`` iterates a generator method's items.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import threading
from typing import Any, Callable

from lattica import context, placement
from lattica.errors import NodeClosed, PeerUnreachable, PlacementError, SpawnError, Timeout
from lattica.future import Future
from lattica.identity import PeerId
from lattica.runtime import DEFAULT_MAX_CONCURRENCY, DEFAULT_WINDOW, STREAM_WINDOW, ActorRef, Runtime, method_table, spawner_ref

__all__ = ["actor", "ActorClass", "MethodHandle", "StreamCall", "current_runtime"]


def current_runtime() -> Runtime:
    """The runtime calls from this thread go through: the node whose loop or actor thread this is,
    else the default node of ``lattica.init()``."""
    rt = context.runtime_for_thread()
    if rt is not None:
        return rt
    node = context.default_node()
    host = node.host if node is not None else None
    if host is None:
        raise NodeClosed("no Lattica node is running here: call lattica.init() first")
    return host.runtime


def on_loop(rt: Runtime, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on the node loop and return its result (directly when already there)."""
    if threading.get_ident() == rt.host.thread_id:
        return fn()
    done = threading.Event()
    box: list = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller's thread
            box.append((False, e))
        done.set()

    rt.post(run)
    if not done.wait(30):
        raise Timeout("the node loop did not answer within 30 s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


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


def actor(cls: type | None = None, *, max_concurrency: int | None = None, window: int | None = None) -> Any:
    """Class decorator: ``@lattica.actor`` or ``@lattica.actor(max_concurrency=..., window=...)``."""

    def wrap(c: type) -> ActorClass:
        if not isinstance(c, type):
            raise TypeError("@lattica.actor decorates classes")
        opts = {k: v for k, v in (("max_concurrency", max_concurrency), ("window", window)) if v is not None}
        return ActorClass(c, opts)

    return wrap(cls) if cls is not None else wrap


class MethodHandle:
    """``ref.method``: ``.remote(...)``, ``.tell(...)``, ``.stream(...)``, ``.options(...)``."""

    __slots__ = ("_ref", "_name", "_kind", "_timeout", "_block", "_idempotent")

    def __init__(self, ref: ActorRef, name: str, kind: str, timeout: float | None = None, block: bool = True, idempotent: bool = False) -> None:
        self._ref = ref
        self._name = name
        self._kind = kind
        self._timeout = timeout
        self._block = block
        self._idempotent = idempotent

    def options(self, *, timeout: float | None = None, block: bool = True, idempotent: bool = False) -> MethodHandle:
        """Per-call options: ``timeout`` seconds (enforced by caller and callee; CallTimeout),
        ``block=False`` (raise MailboxFull instead of waiting for room in the mailbox), and
        ``idempotent=True`` (safe to run twice: through a stable ref, a call in flight when its
        actor went away is sent again to the next incarnation instead of raising ActorRestarted)."""
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be a positive number of seconds")
        return MethodHandle(self._ref, self._name, self._kind, timeout, block, idempotent)

    def remote(self, *args: Any, **kwargs: Any) -> Future:
        """Call the method; returns a Future of its result."""
        if self._kind in ("agen", "gen"):
            raise TypeError(f"{self._name} is a generator method: iterate {self._name}.stream(...) instead")
        return _submit(self, args, kwargs, tell=False)

    def tell(self, *args: Any, **kwargs: Any) -> None:
        """Call the method without waiting for (or receiving) a result."""
        if self._kind in ("agen", "gen"):
            raise TypeError(f"{self._name} is a generator method: iterate {self._name}.stream(...) instead")
        _submit(self, args, kwargs, tell=True)

    def stream(self, *args: Any, **kwargs: Any) -> StreamCall:
        """Call a generator method; iterate the result with ``async for`` or plain ``for``."""
        if self._kind not in ("agen", "gen"):
            raise TypeError(f"{self._name} is not a generator method: use {self._name}.remote(...)")
        rt = current_runtime()
        sc = StreamCall(rt)
        _submit(self, args, kwargs, tell=False, stream=sc._state)
        return sc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor methods are called with .remote(...): {self._ref.name}.{self._name}.remote()")


def _submit(h: MethodHandle, args: tuple, kwargs: dict, *, tell: bool, stream: _StreamState | None = None) -> Future | None:
    rt = stream._rt if stream is not None else current_runtime()
    if threading.get_ident() == rt.host.thread_id:
        return rt.call(h._ref, h._name, args, kwargs, timeout=h._timeout, tell=tell, stream=stream, block=h._block, idempotent=h._idempotent)
    # Another thread: build and encode the call here (codec errors raise in this thread, tells
    # included), wait for a slot in this actor's gate (backpressure), then hand it to the loop.
    gate = rt.gate(h._ref)
    gate.acquire(h._ref.window, h._block, h._ref.name, alive=lambda: not rt.host.closing)
    try:
        p = rt.prepare(h._ref, h._name, args, kwargs, timeout=h._timeout, tell=tell, stream=stream, encode=True, idempotent=h._idempotent)
    except BaseException:
        gate.release()
        raise
    p.gate = gate
    if not rt.post(lambda: rt.submit_threadsafe(p, h._block)):
        gate.release()
        raise NodeClosed(f"node {rt.peer_id} has stopped; no calls can be made through it")
    return p.future


class _StreamState:
    """A streaming call's items and credit; the runtime holds this, the user a StreamCall."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._items: collections.deque = collections.deque()
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._cond: threading.Condition | None = None
        self._grant: Callable[[int], None] | None = None
        self._cancel: Callable[[], None] | None = None
        self._consumed = 0

    # -- fed on the node loop ------------------------------------------------------------------

    def _bind(self, grant: Callable[[int], None], cancel: Callable[[], None]) -> None:
        self._grant, self._cancel = grant, cancel
        if self._done:  # the consumer gave up before the call was sent: stop it at once
            cancel()

    def _push(self, value: Any) -> None:
        self._items.append(value)
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._done = True
            self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        c = self._cond
        if c is not None:
            with c:
                c.notify_all()

    def _took_one(self) -> None:
        """Return credit to the producer in batches of half a window (on the loop)."""
        self._consumed += 1
        if self._consumed >= STREAM_WINDOW // 2 and self._grant is not None and not self._done:
            n, self._consumed = self._consumed, 0
            self._grant(n)

    # -- async consumers ------------------------------------------------------------------------

    async def anext(self) -> Any:
        if asyncio.get_running_loop() is not self._rt.loop:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.anext(), self._rt.loop))
        while not self._items:
            if self._done:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = self._rt.loop.create_future()
            await self._waiter
        value = self._items.popleft()
        self._took_one()
        return value

    # -- sync consumers (any thread but the node loop) ------------------------------------------

    def next(self) -> Any:
        if threading.get_ident() == self._rt.host.thread_id:
            raise RuntimeError("on the node loop, iterate the stream with `async for`")
        if self._cond is None:
            self._cond = threading.Condition()
        with self._cond:
            while not self._items and not self._done:
                self._cond.wait(0.5)
            if not self._items:
                if self._error is not None:
                    raise self._error
                raise StopIteration
            value = self._items.popleft()
        self._rt.post(self._took_one)
        return value

    def cancel(self) -> None:
        """Stop the producer; no more items arrive (also what ``close`` and ``break`` do)."""
        if self._done:
            return
        cancel = self._cancel
        self._fail(asyncio.CancelledError("stream cancelled by the consumer"))
        if cancel is not None:  # not yet sent: _bind cancels it when it is
            if threading.get_ident() == self._rt.host.thread_id:
                cancel()
            else:
                self._rt.post(cancel)



class StreamCall:
    """The items of a generator method, in order, under credit: ``async for`` or ``for``.
    ``close()`` (or dropping it, e.g. after ``break``) stops the producer."""

    __slots__ = ("_state", "__weakref__")

    def __init__(self, rt: Runtime) -> None:
        self._state = _StreamState(rt)

    def __aiter__(self) -> StreamCall:
        return self

    async def __anext__(self) -> Any:
        return await self._state.anext()

    def __iter__(self) -> StreamCall:
        return self

    def __next__(self) -> Any:
        return self._state.next()

    def cancel(self) -> None:
        """Stop the producer; no more items arrive."""
        self._state.cancel()

    close = cancel

    async def aclose(self) -> None:
        self._state.cancel()

    def __del__(self) -> None:
        # the runtime holds only the state, so a consumer that stops iterating and drops the
        # stream (e.g. `break` out of `for`) releases the producer here
        state = self._state
        if not state._done:
            try:
                state.cancel()
            except Exception:
                pass
