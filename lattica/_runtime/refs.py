"""Refs and method handles: ``ActorRef`` (codec extension 18) and its method table, ``StreamArg``
(extension 19), the caller's side of a call (``MethodHandle``, ``StreamCall``) and which runtime a
call from this thread goes through."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from lattica import _context as context
from lattica import codec
from lattica._future import Future
from lattica._identity import PeerId
from lattica._runtime.limits import AGEN, ASYNC, DEFAULT_WINDOW, GEN, LIFECYCLE_HOOKS, SYNC
from lattica._runtime.window import ItemWindow
from lattica.errors import (
    LatticaError,
    MethodNotFound,
    NodeClosed,
    PermissionDenied,
    ProtocolError,
    Timeout,
)

if TYPE_CHECKING:
    from lattica._runtime.registry import Runtime


CALLER: contextvars.ContextVar[PeerId | None] = contextvars.ContextVar("lattica_caller", default=None)


ACTOR: contextvars.ContextVar[ActorRef | None] = contextvars.ContextVar("lattica_actor", default=None)


def current_actor() -> ActorRef | None:
    """The ref of the actor whose method (or ``on_start`` hook) is running, else None."""
    return ACTOR.get()


def current_caller() -> PeerId | None:
    """The PeerId of the node whose call this actor method is serving (authenticated by the
    connection; this node's own id for local calls), or None outside an actor method."""
    return CALLER.get()


PUBLIC_ATTR = "__lattica_public__"  # on a class (True) or a method: open to strangers


def public_methods(cls: type, methods: dict[str, str]) -> frozenset[str]:
    """The methods of ``cls`` that strangers (peers outside our mesh) may call: all of them if
    the class was declared ``@lattica.actor(public=True)``, else those marked ``@lattica.public``."""
    if getattr(cls, PUBLIC_ATTR, False) is True:
        return frozenset(methods)
    return frozenset(m for m in methods if getattr(getattr(cls, m, None), PUBLIC_ATTR, False) is True)


def method_table(cls: type) -> dict[str, str]:
    """Public methods of an actor class and how each runs (async, sync, agen, gen)."""
    table = {}
    for name, fn in inspect.getmembers(cls, callable):
        if (
            name.startswith("_")
            or name in LIFECYCLE_HOOKS
            or isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod, type))
        ):
            continue
        if inspect.isasyncgenfunction(fn):
            table[name] = AGEN
        elif inspect.iscoroutinefunction(fn):
            table[name] = ASYNC
        elif inspect.isgeneratorfunction(fn):
            table[name] = GEN
        else:
            table[name] = SYNC
    return table


class ActorRef:
    """A handle to an actor anywhere on the mesh: (PeerId, name, method table). A value: it encodes
    in the codec, so it can be passed to other actors and used from any node."""

    __slots__ = ("peer_id", "name", "methods", "window", "stable", "supervisor", "_spawn", "_held", "_handles")

    def __init__(
        self,
        peer_id: PeerId,
        name: str,
        methods: dict[str, str],
        window: int = DEFAULT_WINDOW,
        stable: bool = False,
        supervisor: ActorRef | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.name = name
        self.methods = methods
        self.window = window
        # stable: the ref follows its actor by name (a supervised child restarted elsewhere): when
        # the actor is gone, the runtime resolves the name again through the DHT registry
        self.stable = stable
        # a stable ref's supervisor: the one authority on where its actor lives now (the ref asks
        # it, not the DHT, where to follow; itself a stable ref when the supervisor is supervised)
        self.supervisor = supervisor if stable else None
        self._spawn: Any = None  # the spawn's outcome, when this ref was made by spawning
        self._held: list | None = None  # calls waiting for that outcome, in order
        self._handles: dict[str, Any] = {}

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        h = self._handles.get(method)
        if h is None:
            if method not in self.methods:
                raise MethodNotFound(
                    f"actor {self.name!r} has no public method {method!r} (it has: {', '.join(sorted(self.methods)) or 'none'})"
                )
            h = self._handles[method] = MethodHandle(self, method, self.methods[method])
        return h

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ActorRef):
            return False
        if self.stable and other.stable:
            return other.name == self.name  # the same logical actor, wherever it lives now
        return other.peer_id == self.peer_id and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name) if self.stable else hash((self.peer_id, self.name))

    def __repr__(self) -> str:
        return f"ActorRef({self.name!r} on {self.peer_id.short()})"

    def __reduce__(self) -> Any:
        raise TypeError("ActorRefs travel through the Lattica codec, never through pickle")


def spawner_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s spawner system actor (its method table is fixed by the protocol)."""
    return ActorRef(
        peer,
        "spawner",
        {
            "spawn": ASYNC,
            "kill": ASYNC,
            "lookup": ASYNC,
            "names": ASYNC,
            "monitor": ASYNC,
            "demonitor": ASYNC,
            "down": ASYNC,
            "link": ASYNC,
            "unlink": ASYNC,
        },
    )


def autonat_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s autonat system actor."""
    return ActorRef(peer, "autonat", {"check": ASYNC, "dial_for": ASYNC})


def relay_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s relay system actor."""
    return ActorRef(peer, "relay", {"reserve": ASYNC, "status": ASYNC})


_MAX_SUPERVISORS = 16  # supervisors above a stable ref that travel with it


def _ref_to_obj(ref: ActorRef, depth: int = 0) -> list:
    obj = [ref.peer_id.to_bytes(), ref.name, ref.methods, ref.window]
    if not ref.stable:
        return obj
    if ref.supervisor is None or depth >= _MAX_SUPERVISORS:
        return obj + [True]
    return obj + [True, _ref_to_obj(ref.supervisor, depth + 1)]


def _ref_from_obj(obj: Any, depth: int = 0) -> ActorRef:
    if type(obj) is not list or len(obj) not in (4, 5, 6) or (len(obj) >= 5 and obj[4] is not True):
        raise ValueError("malformed ActorRef")
    pid, name, methods, window = obj[:4]
    if type(name) is not str or type(methods) is not dict or type(window) is not int or not 0 < window <= 1 << 20:
        raise ValueError("malformed ActorRef fields")
    if not all(type(k) is str and v in (ASYNC, SYNC, AGEN, GEN) for k, v in methods.items()):
        raise ValueError("malformed ActorRef method table")
    supervisor = None
    if len(obj) == 6:
        if depth >= _MAX_SUPERVISORS:
            raise ValueError("an ActorRef nests too many supervisors")
        supervisor = _ref_from_obj(obj[5], depth + 1)
    return ActorRef(PeerId.from_bytes(bytes(pid)), name, methods, window, len(obj) >= 5, supervisor)


class StreamArg:
    """Placeholder for an argument that is a stream (client streaming): its index on the call."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


codec.register_ext(18, ActorRef, _ref_to_obj, _ref_from_obj)


codec.register_ext(
    19,
    StreamArg,
    lambda s: s.index,
    lambda i: StreamArg(int(i)) if type(i) is int and 0 <= i < 64 else _bad_stream_arg(),
)


def _bad_stream_arg() -> StreamArg:
    raise ValueError("malformed stream argument index")


def current_runtime() -> Runtime:
    """The runtime calls from this thread go through: the node whose loop or actor thread this is,
    else the default node of ``lattica.init()``."""
    rt = context.runtime_for_thread()
    if rt is not None:
        return rt
    node = context.default_node()
    host = node.host if node is not None else None
    if host is None or host.runtime is None:  # (a host has its runtime once it starts)
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


def run_coroutine(rt: Runtime, make: Callable[[], Any], convert: Callable[[Any], Any] | None = None) -> Future:
    """Start the coroutine ``make()`` returns as a task on ``rt``'s loop; a :class:`Future` of its
    result (through ``convert``), awaitable anywhere and blocking with ``.result()``. Cancelling
    the Future cancels the task. What the module-level APIs (``lattica.dht``, ``lattica.content``)
    are built on."""

    def start() -> Future:
        fut = Future(rt.loop)
        task = rt.loop.create_task(make())

        def done(t: asyncio.Task) -> None:
            if t.cancelled():
                fut._reject(asyncio.CancelledError())
            elif t.exception() is not None:
                fut._reject(t.exception())  # type: ignore[arg-type]
            else:
                try:
                    fut._resolve(convert(t.result()) if convert else t.result())
                except Exception as e:  # noqa: BLE001 -- e.g. an undecodable value
                    fut._reject(e)

        task.add_done_callback(done)
        fut._cancel_hook = cast("Callable[[], None]", task.cancel)  # (called with no argument; its bool unused)
        return fut

    return on_loop(rt, start)


class MethodHandle:
    """``ref.method``: ``.remote(...)``, ``.tell(...)``, ``.stream(...)``, ``.options(...)``."""

    __slots__ = ("_ref", "_name", "_kind", "_timeout", "_block", "_idempotent")

    def __init__(
        self,
        ref: ActorRef,
        name: str,
        kind: str,
        timeout: float | None = None,
        block: bool = True,
        idempotent: bool = False,
    ) -> None:
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


@overload
def _submit(h: MethodHandle, args: tuple, kwargs: dict, *, tell: Literal[False], stream: None = None) -> Future: ...


@overload
def _submit(
    h: MethodHandle, args: tuple, kwargs: dict, *, tell: bool, stream: _StreamState | None = None
) -> Future | None: ...


def _submit(
    h: MethodHandle, args: tuple, kwargs: dict, *, tell: bool, stream: _StreamState | None = None
) -> Future | None:
    rt = stream._rt if stream is not None else current_runtime()
    if threading.get_ident() == rt.host.thread_id:
        return rt.call(
            h._ref,
            h._name,
            args,
            kwargs,
            timeout=h._timeout,
            tell=tell,
            stream=stream,
            block=h._block,
            idempotent=h._idempotent,
        )
    # Another thread: build and encode the call here (codec errors raise in this thread, tells
    # included), wait for a slot in this actor's gate (backpressure), then hand it to the loop.
    gate = rt.gate(h._ref)
    gate.acquire(h._ref.window, h._block, h._ref.name, alive=lambda: not rt.host.closing)
    try:
        p = rt.prepare(
            h._ref,
            h._name,
            args,
            kwargs,
            timeout=h._timeout,
            tell=tell,
            stream=stream,
            encode=True,
            idempotent=h._idempotent,
        )
    except BaseException:
        gate.release()
        raise
    p.gate = gate
    if not rt.post(lambda: rt.submit_threadsafe(p, h._block)):
        gate.release()
        raise NodeClosed(f"node {rt.peer_id} has stopped; no calls can be made through it")
    return p.future


class _StreamState:
    """A streaming call's items and credit (``window.ItemWindow``: how far ahead the producer may
    send and when it gets more); the runtime holds this, the user a StreamCall. A producer that
    sends more items than it was ever granted is cut off (ProtocolError)."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._items: collections.deque = collections.deque()
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._cond: threading.Condition | None = None
        self._grant: Callable[[int, int], None] | None = None  # (credit, items taken of it)
        self._cancel: Callable[[], None] | None = None
        self._credit = ItemWindow()

    # -- fed on the node loop ------------------------------------------------------------------

    def _bind(
        self,
        grant: Callable[[int, int], None],
        cancel: Callable[[], None],
        rtt: Callable[[], float | None] | None = None,
    ) -> None:
        self._grant, self._cancel = grant, cancel
        self._credit.start(rtt)
        if self._done:  # the consumer gave up before the call was sent: stop it at once
            cancel()

    def _push(self, value: Any, nbytes: int = 0) -> None:
        if self._done:
            return
        why = self._credit.received(nbytes)
        if why is not None:  # a broken or hostile producer
            self._fail(ProtocolError(f"stream cut off: {why}"))
            if self._cancel is not None:
                self._cancel()
            return
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
        """Return credit to the producer as the window says (on the loop)."""
        g = self._credit.took()
        if g is not None and self._grant is not None and not self._done:
            self._grant(*g)

    # -- async consumers ------------------------------------------------------------------------

    async def anext(self) -> Any:
        if asyncio.get_running_loop() is not self._rt.loop:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.anext(), self._rt.loop))
        while not self._items:
            if self._done:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._credit.starved = True
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
                self._credit.starved = True
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


def require_caller(*allowed: PeerId | str) -> PeerId:
    """Inside an actor method: return the caller, or raise PermissionDenied unless it is one of
    ``allowed``: PeerIds, the circles ``"self"`` and ``"member"`` (this node, members of its
    mesh), or ``"owner"`` (whoever controls this actor: the node that created it, its
    supervisor's node, this node, or an administrator of the mesh). An ACL for a method opened to
    strangers with ``@lattica.public``: ``lattica.require_caller("member", alice)``."""
    caller = current_caller()
    me = current_actor()
    if caller is None or me is None:
        raise LatticaError("lattica.require_caller is called from inside an actor method")
    rt = current_runtime()
    circle = rt.host.circle_of(caller)
    ids = {a if isinstance(a, PeerId) else PeerId.from_string(a) for a in allowed if a not in _CIRCLES}
    if caller in ids or circle in allowed or (circle == "self" and "member" in allowed):
        return caller
    if "owner" in allowed and rt.host.services.spawner.controls(me.name, caller):
        return caller
    raise PermissionDenied(
        f"{caller} may not call this (allowed: {', '.join(str(a) for a in allowed) or 'nobody'}; the caller is a {circle})"
    )


_CIRCLES = ("self", "member", "owner")
