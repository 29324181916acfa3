"""The actor runtime of one node: local actors, their mailboxes, and the call channels.

Everything here runs on the node loop except the sync-method jobs, which run on each actor's own
pykka thread and post their results back in batches.

* **Mailboxes and backpressure.** Each caller (a remote connection, or this node itself) holds a
  credit of ``window`` calls per target actor; a call spends one, its reply gives it back. Calls
  beyond the credit wait at the caller, in order, so every actor's mailbox is bounded by
  ``window`` per caller and per-caller FIFO order holds end to end.
* **Execution.** Async methods start eagerly on the loop (most finish without ever suspending and
  never become tasks), at most ``max_concurrency`` at a time; sync methods run one at a time on the
  actor's thread; generators stream items under credit granted by the consumer.
* **Channels.** One ``/lattica/rpc/1`` stream per connection and direction carries calls one way
  and replies the other (wire format in ``rpc.py``); writes are batched per loop iteration.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import fnmatch
import importlib
import inspect
import itertools
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Mapping

import pykka

from lattica import codec, context, rpc
from lattica._eager import eager_task
from lattica.logging import get_logger
from lattica.errors import (
    ActorDied,
    ActorNotFound,
    ActorRestarted,
    CallTimeout,
    LatticaError,
    MailboxFull,
    MethodNotFound,
    NodeClosed,
    PeerUnreachable,
    PlacementError,
    ProtocolError,
    SpawnError,
    Timeout,
    remote_error,
)
from lattica.future import Future
from lattica.identity import PeerId
from lattica.transports.base import PROBE_TIMEOUT, Connection, Stream

if TYPE_CHECKING:
    from lattica.monitors import Monitors
    from lattica.actors.dht import DhtService
    from lattica.node import _Host

log = get_logger("lattica.runtime")

ASYNC, SYNC, AGEN, GEN = "async", "sync", "agen", "gen"
DEFAULT_WINDOW = 1024  # calls in flight per caller per actor (the mailbox share of one caller)
DEFAULT_MAX_CONCURRENCY = 1000  # async calls running at once per actor (Ray's default)
STREAM_WINDOW = 16  # items a stream producer may send ahead of its consumer
MAX_MESSAGE = codec.DEFAULT_LIMITS.max_frame
_CHANNEL_HIGH_WATER = 16 * 1024 * 1024  # unsent bytes on a channel before calls wait at the caller
_MAX_STREAM_ARGS = 64
_CHANNEL_IDLE = 60.0  # seconds a call channel with nothing in flight stays open

_CALLER: contextvars.ContextVar[PeerId | None] = contextvars.ContextVar("lattica_caller", default=None)


_ACTOR: contextvars.ContextVar[ActorRef | None] = contextvars.ContextVar("lattica_actor", default=None)


def current_actor() -> ActorRef | None:
    """The ref of the actor whose method (or ``on_start`` hook) is running, else None."""
    return _ACTOR.get()


def current_caller() -> PeerId | None:
    """The PeerId of the node whose call this actor method is serving (authenticated by the
    connection; this node's own id for local calls), or None outside an actor method."""
    return _CALLER.get()


LIFECYCLE_HOOKS = frozenset({"on_start", "on_stop", "restore"})  # called by the runtime, never by peers
BUILTIN_ACTORS = ("lattica.supervisor.Supervisor",)  # actor classes any peer may spawn on any node
NO_STATE: Any = object()  # spawned without a checkpoint to restore
MAX_ACTORS = 10_000  # actors per node: every spawn beyond it is refused


def method_table(cls: type) -> dict[str, str]:
    """Public methods of an actor class and how each runs (async, sync, agen, gen)."""
    table = {}
    for name, fn in inspect.getmembers(cls, callable):
        if name.startswith("_") or name in LIFECYCLE_HOOKS or isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod, type)):
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

    __slots__ = ("peer_id", "name", "methods", "window", "stable", "_spawn", "_held", "_handles")

    def __init__(self, peer_id: PeerId, name: str, methods: dict[str, str], window: int = DEFAULT_WINDOW, stable: bool = False) -> None:
        self.peer_id = peer_id
        self.name = name
        self.methods = methods
        self.window = window
        # stable: the ref follows its actor by name (a supervised child restarted elsewhere): when
        # the actor is gone, the runtime resolves the name again through the DHT registry
        self.stable = stable
        self._spawn: Any = None  # the spawn's outcome, when this ref was made by spawning
        self._held: list | None = None  # calls waiting for that outcome, in order
        self._handles: dict[str, Any] = {}

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        h = self._handles.get(method)
        if h is None:
            if method not in self.methods:
                raise AttributeError(f"actor {self.name!r} has no public method {method!r} (it has: {', '.join(sorted(self.methods)) or 'none'})")
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
    return ActorRef(peer, "spawner", {"spawn": ASYNC, "kill": ASYNC, "lookup": ASYNC, "names": ASYNC, "monitor": ASYNC, "demonitor": ASYNC, "down": ASYNC, "link": ASYNC, "unlink": ASYNC})


def _ref_to_obj(ref: ActorRef) -> list:
    obj = [ref.peer_id.to_bytes(), ref.name, ref.methods, ref.window]
    return obj + [True] if ref.stable else obj


def _ref_from_obj(obj: Any) -> ActorRef:
    if type(obj) is not list or len(obj) not in (4, 5) or (len(obj) == 5 and obj[4] is not True):
        raise ValueError("malformed ActorRef")
    pid, name, methods, window = obj[:4]
    if type(name) is not str or type(methods) is not dict or type(window) is not int or not 0 < window <= 1 << 20:
        raise ValueError("malformed ActorRef fields")
    if not all(type(k) is str and v in (ASYNC, SYNC, AGEN, GEN) for k, v in methods.items()):
        raise ValueError("malformed ActorRef method table")
    return ActorRef(PeerId.from_bytes(bytes(pid)), name, methods, window, len(obj) == 5)


class StreamArg:
    """Placeholder for an argument that is a stream (client streaming): its index on the call."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


codec.register_ext(18, ActorRef, _ref_to_obj, _ref_from_obj)
codec.register_ext(19, StreamArg, lambda s: s.index, lambda i: StreamArg(int(i)) if type(i) is int and 0 <= i < 64 else _bad_stream_arg())


def _bad_stream_arg() -> StreamArg:
    raise ValueError("malformed stream argument index")


# -- results flowing back to a caller ----------------------------------------------------------


def _error_parts(exc: BaseException) -> tuple[str, str, str]:
    """(qualified type name, message, traceback) of an exception, even one whose str() fails."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = f"<{name} whose str() failed>"
    try:
        tb = "".join(traceback.format_exception(t, exc, exc.__traceback__))
    except Exception:
        tb = ""
    return name, message, tb


class _Sink:
    """Where an invocation's outcome goes: a local future/stream, or a remote caller."""

    def ok(self, value: Any) -> None: ...
    def err(self, kind: str, type_name: str, message: str, tb: str = "") -> None: ...
    def item(self, value: Any) -> None: ...
    def end(self) -> None: ...


class _Invocation:
    __slots__ = ("actor", "method", "args", "kwargs", "deadline", "sink", "task", "replied", "streaming", "credit", "credit_waiter", "arg_streams", "timer", "done", "caller")

    def __init__(self, actor: LocalActor, method: str, args: list, kwargs: dict | None, deadline: float | None, sink: _Sink, streaming: bool = False, caller: PeerId | None = None) -> None:
        self.caller = caller  # the authenticated node the call came from
        self.actor = actor
        self.method = method
        self.args = args
        self.kwargs = kwargs
        self.deadline = deadline
        self.sink = sink
        self.task: asyncio.Task | None = None
        self.replied = False  # the caller got its answer (OK, ERR or END); nothing more is sent
        self.streaming = streaming  # called with .stream(): the method must be a generator
        self.credit = STREAM_WINDOW  # for generator methods: items we may send
        self.credit_waiter: Any = None
        self.arg_streams: dict[int, ArgStream] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.done = False


class ArgStream:
    """What an actor method receives for a streamed argument: an async iterator of the caller's
    items, granting the caller credit as it is consumed."""

    def __init__(self, grant: Callable[[int], None]) -> None:
        self._items: collections.deque = collections.deque()
        self._ended = False
        self._waiter: asyncio.Future | None = None
        self._grant = grant
        self._consumed = 0
        self._allowed = STREAM_WINDOW  # items the caller may still send (its credit)

    def _push(self, value: Any) -> None:
        if self._allowed <= 0:
            raise ProtocolError("caller sent a streamed argument item beyond its credit")
        self._allowed -= 1
        self._items.append(value)
        self._wake()

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> ArgStream:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        value = self._items.popleft()
        self._consumed += 1
        if self._consumed >= STREAM_WINDOW // 2:
            self._allowed += self._consumed
            self._grant(self._consumed)
            self._consumed = 0
        return value


# -- local actors ------------------------------------------------------------------------------


class _Executor(pykka.ThreadingActor):
    """The actor's own thread: runs sync methods one at a time, in mailbox order."""

    # A daemon thread: the interpreter joins non-daemon threads *before* it runs the atexit hook
    # that stops the node (and with it this actor, on_stop included), so a script that never
    # calls lattica.shutdown() would otherwise hang at its end.
    use_daemon_thread = True

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self._runtime = runtime

    def on_start(self) -> None:
        context.bind_thread(self._runtime)

    def on_stop(self) -> None:
        context.unbind_thread(self._runtime)

    def on_receive(self, message: Any) -> Any:
        message()  # a job closure built by LocalActor


class LocalActor:
    """One actor living on this node."""

    def __init__(self, runtime: Runtime, name: str, cls: type, methods: dict[str, str], max_concurrency: int, window: int) -> None:
        self.runtime = runtime
        self.name = name
        self.cls = cls
        self.methods = methods
        self.max_concurrency = max_concurrency
        self.window = window
        self.instance: Any = None
        self.bound: dict[str, Callable] = {}
        self.state = "starting"  # starting -> running -> stopped | failed
        self.failure: tuple[str, str, str] | None = None
        self.waiting: collections.deque[_Invocation] = collections.deque()  # for start-up or a slot
        self.running_async = 0
        self._draining = False
        self.live: set[_Invocation] = set()
        self.executor: pykka.ActorRef | None = None
        self.ready: asyncio.Future = runtime.loop.create_future()
        self.ref = ActorRef(runtime.peer_id, name, methods, window)
        self.system = False  # built by the runtime (spawner, ...): cannot be killed by peers
        self.published = False  # named by the user: registered mesh-wide in the DHT while it lives
        self.exiting: str | None = None  # lattica.exit_actor was called: stop with this reason when idle

    @property
    def needs_thread(self) -> bool:
        return any(k in (SYNC, GEN) for k in self.methods.values())

    # -- construction ---------------------------------------------------------------------------

    def start(self, args: list, kwargs: dict | None, instance: Any = None, state: Any = NO_STATE) -> None:
        if instance is not None:  # system actors: built by the runtime itself
            self.system = True
            if self.needs_thread:
                self.executor = _Executor.start(self.runtime)
            self._constructed(instance, None)
            return
        if self.needs_thread:
            self.executor = _Executor.start(self.runtime)
            self.executor.tell(lambda: self._construct(args, kwargs, state))
        else:
            threading.Thread(target=self._construct, args=(args, kwargs, state), name=f"lattica-init-{self.name}", daemon=True).start()

    def _construct(self, args: list, kwargs: dict | None, state: Any = NO_STATE) -> None:
        try:
            instance = self.cls(*args, **(kwargs or {}))
            if state is not NO_STATE:  # a checkpoint of an earlier incarnation, before any call
                restore = getattr(instance, "restore", None)
                if not callable(restore):
                    raise TypeError(f"{self.cls.__name__} was given a checkpoint but has no restore(state) method")
                restore(state)
        except BaseException as e:  # noqa: BLE001 -- reported to the spawner's caller
            parts = _error_parts(e)
            self.runtime.post(lambda: self._constructed(None, parts))
            return
        self.runtime.post(lambda: self._constructed(instance, None))

    def _constructed(self, instance: Any, failure: tuple[str, str, str] | None) -> None:
        if self.state != "starting":
            return  # killed while starting
        if failure is not None:
            self.state = "failed"
            self.failure = failure
            self.runtime.forget(self)
            self.runtime.actor_ended(self.name, f"failed to start: {failure[0]}")
            waiting, self.waiting = self.waiting, collections.deque()
            for inv in waiting:
                self._finish(inv)
                self._reply_err(inv, rpc.E_SPAWN, *failure)
            self.ready.set_result(failure)
            if self.executor is not None:
                self.executor.stop(block=False)
            return
        self.instance = instance
        self.bound = {m: getattr(instance, m) for m in self.methods}
        self.state = "running"
        if self.published:
            self.runtime.dht.register_name(self.name, self.ref)
        hook = getattr(instance, "on_start", None) if not self.system else None
        if hook is not None and inspect.iscoroutinefunction(hook):
            self.runtime.host.spawn(self._on_start(hook))
        self.ready.set_result(None)
        waiting, self.waiting = self.waiting, collections.deque()
        for inv in waiting:
            self.dispatch(inv)

    async def _on_start(self, hook: Callable[[], Any]) -> None:
        """An async ``on_start`` runs on the loop once the actor is up, beside its calls."""
        _ACTOR.set(self.ref)
        context.ACTOR_RUNTIME.set(self.runtime)
        try:
            await hook()
        except Exception:
            log.exception("actor on_start hook failed", actor=self.name)

    # -- dispatch -------------------------------------------------------------------------------

    def _reply_ok(self, inv: _Invocation, value: Any) -> None:
        if not inv.replied:
            inv.replied = True
            inv.sink.ok(value)

    def _reply_err(self, inv: _Invocation, kind: str, type_name: str, message: str, tb: str = "") -> None:
        if not inv.replied:
            inv.replied = True
            inv.sink.err(kind, type_name, message, tb)

    def _reply_end(self, inv: _Invocation) -> None:
        if not inv.replied:
            inv.replied = True
            inv.sink.end()

    def dispatch(self, inv: _Invocation) -> None:
        if self.state != "running":
            if self.state == "starting":
                self.waiting.append(inv)
                return
            self._reply_err(inv, rpc.E_DIED, "ActorDied", f"actor {self.name!r} has stopped")
            return
        kind = self.methods.get(inv.method)
        if kind is None:
            self._reply_err(inv, rpc.E_METHOD, "MethodNotFound", f"actor {self.name!r} has no public method {inv.method!r}")
            return
        if inv.streaming != (kind in (AGEN, GEN)):
            what = "a generator method: use .stream()" if kind in (AGEN, GEN) else "not a generator method: use .remote()"
            self._reply_err(inv, rpc.E_METHOD, "MethodNotFound", f"{self.name}.{inv.method} is {what}")
            return
        if inv.deadline is not None and inv.deadline <= self.runtime.loop.time():
            self._reply_err(inv, rpc.E_TIMEOUT, "CallTimeout", f"deadline passed before {self.name}.{inv.method} started")
            return
        self.live.add(inv)
        if kind == ASYNC or kind == AGEN:
            if self.running_async >= self.max_concurrency:
                self.waiting.append(inv)
            else:
                self._start_async(inv, kind)
        else:
            if kind == GEN:  # credit may arrive before the thread starts: count it from now on
                inv.credit_waiter = threading.Semaphore(inv.credit)
            self.executor.tell(lambda: self._run_sync(inv, kind))  # type: ignore[union-attr]

    def _finish(self, inv: _Invocation) -> None:
        """Release what the invocation holds here (its reply is separate: ``_reply_*``)."""
        if inv.done:
            return
        inv.done = True
        self.live.discard(inv)
        if inv.timer is not None:
            inv.timer.cancel()
        if self.exiting is not None and not self.live and self.state == "running":
            self.runtime.host.spawn(self.stop(self.exiting))

    def exit_when_idle(self, reason: str) -> None:
        """The actor ends itself (``lattica.exit_actor``) once no call of it is running."""
        self.exiting = reason
        if not self.live:
            self.runtime.loop.call_soon(lambda: self.runtime.host.spawn(self.stop(reason)))

    def _start_async(self, inv: _Invocation, kind: str) -> None:
        self.running_async += 1
        token = _CALLER.set(inv.caller)  # the task below copies the context, so it keeps this value
        rt_token = context.ACTOR_RUNTIME.set(self.runtime)
        actor_token = _ACTOR.set(self.ref)
        try:
            self._start_task(inv, kind)
        finally:
            _ACTOR.reset(actor_token)
            context.ACTOR_RUNTIME.reset(rt_token)
            _CALLER.reset(token)

    def _start_task(self, inv: _Invocation, kind: str) -> None:
        try:
            if kind == AGEN:
                coro = self._drive_agen(inv)
            else:
                coro = self.bound[inv.method](*inv.args, **(inv.kwargs or {}))
        except Exception as e:  # e.g. wrong arguments
            self._async_done(inv)
            self._reply_err(inv, rpc.E_REMOTE, *_error_parts(e))
            return
        # A real task (current_task(), timeouts and TaskGroups work), whose first step runs now:
        # most methods finish in it and are answered without another loop round.
        task = eager_task(self.runtime.loop, coro)
        inv.task = task
        if task.done():
            self._task_done(inv, task)
            return
        task.add_done_callback(lambda t: self._task_done(inv, t))
        if inv.deadline is not None:
            inv.timer = self.runtime.loop.call_at(inv.deadline, self._expire, inv)

    def _expire(self, inv: _Invocation) -> None:
        if not inv.done and inv.task is not None:
            self._reply_err(inv, rpc.E_TIMEOUT, "CallTimeout", f"{self.name}.{inv.method} ran past its deadline and was cancelled")
            inv.task.cancel()

    def _task_done(self, inv: _Invocation, task: asyncio.Task) -> None:
        self._async_done(inv)
        if task.cancelled():
            self._reply_err(inv, rpc.E_CANCELLED, "CancelledError", f"{self.name}.{inv.method} was cancelled")
        elif task.exception() is not None:
            self._reply_err(inv, rpc.E_REMOTE, *_error_parts(task.exception()))  # type: ignore[arg-type]
        elif task.result() is not _STREAMED:
            self._reply_ok(inv, task.result())

    def _async_done(self, inv: _Invocation) -> None:
        self.running_async -= 1
        self._finish(inv)
        if self._draining:
            return  # a call finishing inside the loop below: that loop starts the next one
        self._draining = True
        try:
            while self.waiting and self.running_async < self.max_concurrency and self.state == "running":
                nxt = self.waiting.popleft()
                if not nxt.replied:
                    self._start_async(nxt, self.methods[nxt.method])
        finally:
            self._draining = False

    async def _drive_agen(self, inv: _Invocation) -> object:
        agen = self.bound[inv.method](*inv.args, **(inv.kwargs or {}))
        try:
            async for item in agen:
                while inv.credit <= 0:
                    inv.credit_waiter = self.runtime.loop.create_future()
                    await inv.credit_waiter
                if inv.replied:  # cancelled by the consumer
                    break
                inv.credit -= 1
                inv.sink.item(item)
        finally:
            await agen.aclose()
        self._reply_end(inv)
        return _STREAMED  # the caller already got END: no OK follows

    def grant(self, inv: _Invocation, n: int) -> None:
        """The consumer of a streaming call granted ``n`` more items (never beyond one window)."""
        n = max(0, min(n, STREAM_WINDOW - inv.credit))
        if n == 0:
            return
        inv.credit += n
        w = inv.credit_waiter
        if isinstance(w, asyncio.Future):
            if not w.done():
                w.set_result(None)
        elif isinstance(w, threading.Semaphore):
            w.release(n)

    def _run_sync(self, inv: _Invocation, kind: str) -> None:
        """On the actor thread."""
        post = self.runtime.post
        if self.state != "running" or inv.replied:
            post(lambda: self._sync_done(inv, rpc.E_DIED if self.state != "running" else rpc.E_CANCELLED))
            return
        if inv.deadline is not None and self.runtime.loop.time() > inv.deadline:
            post(lambda: self._sync_done(inv, rpc.E_TIMEOUT))
            return
        token = _CALLER.set(inv.caller)
        actor_token = _ACTOR.set(self.ref)
        try:
            result = self.bound[inv.method](*inv.args, **(inv.kwargs or {}))
            if kind == GEN:
                sem = inv.credit_waiter
                for item in result:
                    while not sem.acquire(timeout=0.5):
                        if inv.replied or self.state != "running":
                            raise _Abandoned()
                    if inv.replied:
                        raise _Abandoned()
                    post(lambda item=item: self._deliver_item(inv, item))
                post(lambda: self._sync_done(inv, None, end=True))
                return
        except _Abandoned:
            post(lambda: self._sync_done(inv, rpc.E_CANCELLED))
            return
        except Exception as e:
            parts = _error_parts(e)
            post(lambda: self._sync_done(inv, rpc.E_REMOTE, parts=parts))
            return
        finally:
            _ACTOR.reset(actor_token)
            _CALLER.reset(token)
        post(lambda: self._sync_done(inv, None, value=result))

    def _deliver_item(self, inv: _Invocation, item: Any) -> None:
        """A sync generator's item reaches the loop: it used one credit (the thread's semaphore
        already counted it; ``inv.credit`` mirrors it so grants stay within one window)."""
        if not inv.replied:
            inv.credit -= 1
            inv.sink.item(item)

    def _sync_done(self, inv: _Invocation, kind: str | None, value: Any = None, parts: tuple | None = None, end: bool = False) -> None:
        self._finish(inv)
        if kind is None:
            self._reply_end(inv) if end else self._reply_ok(inv, value)
        elif kind == rpc.E_REMOTE:
            self._reply_err(inv, kind, *parts)  # type: ignore[misc]
        elif kind == rpc.E_TIMEOUT:
            self._reply_err(inv, kind, "CallTimeout", f"deadline passed before {self.name}.{inv.method} started")
        elif kind == rpc.E_DIED:
            self._reply_err(inv, kind, "ActorDied", f"actor {self.name!r} has stopped")
        else:
            self._reply_err(inv, kind, "CancelledError", f"{self.name}.{inv.method} was cancelled")

    def cancel(self, inv: _Invocation) -> None:
        """Cancel an invocation: its caller is told at once (freeing its mailbox slot); running
        async code gets CancelledError, a sync job not yet started is skipped, a running sync
        method finishes but its result is dropped, a generator stops at its next item."""
        if inv.replied:
            return
        self._reply_err(inv, rpc.E_CANCELLED, "CancelledError", f"{self.name}.{inv.method} was cancelled")
        if inv.task is not None:
            inv.task.cancel()
        elif inv in self.waiting:
            self.waiting.remove(inv)
            self._finish(inv)
        inv.args, inv.kwargs = [], None  # a queued sync job keeps no payload alive
        w = inv.credit_waiter
        if isinstance(w, asyncio.Future) and not w.done():
            w.set_result(None)

    # -- stopping -------------------------------------------------------------------------------

    async def stop(self, reason: str) -> None:
        if self.state in ("stopped", "failed"):
            return
        was_running = self.state == "running"
        self.state = "stopped"
        self.runtime.forget(self)
        self.runtime.actor_ended(self.name, reason)
        self.runtime.monitors.actor_stopped(self.name, reason)
        if self.published and was_running:
            self.runtime.dht.unregister_name(self.name)
        if not self.ready.done():
            self.ready.set_result(("ActorDied", reason, ""))
        for inv in list(self.live) + list(self.waiting):
            self._reply_err(inv, rpc.E_DIED, "ActorDied", f"actor {self.name!r} stopped: {reason}")
            if inv.task is not None:
                inv.task.cancel()
            self._finish(inv)
        self.waiting.clear()
        hook = getattr(self.instance, "on_stop", None) if was_running else None
        try:
            if hook is not None:
                if inspect.iscoroutinefunction(hook):
                    await asyncio.wait_for(hook(), _HOOK_TIMEOUT)
                elif self.executor is not None:  # behind any sync job still running: bounded wait
                    await asyncio.wait_for(asyncio.wrap_future(_on_thread(self.executor, hook)), _HOOK_TIMEOUT)
                else:
                    hook()
        except Exception:
            log.exception("actor on_stop hook failed or timed out", actor=self.name)
        finally:
            if self.executor is not None:
                self.executor.stop(block=False)


class _Abandoned(Exception):
    pass


_HOOK_TIMEOUT = 10.0  # seconds an on_stop hook may take
async def _reset_quietly(stream: Any) -> None:
    try:
        stream.reset()
    except Exception:  # the stream may already be gone
        pass


_FOLLOW_FOR = 30.0  # seconds a stable ref keeps re-sending an undelivered call while its actor moves
_RECENT_PLACEMENT = 5.0  # seconds a spawn we sent counts against its node (gossip lag)




_STREAMED = object()  # what a streaming method's driver returns: its END was already sent


def _on_thread(executor: pykka.ActorRef, fn: Callable[[], Any]) -> Any:
    cf: concurrent.futures.Future = concurrent.futures.Future()

    def job() -> None:
        try:
            cf.set_result(fn())
        except BaseException as e:  # noqa: BLE001
            cf.set_exception(e)

    executor.tell(job)
    return cf


# -- the caller side ---------------------------------------------------------------------------


class _Pending:
    """A call we made that has not finished."""

    __slots__ = ("cid", "ref", "msg", "future", "stream", "channel", "timer", "stream_args", "arg_state", "encoded", "gate", "created", "follow_until", "idempotent")

    def __init__(self, cid: int, ref: ActorRef, msg: list, future: Future | None, stream: Any) -> None:
        self.cid = cid
        self.ref = ref
        self.msg = msg
        self.future = future
        self.stream = stream
        self.channel: _Channel | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.stream_args: dict[int, Any] | None = None  # client-streamed arguments by index
        self.arg_state: dict[int, list] | None = None  # per streamed argument: [credit, waiter]
        self.encoded: list | None = None  # the CALL already encoded (calls made on other threads)
        self.gate: _Gate | None = None  # the calling thread's gate slot, freed once the call is sent
        self.created = time.monotonic()  # the loop clock: deadlines travel as time remaining
        self.follow_until: float | None = None  # through a stable ref: re-sent until then while undelivered
        self.idempotent = False  # safe to run twice: re-sent to the next incarnation even if delivered

    def stamp(self) -> None:
        """Just before sending: the timeout becomes what is left of it (it may have waited)."""
        timeout = self.msg[6]
        if timeout is not None:
            waited = time.monotonic() - self.created
            if waited > 0.001:
                self.msg[6] = max(0.0, timeout - waited)
                self.encoded = None  # encode again with the shorter timeout

    def ungate(self) -> None:
        g, self.gate = self.gate, None
        if g is not None:
            g.release()


class _Gate:
    """Backpressure for calls made on plain threads: at most ``window`` of them per actor may be
    waiting to be sent; the next caller blocks (or gets MailboxFull with ``block=False``)."""

    __slots__ = ("cond", "count")

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.count = 0

    def acquire(self, window: int, block: bool, name: str, alive: Callable[[], bool]) -> None:
        with self.cond:
            while self.count >= window:
                if not block:
                    raise MailboxFull(f"{window} calls to {name!r} already wait to be sent")
                if not alive():
                    raise NodeClosed("the node stopped while this call waited for room")
                self.cond.wait(0.5)
            self.count += 1

    def release(self) -> None:
        with self.cond:
            self.count -= 1
            self.cond.notify()


def _finished(p: _Pending) -> bool:
    """The caller no longer waits for this call (its future or stream already ended)."""
    if p.future is not None:
        return p.future.done()
    return p.stream is not None and p.stream._done


class _Outbox:
    """Calls from this node to one actor: credit left, and the calls waiting for it, in order."""

    __slots__ = ("credit", "queue", "window", "draining")

    def __init__(self, window: int) -> None:
        self.credit = window
        self.window = window
        self.queue: collections.deque[_Pending] = collections.deque()
        self.draining = False


class _Channel:
    """Calls from this node to one peer (remote) or to itself (local, no encoding)."""

    def __init__(self, runtime: Runtime, peer: PeerId) -> None:
        self.runtime = runtime
        self.peer = peer
        self.outboxes: dict[str, _Outbox] = {}
        self.pending: dict[int, _Pending] = {}
        self.closed: LatticaError | None = None

    def outbox(self, ref: ActorRef) -> _Outbox:
        ob = self.outboxes.get(ref.name)
        if ob is None:
            ob = self.outboxes[ref.name] = _Outbox(ref.window)
        return ob

    def submit(self, p: _Pending, block: bool) -> None:
        if self.closed is not None:
            self.runtime.fail_call(p, self.closed)
            return
        ob = self.outbox(p.ref)
        if ob.credit > 0 and not ob.queue and not self.congested():
            ob.credit -= 1
            self._send_call(p)
            return
        if not block:
            raise MailboxFull(f"actor {p.ref.name!r} has no room for another call from this node (window {ob.window})")
        if len(ob.queue) >= 16 * ob.window:
            raise MailboxFull(f"{len(ob.queue)} calls to {p.ref.name!r} already wait for room; await earlier results first")
        ob.queue.append(p)

    def congested(self) -> bool:
        return False

    def returned(self, actor: str, n: int = 1) -> None:
        """``n`` calls to ``actor`` finished: spend the credit on waiting calls, in order."""
        ob = self.outboxes.get(actor)
        if ob is None:
            return
        ob.credit += n
        if ob.draining or self.closed is not None:
            return  # the loop below (further up this stack) spends it; a closed channel sends nothing
        ob.draining = True  # a call that completes at once re-enters here: no recursion
        try:
            while ob.queue and ob.credit > 0 and not self.congested():
                p = ob.queue.popleft()
                if _finished(p):
                    p.ungate()
                    continue  # cancelled or timed out while waiting
                ob.credit -= 1
                try:
                    self._send_call(p)
                except LatticaError as e:
                    self.runtime.fail_call(p, e)
        finally:
            ob.draining = False

    def _send_call(self, p: _Pending) -> None:
        raise NotImplementedError

    def fail_all(self, error: LatticaError) -> None:
        self.closed = error  # from now on nothing is sent: returned() stops releasing calls
        rt = self.runtime
        for ob in self.outboxes.values():
            while ob.queue:
                p = ob.queue.popleft()
                if not rt.follow(p, error, delivered=False) and not rt.resend(p, error):
                    rt.fail_call(p, error)
        sent = getattr(self, "stream", True) is not None  # (a channel that never opened sent nothing)
        while self.pending:
            p = self.pending.popitem()[1]
            if not rt.follow(p, error, delivered=sent) and not rt.resend(p, error):
                rt.fail_call(p, error)


class _LocalSink(_Sink):
    __slots__ = ("runtime", "p")

    def __init__(self, runtime: Runtime, p: _Pending) -> None:
        self.runtime = runtime
        self.p = p

    def ok(self, value: Any) -> None:
        self.runtime.complete_call(self.p, value, None)

    def err(self, kind: str, type_name: str, message: str, tb: str = "") -> None:
        self.runtime.complete_call(self.p, None, (kind, type_name, message, tb))

    def item(self, value: Any) -> None:
        self.p.stream._push(value)

    def end(self) -> None:
        self.runtime.complete_call(self.p, None, None, end=True)


class _LocalChannel(_Channel):
    """Calls to actors on this node: same credit rules, objects passed by reference."""

    def _send_call(self, p: _Pending) -> None:
        p.ungate()
        p.stamp()
        rt = self.runtime
        _, cid, actor_name, method, args, kwargs, timeout, flags = p.msg
        actor = rt.actors.get(actor_name)
        self.pending[cid] = p
        p.channel = self
        sink = _LocalSink(rt, p)
        if actor is None:
            sink.err(rpc.E_NOT_FOUND, "ActorNotFound", f"no actor named {actor_name!r} on this node")
            return
        deadline = rt.loop.time() + timeout if timeout is not None else None
        inv = _Invocation(actor, method, args, kwargs, deadline, sink, streaming=bool(flags & rpc.F_STREAM), caller=rt.peer_id)
        if p.stream is not None:
            p.stream._bind(lambda n: actor.grant(inv, n), lambda: actor.cancel(inv))
        if flags & rpc.F_ARGSTREAM:
            rt.local_arg_streams(inv, p)
        if p.future is not None:
            p.future._cancel_hook = lambda: actor.cancel(inv)
        actor.dispatch(inv)


class _RemoteChannel(_Channel):
    """Calls to one peer over its ``/lattica/rpc/1`` stream."""

    def __init__(self, runtime: Runtime, peer: PeerId) -> None:
        super().__init__(runtime, peer)
        self.stream: Stream | None = None
        self.opening: asyncio.Task | None = None
        self.unsent: list = []  # calls submitted before the stream was open
        self.writer = _FrameWriter(runtime.loop)
        self.last_used = time.monotonic()
        self.moving = False  # a better connection came up: switch when quiet

    def quiet(self) -> bool:
        """No call in flight and none queued: a new channel cannot overtake anything."""
        return not self.pending and not self.unsent and not any(ob.queue for ob in self.outboxes.values())

    def idle(self) -> bool:
        return (
            self.stream is not None
            and not self.pending
            and not any(ob.queue for ob in self.outboxes.values())
            and time.monotonic() - self.last_used > self.runtime.channel_idle
        )

    def congested(self) -> bool:
        return self.writer.backlog() > _CHANNEL_HIGH_WATER

    def _send_call(self, p: _Pending) -> None:
        p.ungate()
        p.stamp()
        self.last_used = time.monotonic()
        tell = p.msg[7] & rpc.F_TELL
        if not tell:  # a tell gets no reply: its credit comes back in MAILBOX messages
            self.pending[p.cid] = p
        p.channel = self
        cid = p.cid  # the hooks capture the id, not p: p -> future -> hook -> p would be a cycle
        if p.future is not None:
            p.future._cancel_hook = lambda: self.send([rpc.CANCEL, cid])
        if p.stream is not None:
            p.stream._bind(lambda n: self.send([rpc.CREDIT, cid, n]), lambda: self.send([rpc.CANCEL, cid]))
        try:
            self.send(p.msg, p.encoded)
        except LatticaError:
            if not tell:
                del self.pending[p.cid]
            self.returned(p.ref.name)
            raise

    def send(self, msg: list, encoded: list | None = None) -> None:
        """Encode ``msg`` now (errors surface here, at the caller) and queue it for the stream."""
        chunks = encoded if encoded is not None else codec.encode(msg)
        if self.stream is None:
            self.unsent.append(chunks)
            if self.opening is None:
                self.opening = self.runtime.loop.create_task(self._open())
            return
        self.writer.write(self.stream, chunks)

    async def _open(self) -> None:
        try:
            stream = await self.runtime.host.open_stream(self.peer, rpc.PROTOCOL)
        except LatticaError as e:
            err = e
            if not isinstance(e, PeerUnreachable):
                err = PeerUnreachable(f"cannot reach {self.peer}: {e}")
                err.__cause__ = e  # e.g. our own ConnectionLimit: callers can tell it is not the peer
            self.runtime.drop_channel(self, err)
            return
        self.stream = stream
        unsent, self.unsent = self.unsent, []
        for chunks in unsent:
            self.writer.write(stream, chunks)
        self.runtime.host.spawn(self._read_replies(stream))

    async def _read_replies(self, stream: Stream) -> None:
        rt = self.runtime
        splitter = rpc.FrameSplitter(MAX_MESSAGE)
        try:
            while True:
                data = await stream.read(1 << 20)
                if not data:
                    raise PeerUnreachable(f"{self.peer} closed the call channel")
                for frame in splitter.feed(data):
                    msg = rpc.parse(codec.decode(frame))
                    rt.on_reply(self, msg)
        except Exception as e:  # whatever broke the reader, no call may be left waiting on it
            err = e if isinstance(e, PeerUnreachable) else PeerUnreachable(f"call channel to {self.peer} failed: {e}")
            if isinstance(e, ProtocolError):
                log.info("closing call channel: peer broke the protocol", peer=str(self.peer), reason=str(e))
            elif not isinstance(e, LatticaError):
                log.exception("call channel reader failed", peer=str(self.peer))
            stream.reset()
            rt.drop_channel(self, err)


class _FrameWriter:
    """Coalesces small messages per loop iteration into one stream write."""

    __slots__ = ("_loop", "_buf", "_stream", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buf = bytearray()
        self._stream: Stream | None = None
        self._scheduled = False

    def write(self, stream: Stream, chunks: list) -> None:
        """Queue one encoded message (``codec.encode`` output) behind its 4-byte length."""
        size = sum(map(len, chunks)) if len(chunks) > 2 else len(chunks[0]) + len(chunks[1])
        self._stream = stream
        buf = self._buf
        buf += size.to_bytes(4, "big")
        if size < 65536:
            for c in chunks:
                buf += c
        else:  # big payloads: flush what is queued, then hand the buffers over without copying
            for c in chunks[:2]:
                buf += c
            stream.write(buf)
            self._buf = bytearray()
            for c in chunks[2:]:
                stream.write(c)
            return
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if self._buf and self._stream is not None:
            buf, self._buf = self._buf, bytearray()
            try:
                self._stream.write(buf)
            except LatticaError:
                pass  # the reader side notices the broken stream and fails the calls

    def backlog(self) -> int:
        s = self._stream
        return len(self._buf) + (s.write_buffer_size() if s is not None else 0)


# -- the callee side ---------------------------------------------------------------------------


class _ServerSink(_Sink):
    """Replies to a call that came from a peer; holds one slot of that peer's mailbox window."""

    __slots__ = ("server", "cid", "actor", "tell", "counted")

    def __init__(self, server: _ServerChannel, cid: int, actor: str, tell: bool) -> None:
        self.server = server
        self.cid = cid
        self.actor = actor
        self.tell = tell  # fire-and-forget: only the mailbox credit goes back (batched)
        self.counted = True

    def _release(self) -> None:
        s = self.server
        s.invocations.pop(self.cid, None)
        if self.counted:
            self.counted = False
            s.runtime.release_slot(s.peer, self.actor)
            if self.tell:
                s.tell_credit(self.actor)

    def ok(self, value: Any) -> None:
        self._release()
        if self.tell:
            return
        try:
            self.server.send([rpc.OK, self.cid, value])
        except LatticaError as e:  # e.g. a result the codec cannot encode
            self.server.send([rpc.ERR, self.cid, rpc.E_REMOTE, f"lattica.errors.{type(e).__name__}", f"cannot send the result: {e}", ""])

    def err(self, kind: str, type_name: str, message: str, tb: str = "") -> None:
        self._release()
        if not self.tell:
            self.server.send([rpc.ERR, self.cid, kind, type_name, message, tb])
        elif kind == rpc.E_REMOTE:
            log.info("fire-and-forget call failed", actor=self.actor, error=f"{type_name}: {message}")

    def item(self, value: Any) -> None:
        if not self.tell:
            self.server.send([rpc.ITEM, self.cid, value])

    def end(self) -> None:
        self._release()
        if not self.tell:
            self.server.send([rpc.END, self.cid])


class _ServerChannel:
    """Calls from one peer to actors on this node."""

    def __init__(self, runtime: Runtime, stream: Stream, conn: Connection) -> None:
        self.runtime = runtime
        self.stream = stream
        self.peer = conn.remote_peer
        self.writer = _FrameWriter(runtime.loop)
        self.invocations: dict[int, _Invocation] = {}
        self.tell_credits: dict[str, int] = {}
        self._credit_scheduled = False

    def send(self, msg: list) -> None:
        self.writer.write(self.stream, codec.encode(msg))

    def tell_credit(self, actor: str) -> None:
        self.tell_credits[actor] = self.tell_credits.get(actor, 0) + 1
        if not self._credit_scheduled:
            self._credit_scheduled = True
            self.runtime.loop.call_soon(self._flush_credits)

    def _flush_credits(self) -> None:
        self._credit_scheduled = False
        credits, self.tell_credits = self.tell_credits, {}
        for actor, n in credits.items():
            self.send([rpc.MAILBOX, actor, n])

    async def serve(self) -> None:
        splitter = rpc.FrameSplitter(MAX_MESSAGE)
        try:
            while True:
                if self.writer.backlog() > _CHANNEL_HIGH_WATER:
                    # the caller is not reading its replies: stop reading its calls meanwhile
                    self.writer.flush()
                    await self.stream.drain()
                data = await self.stream.read(1 << 20)
                if not data:
                    self.writer.flush()
                    await self.stream.close()  # the caller closed its channel: so do we
                    break
                for frame in splitter.feed(data):
                    self.on_message(codec.decode(frame))
        except LatticaError as e:
            if isinstance(e, ProtocolError):
                log.info("closing call channel: peer broke the protocol", peer=str(self.peer), reason=str(e))
                self.stream.reset()
        finally:
            for inv in list(self.invocations.values()):  # the caller is gone: stop its work
                inv.actor.cancel(inv)
            self.invocations.clear()

    def on_message(self, raw: Any) -> None:
        try:
            msg = rpc.parse(raw)
        except ProtocolError as e:
            cid = raw[1] if type(raw) is list and len(raw) > 1 and type(raw[1]) is int and raw[0] == rpc.CALL else None
            if cid is None:
                raise
            self.send([rpc.ERR, cid, rpc.E_PROTOCOL, "ProtocolError", str(e), ""])
            return
        kind = msg[0]
        if kind == rpc.CALL:
            self.on_call(msg)
            return
        inv = self.invocations.get(msg[1])
        if inv is None:
            return  # finished already (replies and cancels cross on the wire)
        if kind == rpc.CANCEL:
            inv.actor.cancel(inv)
        elif kind == rpc.CREDIT:
            inv.actor.grant(inv, msg[2])
        elif kind == rpc.ARG:
            s = (inv.arg_streams or {}).get(msg[2])
            if s is not None:
                s._push(msg[3])
        elif kind == rpc.ARGEND:
            s = (inv.arg_streams or {}).get(msg[2])
            if s is not None:
                s._end()

    def refuse(self, cid: int, tell: bool, actor: str, kind: str, type_name: str, message: str) -> None:
        """Answer a call that will not run: ERR, or for a tell just its credit back."""
        if tell:
            self.tell_credit(actor)
        else:
            self.send([rpc.ERR, cid, kind, type_name, message, ""])

    def on_call(self, msg: list) -> None:
        _, cid, actor_name, method, args, kwargs, timeout, flags = msg
        rt = self.runtime
        tell = bool(flags & rpc.F_TELL)
        actor = rt.actors.get(actor_name)
        if actor is None:
            self.refuse(cid, tell, actor_name, rpc.E_NOT_FOUND, "ActorNotFound", f"no actor named {actor_name!r} on {rt.peer_id}")
            return
        key = (self.peer, actor_name)
        used = rt.in_flight.get(key, 0)  # per peer, whatever stream its calls come on
        if used >= actor.window:
            self.refuse(cid, tell, actor_name, rpc.E_MAILBOX, "MailboxFull", f"caller exceeded its window of {actor.window} calls to {actor_name!r}")
            return
        rt.in_flight[key] = used + 1
        sink = _ServerSink(self, cid, actor_name, tell)
        deadline = rt.loop.time() + timeout if timeout is not None else None
        inv = _Invocation(actor, method, args, kwargs, deadline, sink, streaming=bool(flags & rpc.F_STREAM), caller=self.peer)
        if not tell:
            self.invocations[cid] = inv
        if flags & rpc.F_ARGSTREAM:
            inv.arg_streams = {}
            for i, a in enumerate(args):
                if isinstance(a, StreamArg):
                    s = ArgStream(lambda n, idx=a.index: self.send([rpc.ARGCRED, cid, idx, n]))
                    inv.arg_streams[a.index] = s
                    args[i] = s
                    self.send([rpc.ARGCRED, cid, a.index, STREAM_WINDOW])
        actor.dispatch(inv)


# -- the runtime -------------------------------------------------------------------------------


class Runtime:
    """Actors of one node and its call channels; lives on the node loop."""

    def __init__(self, host: _Host, allow: list[str], services: Mapping[str, Any]) -> None:
        self.host = host
        self.loop = host.loop
        self.peer_id: PeerId = host.peer_id
        self.allow = list(allow)
        self.channel_idle: float = getattr(host.node, "channel_idle", _CHANNEL_IDLE)
        self.actors: dict[str, LocalActor] = {}
        self.channels: dict[PeerId, _Channel] = {}
        self._ids = itertools.count(1)
        self._posted: collections.deque[Callable[[], None]] = collections.deque()
        self._post_lock = threading.Lock()
        self._post_scheduled = False
        self.local = _LocalChannel(self, self.peer_id)
        self._gates: dict[tuple[PeerId, str], _Gate] = {}
        self.in_flight: dict[tuple[PeerId, str], int] = {}  # calls from a peer to an actor, in progress
        # nodes sharing one loop (Node.astart) share its thread: the first live one keeps the mapping
        current = context.thread_runtime()
        if current is None or current.host.closing or current.loop.is_closed():
            context.bind_thread(self)
        context.add_live(self)
        host.handlers[rpc.PROTOCOL] = self._serve
        self.monitors: Monitors = None  # type: ignore[assignment]  # the host sets them right after (they import us)
        self.stop_listeners: list[Callable[[str, str], None]] = []  # told (actor name, reason) when one of ours ends
        self._placed: collections.deque[tuple[float, str, Any]] = collections.deque()  # (when, peer, its load then)
        self.services = services  # the node's system services; the host starts them after us
        host.spawn(self._close_idle_channels())

    @property
    def dht(self) -> DhtService:
        """The DHT service: named actors register and resolve through it."""
        return self.services["dht"]

    async def _close_idle_channels(self) -> None:
        """Close call channels with nothing in flight for a while, so that the connections under
        them can go idle and close (an open stream keeps a connection alive)."""
        while True:
            await asyncio.sleep(max(self.channel_idle / 4, 0.05))
            for peer, ch in list(self.channels.items()):
                if isinstance(ch, _RemoteChannel) and ch.idle():
                    del self.channels[peer]
                    ch.closed = PeerUnreachable("call channel closed while idle")
                    self.host.spawn(ch.stream.close())  # type: ignore[union-attr]

    # -- cross-thread posting (batched wake-ups) ------------------------------------------------

    def post(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the loop soon; safe from any thread, one wake-up per batch. False if
        the node has stopped (``fn`` will never run)."""
        if self.loop.is_closed() or self.host.closing:
            return False
        with self._post_lock:
            self._posted.append(fn)
            if self._post_scheduled:
                return True
            self._post_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._run_posted)
        except RuntimeError:
            return False  # the loop closed meanwhile: the node is gone
        return True

    def _run_posted(self) -> None:
        with self._post_lock:
            self._post_scheduled = False
            batch, self._posted = self._posted, collections.deque()
        for fn in batch:
            try:
                fn()
            except Exception:
                log.exception("posted callback failed")

    # -- actors ---------------------------------------------------------------------------------

    def create(self, cls: type, args: list, kwargs: dict | None, name: str | None, *, max_concurrency: int = DEFAULT_MAX_CONCURRENCY, window: int = DEFAULT_WINDOW, instance: Any = None, publish: bool = False, state: Any = NO_STATE) -> LocalActor:
        """Make an actor here; ``publish``: register its name mesh-wide in the DHT while it lives;
        ``state``: a checkpoint handed to its ``restore`` before any call."""
        name = name or f"{cls.__name__}-{next(self._ids):x}-{id(cls) & 0xFFFF:04x}"
        if not name or len(name) > rpc.MAX_NAME:
            raise ValueError("actor names are 1 to 256 characters")
        if name in self.actors:
            raise SpawnError(f"an actor named {name!r} already exists on {self.peer_id}")
        if len(self.actors) >= MAX_ACTORS:
            raise SpawnError(f"{self.peer_id} already runs {MAX_ACTORS} actors")
        actor = LocalActor(self, name, cls, method_table(cls), max_concurrency, window)
        actor.published = publish and instance is None
        self.actors[name] = actor
        actor.start(args, kwargs, instance, state)
        return actor

    def release_slot(self, peer: PeerId, actor: str) -> None:
        key = (peer, actor)
        n = self.in_flight.get(key, 1) - 1
        if n > 0:
            self.in_flight[key] = n
        else:
            self.in_flight.pop(key, None)

    # -- placement ------------------------------------------------------------------------------

    def placement_view(self) -> list[dict[str, Any]]:
        """The membership view placement chooses from (PlacementError without membership)."""
        if self.host.membership is None:
            raise PlacementError("placement needs membership: this node runs with membership=False")
        return self.host.membership.nodes()

    def placed(self, peer: str, view: list[dict[str, Any]]) -> None:
        """We just sent a spawn to ``peer``: count it until its gossiped load changes."""
        row = next((r for r in view if r["peer_id"] == peer), {})
        self._placed.append((self.loop.time(), peer, row.get("load")))

    def recent_placements(self, view: list[dict[str, Any]]) -> dict[str, int]:
        """Spawns sent per node that its gossiped load does not show yet (same load as when we
        sent them, and within a few seconds)."""
        horizon = self.loop.time() - _RECENT_PLACEMENT
        loads = {r["peer_id"]: r.get("load") for r in view}
        self._placed = collections.deque(e for e in self._placed if e[0] >= horizon and loads.get(e[1]) == e[2])
        return dict(collections.Counter(peer for _, peer, _ in self._placed))

    def actor_ended(self, name: str, reason: str) -> None:
        for listener in self.stop_listeners:
            try:
                listener(name, reason)
            except Exception:
                log.exception("actor stop listener failed", actor=name)

    def forget(self, actor: LocalActor) -> None:
        if self.actors.get(actor.name) is actor:
            del self.actors[actor.name]

    def resolve_class(self, path: str) -> type:
        """Import the ``@lattica.actor`` class named ``module.Class``, if the allow-list permits.

        The allow-list is checked twice: against the name asked for, and against where the class
        actually lives (``cls.__module__`` + ``__qualname__``), so a permitted module cannot be used
        to reach anything it merely imports. Only decorated actor classes can be spawned."""
        refuse = f"class {path!r} is not allowed on {self.peer_id} (allow-list: {self.allow or 'empty'})"
        allowed = [*self.allow, *BUILTIN_ACTORS]
        if not isinstance(path, str) or not any(fnmatch.fnmatchcase(path, pat) for pat in allowed):
            raise SpawnError(refuse)
        module, _, name = path.rpartition(".")
        if not module or not name.isidentifier() or name.startswith("_") or ":" in path:
            raise SpawnError(f"{path!r} is not a qualified class name (module.Class)")
        try:
            obj: Any = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise SpawnError(f"cannot import {path!r} on {self.peer_id}: {e}") from None
        cls = getattr(obj, "_lattica_cls", None)
        if not isinstance(cls, type) or type(obj).__name__ != "ActorClass":
            raise SpawnError(f"{path!r} is not a @lattica.actor class")
        real = f"{cls.__module__}.{cls.__qualname__}"
        if not any(fnmatch.fnmatchcase(real, pat) for pat in allowed):
            raise SpawnError(f"{refuse}; it is defined as {real!r}")
        return cls

    async def stop(self) -> None:
        for actor in list(self.actors.values()):
            await actor.stop("node shutting down")
        for ch in list(self.channels.values()):
            ch.fail_all(PeerUnreachable("this node is shutting down"))
        if context.thread_runtime() is self:
            context.unbind_thread(self)
            for other in context.live_runtimes():  # another node on this shared loop (Node.astart) takes over
                if other is not self and other.host.thread_id == threading.get_ident() and not other.host.closing:
                    context.bind_thread(other)
                    break
        context.discard_live(self)

    # -- calls out ------------------------------------------------------------------------------

    def channel_for(self, peer: PeerId) -> _Channel:
        if peer == self.peer_id:
            return self.local
        ch = self.channels.get(peer)
        if ch is not None and ch.moving and ch.quiet():  # type: ignore[union-attr]
            self._retire(ch)  # type: ignore[arg-type]
            ch = None
        if ch is None:
            ch = self.channels[peer] = _RemoteChannel(self, peer)
        return ch

    def path_changed(self, peer: PeerId) -> None:
        """A better connection to ``peer`` became primary (direct instead of relayed): the call
        channel moves to it as soon as no call is in flight on the old one (keeping per-caller
        order), and at once if none is."""
        ch = self.channels.get(peer)
        if isinstance(ch, _RemoteChannel) and ch.stream is not None:
            ch.moving = True
            if ch.quiet():
                self._retire(ch)

    def _retire(self, ch: _RemoteChannel) -> None:
        if self.channels.get(ch.peer) is ch:
            del self.channels[ch.peer]
        ch.closed = PeerUnreachable("call channel moved to a better connection")
        if ch.stream is not None:
            self.host.spawn(ch.stream.close())

    def member_down(self, member: Any, why: str) -> None:
        """Membership's verdict on a peer: calls waiting on it fail (or, through stable refs, follow
        their actors) instead of waiting on a frozen process; monitors on its actors fire."""
        try:
            peer = PeerId.from_string(member.id)
        except LatticaError:
            return
        ch = self.channels.get(peer)
        if isinstance(ch, _RemoteChannel):
            if ch.stream is not None:
                self.host.spawn(_reset_quietly(ch.stream))
            self.drop_channel(ch, PeerUnreachable(f"{peer} was declared {member.state}: {why}"))
        self.monitors.node_down(member.id, why)

    def drop_channel(self, ch: _Channel, error: LatticaError) -> None:
        if self.channels.get(ch.peer) is ch:
            del self.channels[ch.peer]
        ch.fail_all(error)

    def call(self, ref: ActorRef, method: str, args: tuple, kwargs: dict, *, timeout: float | None, tell: bool = False, stream: Any = None,
             block: bool = True, idempotent: bool = False) -> Future | None:
        """Make a call (on the loop); returns its Future (None for tell)."""
        p = self.prepare(ref, method, args, kwargs, timeout=timeout, tell=tell, stream=stream, idempotent=idempotent)
        self.submit(p, block)
        return p.future

    def prepare(self, ref: ActorRef, method: str, args: tuple, kwargs: dict, *, timeout: float | None, tell: bool = False, stream: Any = None,
                encode: bool = False, idempotent: bool = False) -> _Pending:
        """Build a call (any thread). With ``encode``, a call to another node is encoded here, so
        an argument the codec refuses raises in the caller's thread."""
        spawn = ref._spawn
        if spawn is not None and spawn.done() and not spawn.cancelled() and spawn.exception() is not None:
            if not ref.stable:
                raise spawn.exception()  # type: ignore[misc]
            ref._spawn = None  # following it failed once; this call starts over
        flags = (rpc.F_TELL if tell else 0) | (rpc.F_STREAM if stream is not None else 0)
        arg_list = list(args)
        streamed = None
        for i, a in enumerate(arg_list):
            if hasattr(a, "__aiter__") and not isinstance(a, (ArgStream,)):
                streamed = streamed or {}
                if len(streamed) >= _MAX_STREAM_ARGS:
                    raise ValueError(f"at most {_MAX_STREAM_ARGS} arguments of one call can be streams")
                streamed[len(streamed)] = a
                arg_list[i] = StreamArg(len(streamed) - 1)
        if streamed:
            flags |= rpc.F_ARGSTREAM
        cid = next(self._ids)  # itertools.count: safe from any thread
        msg = rpc.call(cid, ref.name, method, arg_list, kwargs or None, timeout, flags)
        p = _Pending(cid, ref, msg, None if tell or stream is not None else Future(self.loop), stream)
        p.stream_args = streamed
        p.idempotent = idempotent
        if encode and ref.peer_id != self.peer_id:
            p.encoded = codec.encode(msg)
        return p

    def submit(self, p: _Pending, block: bool) -> None:
        """Send a prepared call (on the loop): held while its actor's spawn is pending, then
        through the channel's credit window. Raises MailboxFull when it may not wait."""
        if p.msg[6] is not None and not (p.msg[7] & rpc.F_TELL):
            p.timer = self.loop.call_later(p.msg[6], self._timed_out, p)
        ref = p.ref
        spawn = ref._spawn
        if (spawn is None or spawn.done()) and ref.peer_id != self.peer_id and self.node_down(ref.peer_id):
            # membership holds the node suspect or dead: a stable ref follows its actor (to where
            # its supervisor restarts it, or back here if the node recovers); any other call fails
            # now rather than wait on a frozen process (tells go: membership gossip must reach a
            # dead member over a connection that is still open, so it hears its verdict)
            if ref.stable and not self.host.closing:
                self._start_following(ref)
                spawn = ref._spawn
            elif not p.msg[7] & rpc.F_TELL and self._node_state(ref.peer_id) == "dead":
                self.fail_call(p, PeerUnreachable(f"{ref.peer_id} was declared dead; calls to it fail until it rejoins the mesh"))
                return
        if spawn is not None and (not spawn.done() or ref._held is not None):
            # held until the spawn answers; `_held` stays set until the release ran, so a call
            # made in between queues behind the held ones instead of overtaking them
            if ref._held is None:
                ref._held = []
                spawn.add_done_callback(lambda _: self._release_held(ref))
            ref._held.append(p)
        else:
            self.channel_for(ref.peer_id).submit(p, block)

    def submit_threadsafe(self, p: _Pending, block: bool) -> None:
        """``submit`` for a call prepared on another thread: failures go to its future/stream."""
        if _finished(p):  # cancelled before it reached the loop
            p.ungate()
            return
        try:
            self.submit(p, block)
        except BaseException as e:  # noqa: BLE001 -- delivered to the caller
            p.ungate()
            self.fail_call(p, e)

    def gate(self, ref: ActorRef) -> _Gate:
        key = (ref.peer_id, ref.name)
        g = self._gates.get(key)
        return g if g is not None else self._gates.setdefault(key, _Gate())

    def _release_held(self, ref: ActorRef) -> None:
        """The spawn behind ``ref`` answered: send the calls held for it, in order, or fail them."""
        held, ref._held = ref._held or [], None
        spawn = ref._spawn
        error = spawn.exception() if spawn is not None and not spawn.cancelled() else None
        ch = self.channel_for(ref.peer_id)
        for p in held:
            if _finished(p):
                p.ungate()
                continue  # timed out or cancelled while held
            if error is not None:
                p.ungate()
                self.fail_call(p, error)
                continue
            try:
                ch.submit(p, True)
            except BaseException as e:  # noqa: BLE001
                p.ungate()
                self.fail_call(p, e)

    # -- stable refs: following a supervised actor to its next incarnation ----------------------

    def follow(self, p: _Pending, error: BaseException, delivered: bool) -> bool:
        """A call through a stable ref found its actor gone. Start following the actor (resolve
        its name again); re-send the call if it never reached the actor, or if the caller said it
        is idempotent (for up to ``_FOLLOW_FOR`` s), else fail it with ActorRestarted. False: not
        a stable ref's call."""
        ref = p.ref
        if not ref.stable or self.host.closing or _finished(p):
            return False
        self._start_following(ref)
        now = time.monotonic()
        if p.follow_until is None:
            p.follow_until = now + _FOLLOW_FOR
        if (not delivered or p.idempotent) and p.stream is None and now < p.follow_until:
            if p.timer is not None:
                p.timer.cancel()
                p.timer = None
            p.channel = None
            self.submit(p, True)  # held until the name resolves again
            return True
        if delivered:
            error = ActorRestarted(f"{ref.name}.{p.msg[3]} was in flight when the actor went away ({error}); the ref follows its next incarnation")
        p.channel = None
        self.fail_call(p, error)
        return True

    def resend(self, p: _Pending, error: BaseException) -> bool:
        """An idempotent call whose path to the actor's node broke (its relay died, say) is sent
        once more, over a new channel: the next path (another relay, a direct connection). False:
        not such a call, or already re-sent once."""
        if not p.idempotent or p.stream is not None or p.follow_until is not None or not isinstance(error, PeerUnreachable):
            return False
        if self.host.closing or _finished(p) or self.node_down(p.ref.peer_id):
            return False
        p.follow_until = time.monotonic()  # marks it re-sent
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None
        p.channel = None
        self.submit(p, True)
        return True

    def _start_following(self, ref: ActorRef) -> None:
        spawn = ref._spawn
        if spawn is not None and not spawn.done():
            return  # already following
        fut = self.loop.create_future()
        ref._spawn = fut
        self.host.spawn(self._find_again(ref, fut))

    async def _find_again(self, ref: ActorRef, fut: asyncio.Future) -> None:
        """Resolve ``ref``'s name until it names an actor on a node not known to be down."""
        deadline = self.loop.time() + _FOLLOW_FOR
        delay = 0.05
        while True:
            await asyncio.sleep(delay)  # (its supervisor needs a moment; so does a refused dial)
            found: ActorRef | None = None
            local = self.actors.get(ref.name)
            if local is not None and local.state in ("starting", "running"):
                found = local.ref
            else:
                try:
                    async with asyncio.timeout(max(0.1, deadline - self.loop.time())):
                        found = await self.dht.resolve_name(ref.name)
                except (LatticaError, TimeoutError):
                    found = None
            if found is not None and not self.node_down(found.peer_id):
                ref.peer_id = found.peer_id
                fut.set_result(ref)
                return
            if self.loop.time() >= deadline:
                fut.set_exception(ActorNotFound(f"{ref.name!r} did not come back within {_FOLLOW_FOR:.0f} s"))
                fut.exception()
                return
            delay = min(delay * 2, 0.5)

    def node_down(self, peer: PeerId) -> bool:
        """Membership holds ``peer`` suspect or dead."""
        state = self._node_state(peer)
        return state is not None and state != "alive"

    def _node_state(self, peer: PeerId) -> str | None:
        membership = self.host.membership
        if membership is None or peer == self.peer_id:
            return None
        m = membership.core.get(str(peer))
        return m.state if m is not None else None

    def _timed_out(self, p: _Pending) -> None:
        ch = p.channel
        if ch is not None and p.cid in ch.pending:
            if isinstance(ch, _RemoteChannel):
                ch.send([rpc.CANCEL, p.cid])
                # a slow actor, or a dead path (its NAT forgot it, a relay lost the other end):
                # a probe tells them apart, and a dead connection is aborted so the next call
                # finds a way again
                conn = self.host.conns.get(ch.peer)
                if conn is not None:
                    conn.probe(PROBE_TIMEOUT)
        self.fail_call(p, CallTimeout(f"call to {p.ref.name}.{p.msg[3]} timed out after {p.msg[6]} s"), cancel_local=True)

    def fail_call(self, p: _Pending, error: BaseException, cancel_local: bool = False) -> None:
        ch = p.channel
        if ch is not None and ch.pending.pop(p.cid, None) is not None:
            ch.returned(p.ref.name)
            if cancel_local and ch is self.local:
                if p.future is not None and p.future._cancel_hook is not None:
                    hook, p.future._cancel_hook = p.future._cancel_hook, None
                    hook()
                elif p.stream is not None and p.stream._cancel is not None:
                    p.stream._cancel()
        if p.timer is not None:
            p.timer.cancel()
        p.ungate()
        if p.future is not None:
            p.future._reject(error)
        elif p.stream is not None:
            p.stream._fail(error)

    def complete_call(self, p: _Pending, value: Any, error: tuple | None, end: bool = False) -> None:
        ch = p.channel
        if ch is None or ch.pending.pop(p.cid, None) is None:
            return  # timed out or cancelled already
        ch.returned(p.ref.name)
        if p.timer is not None:
            p.timer.cancel()
        if error is not None:
            exc = self._error(p, *error)
            if error[0] in (rpc.E_NOT_FOUND, rpc.E_DIED) and self.follow(p, exc, delivered=error[0] == rpc.E_DIED):
                return
            if p.future is not None:
                p.future._reject(exc)
            elif p.stream is not None:
                p.stream._fail(exc)
        elif p.future is not None:
            p.future._resolve(value)
        elif p.stream is not None:
            p.stream._finish()

    def _error(self, p: _Pending, kind: str, type_name: str, message: str, tb: str) -> BaseException:
        where = f"{p.ref.name}.{p.msg[3]}"
        if kind == rpc.E_REMOTE:
            return remote_error(type_name, message, tb)
        if kind == rpc.E_NOT_FOUND:
            spawn = p.ref._spawn
            if spawn is not None and spawn.done() and spawn.exception() is not None:
                return spawn.exception()  # type: ignore[return-value]
            return ActorNotFound(message)
        if kind == rpc.E_METHOD:
            return MethodNotFound(message)
        if kind == rpc.E_TIMEOUT:
            return CallTimeout(message)
        if kind == rpc.E_DIED:
            return ActorDied(message)
        if kind == rpc.E_MAILBOX:
            return MailboxFull(message)
        if kind == rpc.E_SPAWN:
            return SpawnError(f"actor {p.ref.name!r} failed to start: {type_name}: {message}\n{tb}".rstrip())
        if kind == rpc.E_CANCELLED:
            return asyncio.CancelledError(message)
        return ProtocolError(f"{where}: {message}")

    def on_reply(self, ch: _RemoteChannel, msg: list) -> None:
        ch.last_used = time.monotonic()
        kind = msg[0]
        if kind == rpc.MAILBOX:
            ch.returned(msg[1], msg[2])
            return
        p = ch.pending.get(msg[1])
        if p is None:
            return
        if kind == rpc.OK:
            self.complete_call(p, msg[2], None)
        elif kind == rpc.ERR:
            self.complete_call(p, None, (msg[2], msg[3], msg[4], msg[5]))
        elif kind == rpc.ITEM:
            if p.stream is not None:
                p.stream._push(msg[2])
        elif kind == rpc.END:
            self.complete_call(p, None, None, end=True)
        elif kind == rpc.ARGCRED:
            self._pump_arg(ch, p, msg[2], msg[3])

    # -- client streaming -----------------------------------------------------------------------

    def _pump_arg(self, ch: _RemoteChannel, p: _Pending, index: int, n: int) -> None:
        """The callee granted ``n`` more items of streamed argument ``index``."""
        if not p.stream_args or index not in p.stream_args:
            return
        if p.arg_state is None:
            p.arg_state = {}
        state = p.arg_state.get(index)
        if state is None:
            state = p.arg_state[index] = [n, None]
            self.host.spawn(self._pump(ch, p, index, p.stream_args[index], state))
            return
        state[0] += n
        if state[1] is not None and not state[1].done():
            state[1].set_result(None)

    async def _pump(self, ch: _RemoteChannel, p: _Pending, index: int, source: Any, state: list) -> None:
        try:
            async for value in source:
                while state[0] <= 0:
                    if p.cid not in ch.pending:
                        return
                    state[1] = self.loop.create_future()
                    await state[1]
                state[0] -= 1
                if p.cid not in ch.pending:
                    return
                ch.send([rpc.ARG, p.cid, index, value])
            ch.send([rpc.ARGEND, p.cid, index])
        except Exception as e:  # the source raised, or the codec refused an item
            if p.cid in ch.pending:
                ch.send([rpc.CANCEL, p.cid])
            self.fail_call(p, e if isinstance(e, LatticaError) else remote_error(*_error_parts(e)))

    def local_arg_streams(self, inv: _Invocation, p: _Pending) -> None:
        """A local call with streamed arguments: hand the caller's async iterators over directly."""
        for i, a in enumerate(inv.args):
            if isinstance(a, StreamArg):
                inv.args[i] = p.stream_args[a.index]  # type: ignore[index]

    # -- serving --------------------------------------------------------------------------------

    async def _serve(self, stream: Stream, conn: Connection) -> None:
        await _ServerChannel(self, stream, conn).serve()


# -- the caller's side of a ref: method handles and streaming calls ------------------------------


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
