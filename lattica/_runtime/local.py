"""Local actor execution: an actor's instance, its mailbox window, its async calls as tasks and its
sync methods on a pykka thread; invocations and argument streams."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import inspect
import threading
import time
import traceback
from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica import _context as context
from lattica import _rpc as rpc
from lattica._eager import eager_task
from lattica._identity import PeerId
from lattica._runtime import output
from lattica._runtime.limits import AGEN, ASYNC, GEN, HOOK_TIMEOUT, NO_STATE, STREAM_WINDOW, SYNC
from lattica._runtime.refs import ACTOR, CALLER, ActorRef
from lattica._runtime.window import ItemWindow, SentItems
from lattica.errors import (
    ProtocolError,
)
from lattica.logging import get_logger

if TYPE_CHECKING:
    import pykka

    from lattica._runtime.registry import Runtime

log = get_logger("lattica.runtime")

MAX_RECENT_ERRORS = 8  # errors kept per actor, with their tracebacks (the dashboard's)
MAX_ERROR_TEXT = 4000  # characters of a kept error's message, and of its traceback (its end)


def error_parts(exc: BaseException) -> tuple[str, str, str]:
    """(qualified type name, message, traceback) of an exception, even one whose str() fails."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = f"<{name} whose str() failed>"
    try:
        frames = exc.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
            frames = frames.tb_next  # (the runtime calling the method: not the user's to read)
        tb = "".join(traceback.format_exception(t, exc, frames or exc.__traceback__))
    except Exception:
        tb = ""
    return name, message, tb


class Sink:
    """Where an invocation's outcome goes: a local future/stream, or a remote caller."""

    @abstractmethod
    def ok(self, value: Any) -> None: ...
    @abstractmethod
    def err(self, kind: str, type_name: str, message: str, tb: str = "") -> None: ...
    @abstractmethod
    def item(self, value: Any) -> int:
        """Send one item of a stream; its encoded size (0: not encoded, a local consumer)."""
        ...

    @abstractmethod
    def end(self) -> None: ...


def _sent(inv: Invocation, nbytes: int) -> None:
    """An item of ``inv``'s stream went out, ``nbytes`` encoded: credit beyond what may now be
    held (``window.SentItems.cap``) is dropped at once (items that grew do not ride on credit
    granted for small ones)."""
    if not nbytes:
        return
    inv.sent_items.sent(nbytes)
    excess = inv.credit - inv.sent_items.cap()
    if excess <= 0:
        return
    w = inv.credit_waiter
    if isinstance(w, threading.Semaphore):  # a sync generator's thread takes its credit from it
        while excess > 0 and w.acquire(blocking=False):
            excess -= 1
            inv.credit -= 1
    else:
        inv.credit -= excess


class Invocation:
    __slots__ = (
        "actor",
        "method",
        "args",
        "kwargs",
        "deadline",
        "sink",
        "task",
        "replied",
        "streaming",
        "credit",
        "credit_waiter",
        "arg_streams",
        "timer",
        "done",
        "caller",
        "sent_items",
        "held",
    )

    def __init__(
        self,
        actor: LocalActor,
        method: str,
        args: list,
        kwargs: dict | None,
        deadline: float | None,
        sink: Sink,
        streaming: bool = False,
        caller: PeerId | None = None,
    ) -> None:
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
        self.sent_items = SentItems()  # items sent and not taken: what caps the credit we take, and when we send
        self.held: collections.deque | None = (
            None  # a sync generator's items (then its _Reply) waiting until they may go
        )
        self.credit_waiter: Any = None
        self.arg_streams: dict[int, ArgStream] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.done = False


class ArgStream:
    """What an actor method receives for a streamed argument: an async iterator of the caller's
    items, granting the caller credit as it is consumed (``window.ItemWindow``: with ``rtt``, for
    a caller whose grants say what was taken, the window grows on a long path as a streaming
    call's does; without, it stays at 16 items). ``grant(credit, taken)`` sends a grant."""

    def __init__(self, grant: Callable[[int, int], None], rtt: Callable[[], float | None] | None = None) -> None:
        self._items: collections.deque = collections.deque()
        self._ended = False
        self._waiter: asyncio.Future | None = None
        self._grant = grant
        self._credit = ItemWindow(rtt)

    def _push(self, value: Any, nbytes: int = 0) -> None:
        if self._ended:
            raise ProtocolError("caller sent a streamed argument item after its end")
        why = self._credit.received(nbytes)
        if why is not None:
            raise ProtocolError(f"streamed argument cut off: {why}")
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
            self._credit.starved = True
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        value = self._items.popleft()
        g = self._credit.took()
        if g is not None and not self._ended:
            self._grant(*g)
        return value


_executor_class: Any = None


def _start_executor(runtime: Runtime) -> pykka.ActorRef:
    """Start the thread that runs one actor's sync methods, one at a time, in mailbox order.
    pykka is imported on the first such actor: a node whose actors are all async never needs it."""
    global _executor_class
    if _executor_class is None:
        import pykka  # here: see the docstring

        class _Executor(pykka.ThreadingActor):
            # A daemon thread: the interpreter joins non-daemon threads *before* it runs the atexit
            # hook that stops the node (and with it this actor, on_stop included), so a script that
            # never calls lattica.shutdown() would otherwise hang at its end.
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

        _executor_class = _Executor
    return _executor_class.start(runtime)


class LocalActor:
    """One actor living on this node."""

    def __init__(
        self, runtime: Runtime, name: str, cls: type, methods: dict[str, str], max_concurrency: int, window: int
    ) -> None:
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
        self.waiting: collections.deque[Invocation] = collections.deque()  # for start-up or a slot
        self.running_async = 0
        self._draining = False
        self.live: set[Invocation] = set()
        self.executor: pykka.ActorRef | None = None
        self.ready: asyncio.Future = runtime.loop.create_future()
        self.ref = ActorRef(runtime.peer_id, name, methods, window)
        self.system = False  # built by the runtime (spawner, ...): cannot be killed by peers
        self.public: frozenset[str] = frozenset()  # methods strangers may call (lattica.trust)
        self.published = False  # named by the user: registered mesh-wide in the DHT while it lives
        self.exiting: str | None = None  # lattica.exit_actor was called: stop with this reason when idle
        self.calls = 0  # invocations finished (the dashboard's calls/s)
        self.errors = 0  # error replies sent
        self.recent_errors: collections.deque[dict[str, Any]] | None = (
            None  # the last MAX_RECENT_ERRORS, with tracebacks
        )
        self.output: output.OutputRing | None = None  # what it printed and logged (user actors)
        self.thread_id: int | None = None  # the native id of its sync methods' thread (its CPU time)
        self.started_at = time.time()

    @property
    def needs_thread(self) -> bool:
        return any(k in (SYNC, GEN) for k in self.methods.values())

    # -- construction ---------------------------------------------------------------------------

    def start(self, args: list, kwargs: dict | None, instance: Any = None, state: Any = NO_STATE) -> None:
        if instance is not None:  # system actors: built by the runtime itself
            self.system = True
            if self.needs_thread:
                self.executor = _start_executor(self.runtime)
            self._constructed(instance, None)
            return
        self.output = output.register(self.ref)
        if self.needs_thread:
            self.executor = _start_executor(self.runtime)
            self.executor.tell(self._note_thread)
            self.executor.tell(lambda: self._construct(args, kwargs, state))
        else:
            threading.Thread(
                target=self._construct, args=(args, kwargs, state), name=f"lattica-init-{self.name}", daemon=True
            ).start()

    def _note_thread(self) -> None:
        self.thread_id = threading.get_native_id()

    def _construct(self, args: list, kwargs: dict | None, state: Any = NO_STATE) -> None:
        actor_token = ACTOR.set(self.ref)  # (what the constructor prints is the actor's)
        try:
            instance = self.cls(*args, **(kwargs or {}))
            if state is not NO_STATE:  # a checkpoint of an earlier incarnation, before any call
                restore = getattr(instance, "restore", None)
                if not callable(restore):
                    raise TypeError(f"{self.cls.__name__} was given a checkpoint but has no restore(state) method")
                restore(state)
        except BaseException as e:  # noqa: BLE001 -- reported to the spawner's caller
            parts = error_parts(e)
            self.runtime.post(lambda: self._constructed(None, parts))
            return
        finally:
            ACTOR.reset(actor_token)
        self.runtime.post(lambda: self._constructed(instance, None))

    def _constructed(self, instance: Any, failure: tuple[str, str, str] | None) -> None:
        if self.state != "starting":
            return  # killed while starting
        if failure is not None:
            self.state = "failed"
            self.failure = failure
            self.runtime.forget(self)
            self._note_error("__init__", rpc.E_SPAWN, *failure)
            self._record_end(f"failed to start: {failure[0]}")
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
        if self.published and self.runtime.names is not None:
            self.runtime.names.register_name(self.name, self.ref)
        hook = getattr(instance, "on_start", None) if not self.system else None
        if hook is not None and inspect.iscoroutinefunction(hook):
            self.runtime.host.spawn(self._on_start(hook))
        self.ready.set_result(None)
        waiting, self.waiting = self.waiting, collections.deque()
        for inv in waiting:
            self.dispatch(inv)

    async def _on_start(self, hook: Callable[[], Any]) -> None:
        """An async ``on_start`` runs on the loop once the actor is up, beside its calls."""
        ACTOR.set(self.ref)
        context.ACTOR_RUNTIME.set(self.runtime)
        try:
            await hook()
        except Exception:
            log.exception("actor on_start hook failed", actor=self.name)

    # -- dispatch -------------------------------------------------------------------------------

    def _reply_ok(self, inv: Invocation, value: Any) -> None:
        if not inv.replied:
            inv.replied = True
            inv.sink.ok(value)

    def _reply_err(self, inv: Invocation, kind: str, type_name: str, message: str, tb: str = "") -> None:
        if not inv.replied:
            inv.replied = True
            self.errors += 1
            if kind != rpc.E_SPAWN:  # (a failed start is noted once, not once per call that waited for it)
                self._note_error(inv.method, kind, type_name, message, tb)
            inv.sink.err(kind, type_name, message, tb)

    def _note_error(self, method: str, kind: str, type_name: str, message: str, tb: str) -> None:
        """Keep the error for the dashboard (the last few, each cut to a bound)."""
        if self.recent_errors is None:
            self.recent_errors = collections.deque(maxlen=MAX_RECENT_ERRORS)
        self.recent_errors.append(
            {
                "time": time.time(),
                "method": method,
                "kind": kind,
                "type": type_name,
                "message": message[:MAX_ERROR_TEXT],
                "traceback": tb[-MAX_ERROR_TEXT:],
            }
        )

    def _record_end(self, reason: str) -> None:
        """Its output stops being collected; the runtime keeps a record of a user actor's end."""
        if self.output is not None:
            output.unregister(self.ref, self.output)
        if not self.system:
            self.runtime.remember_ended(self, reason)

    def _reply_end(self, inv: Invocation) -> None:
        if not inv.replied:
            inv.replied = True
            inv.sink.end()

    def dispatch(self, inv: Invocation) -> None:
        if self.state != "running":
            if self.state == "starting":
                self.waiting.append(inv)
                return
            self._reply_err(inv, rpc.E_DIED, "ActorDied", f"actor {self.name!r} has stopped")
            return
        kind = self.methods.get(inv.method)
        if kind is None:
            self._reply_err(
                inv, rpc.E_METHOD, "MethodNotFound", f"actor {self.name!r} has no public method {inv.method!r}"
            )
            return
        if inv.streaming != (kind in (AGEN, GEN)):
            what = (
                "a generator method: use .stream()" if kind in (AGEN, GEN) else "not a generator method: use .remote()"
            )
            self._reply_err(inv, rpc.E_METHOD, "MethodNotFound", f"{self.name}.{inv.method} is {what}")
            return
        if inv.deadline is not None and inv.deadline <= self.runtime.loop.time():
            self._reply_err(
                inv, rpc.E_TIMEOUT, "CallTimeout", f"deadline passed before {self.name}.{inv.method} started"
            )
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

    def _finish(self, inv: Invocation) -> None:
        """Release what the invocation holds here (its reply is separate: ``_reply_*``)."""
        if inv.done:
            return
        inv.done = True
        self.calls += 1
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

    def _start_async(self, inv: Invocation, kind: str) -> None:
        self.running_async += 1
        token = CALLER.set(inv.caller)  # the task below copies the context, so it keeps this value
        rt_token = context.ACTOR_RUNTIME.set(self.runtime)
        actor_token = ACTOR.set(self.ref)
        try:
            self._start_task(inv, kind)
        finally:
            ACTOR.reset(actor_token)
            context.ACTOR_RUNTIME.reset(rt_token)
            CALLER.reset(token)

    def _start_task(self, inv: Invocation, kind: str) -> None:
        try:
            if kind == AGEN:
                coro = self._drive_agen(inv)
            else:
                coro = self.bound[inv.method](*inv.args, **(inv.kwargs or {}))
        except Exception as e:  # e.g. wrong arguments
            self._async_done(inv)
            self._reply_err(inv, rpc.E_REMOTE, *error_parts(e))
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

    def _expire(self, inv: Invocation) -> None:
        if not inv.done and inv.task is not None:
            self._reply_err(
                inv, rpc.E_TIMEOUT, "CallTimeout", f"{self.name}.{inv.method} ran past its deadline and was cancelled"
            )
            inv.task.cancel()

    def _task_done(self, inv: Invocation, task: asyncio.Task) -> None:
        self._async_done(inv)
        if task.cancelled():
            self._reply_err(inv, rpc.E_CANCELLED, "CancelledError", f"{self.name}.{inv.method} was cancelled")
        elif task.exception() is not None:
            self._reply_err(inv, rpc.E_REMOTE, *error_parts(task.exception()))  # type: ignore[arg-type]
        elif task.result() is not _STREAMED:
            self._reply_ok(inv, task.result())

    def _async_done(self, inv: Invocation) -> None:
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

    async def _drive_agen(self, inv: Invocation) -> object:
        agen = self.bound[inv.method](*inv.args, **(inv.kwargs or {}))
        try:
            async for item in agen:
                while inv.credit <= 0 or not inv.sent_items.may_send():
                    inv.credit_waiter = self.runtime.loop.create_future()
                    await inv.credit_waiter
                if inv.replied:  # cancelled by the consumer
                    break
                inv.credit -= 1
                _sent(inv, inv.sink.item(item))
        finally:
            await agen.aclose()
        self._reply_end(inv)
        return _STREAMED  # the caller already got END: no OK follows

    def grant(self, inv: Invocation, n: int, taken: int) -> None:
        """The consumer of a streaming call granted ``n`` more items, having taken the oldest
        ``taken``: credit is taken up to ``SentItems.cap`` (grants beyond it are dropped, not
        kept), and what we held back while too much was unread may go."""
        inv.sent_items.taken(taken)
        if inv.held:
            self._send_held(inv)
        n = max(0, min(n, inv.sent_items.cap() - inv.credit))
        inv.credit += n
        w = inv.credit_waiter
        if isinstance(w, asyncio.Future):
            if not w.done():
                w.set_result(None)
        elif isinstance(w, threading.Semaphore) and n:
            w.release(n)

    def _send_held(self, inv: Invocation) -> None:
        """Send a sync generator's held items while they may go, and its end (END or ERR) once
        they are all out."""
        held = inv.held
        while held and not inv.replied:
            if type(held[0]) is _Reply:
                inv.held = None
                held.popleft().send()
            elif inv.sent_items.may_send():
                _sent(inv, inv.sink.item(held.popleft()))
            else:
                return

    def _run_sync(self, inv: Invocation, kind: str) -> None:
        """On the actor thread."""
        post = self.runtime.post
        if self.state != "running" or inv.replied:
            post(lambda: self._sync_done(inv, rpc.E_DIED if self.state != "running" else rpc.E_CANCELLED))
            return
        if inv.deadline is not None and self.runtime.loop.time() > inv.deadline:
            post(lambda: self._sync_done(inv, rpc.E_TIMEOUT))
            return
        token = CALLER.set(inv.caller)
        actor_token = ACTOR.set(self.ref)
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
                    post(functools.partial(self._deliver_item, inv, item))
                post(lambda: self._sync_done(inv, None, end=True))
                return
        except _Abandoned:
            post(lambda: self._sync_done(inv, rpc.E_CANCELLED))
            return
        except Exception as e:
            parts = error_parts(e)
            post(lambda: self._sync_done(inv, rpc.E_REMOTE, parts=parts))
            return
        finally:
            ACTOR.reset(actor_token)
            CALLER.reset(token)
        post(lambda: self._sync_done(inv, None, value=result))

    def _deliver_item(self, inv: Invocation, item: Any) -> None:
        """A sync generator's item reaches the loop: it used one credit (the thread's semaphore
        already counted it; ``inv.credit`` mirrors it so grants stay within one window). It goes
        now, or is held while the consumer has too much unread (the thread may run ahead of
        what the consumer took by the credit it holds)."""
        if not inv.replied:
            inv.credit -= 1
            if inv.held or not inv.sent_items.may_send():
                if inv.held is None:
                    inv.held = collections.deque()
                inv.held.append(item)
            else:
                _sent(inv, inv.sink.item(item))

    def _sync_done(
        self, inv: Invocation, kind: str | None, value: Any = None, parts: tuple | None = None, end: bool = False
    ) -> None:
        self._finish(inv)
        if inv.held and kind in (None, rpc.E_REMOTE):  # the generator ended or raised: after the items still held
            inv.held.append(_Reply(lambda: self._sync_reply(inv, kind, value, parts, end)))
            return
        inv.held = None
        self._sync_reply(inv, kind, value, parts, end)

    def _sync_reply(self, inv: Invocation, kind: str | None, value: Any, parts: tuple | None, end: bool) -> None:
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

    def cancel(self, inv: Invocation) -> None:
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
        inv.args, inv.kwargs, inv.held = [], None, None  # a queued sync job keeps no payload alive
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
        self._record_end(reason)
        self.runtime.actor_ended(self.name, reason)
        self.runtime.monitors.actor_stopped(self.name, reason)
        if self.published and was_running and self.runtime.names is not None:
            self.runtime.names.unregister_name(self.name)
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
                    await asyncio.wait_for(hook(), HOOK_TIMEOUT)
                elif self.executor is not None:  # behind any sync job still running: bounded wait
                    await asyncio.wait_for(asyncio.wrap_future(_on_thread(self.executor, hook)), HOOK_TIMEOUT)
                else:
                    hook()
        except Exception:
            log.exception("actor on_stop hook failed or timed out", actor=self.name)
        finally:
            if self.executor is not None:
                self.executor.stop(block=False)


class EndedActor:
    """What a user actor that ended leaves for the dashboard: how it ended, its last errors and
    its output (not its instance)."""

    __slots__ = (
        "name",
        "cls",
        "state",
        "reason",
        "failure",
        "errors",
        "output",
        "calls",
        "error_count",
        "started_at",
        "ended_at",
    )

    def __init__(self, actor: LocalActor, reason: str) -> None:
        self.name = actor.name
        self.cls = actor.cls
        self.state = actor.state
        self.reason = reason
        self.failure = actor.failure
        self.errors = list(actor.recent_errors or ())
        self.output = actor.output
        self.calls = actor.calls
        self.error_count = actor.errors
        self.started_at = actor.started_at
        self.ended_at = time.time()


class _Abandoned(Exception):
    pass


async def reset_quietly(stream: Any) -> None:
    try:
        stream.reset()
    except Exception:  # the stream may already be gone
        pass


_STREAMED = object()  # what a streaming method's driver returns: its END was already sent


class _Reply:
    """A sync generator's end (END, or the ERR of what it raised), held behind its items."""

    __slots__ = ("send",)

    def __init__(self, send: Callable[[], None]) -> None:
        self.send = send


def _on_thread(executor: pykka.ActorRef, fn: Callable[[], Any]) -> Any:
    cf: concurrent.futures.Future = concurrent.futures.Future()

    def job() -> None:
        try:
            cf.set_result(fn())
        except BaseException as e:  # noqa: BLE001
            cf.set_exception(e)

    executor.tell(job)
    return cf
