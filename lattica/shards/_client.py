"""A stub for one shard of a service: calls go to one of its providers, picked by load and
latency, and a call that failed on one is tried on another (docs/shards.md).

The providers come from the DHT (looked up at the first call, again every ``REFRESH`` seconds
while the stub is used, and at once when none is left to try). Before its first call to a
provider, the stub asks the provider's node whether that actor serves the shard now (a
registration that outlived a change is found out, and the provider left alone for
``MISMATCH_BAN`` seconds). A call that fails because the provider is unreachable, its actor died
or is gone, or the attempt timed out, is tried on another provider: at once the first time, then
after a short backoff, for up to ``within`` seconds in all; if it might have run (died in flight,
timed out), only when the call is idempotent. An error raised by the method itself is the
caller's, not retried. An idempotent call still unanswered after twice the p95 of the stub's
recent calls is also sent to a second provider (**hedged**), and the first answer wins: a
provider that went silent (a dead machine sends no reset; a QUIC peer's death is silent) costs
that delay, not an attempt timeout. A streaming call (``stub.method.stream(...)``) is tried
elsewhere in the same way until its first item arrives; after that the items come from that
provider, and a failure there is the caller's (a stream is not resumed mid-way).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from lattica._future import Future
from lattica._runtime import ActorRef, run_coroutine
from lattica._runtime.limits import ASYNC
from lattica._runtime.refs import StreamCall
from lattica.errors import (
    ActorDied,
    ActorNotFound,
    CallTimeout,
    LatticaError,
    MailboxFull,
    PeerUnreachable,
    ShardUnavailable,
)
from lattica.shards._keys import shard_id
from lattica.shards._select import Picker, Provider

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._runtime import Runtime

__all__ = ["Stub", "StubMethod", "StubStream"]

REFRESH = 10.0  # s between lookups of the providers while the stub is used
MISMATCH_BAN = 300.0  # s a provider that does not serve the shard is left alone
CHECK_TIMEOUT = 3.0  # s for a provider's node to say whether it serves the shard
BACKOFF_FIRST, BACKOFF_MAX = 0.02, 0.5  # s between attempts after the first retry (doubling)
# failures after which the call may be tried elsewhere: nothing ran (first two), or it may have
RETRY_ALWAYS = (ActorNotFound, MailboxFull)
RETRY_IDEMPOTENT = (PeerUnreachable, ActorDied, CallTimeout)
HEDGE_SAMPLES = 8  # calls measured before hedging starts
HEDGE_FACTOR, HEDGE_MIN = 2.0, 0.005  # a second attempt after 2 x the p95 of recent calls, at least 5 ms
# second attempts are at most a tenth of the calls (10 at once): under load every call is slow,
# and hedging them all would double the load that made them slow
HEDGE_SHARE, HEDGE_BURST = 0.1, 10.0


class _Unchecked(LatticaError):
    """(internal) The provider's node says it does not serve the shard (``mismatch``), or could
    not be asked: either way the call did not run there."""

    def __init__(self, message: str, mismatch: bool = False) -> None:
        super().__init__(message)
        self.mismatch = mismatch


class _Attempts:
    """One call's way through the providers, shared by plain and streaming calls: the ones
    tried and why each failed, whether the DHT was asked again, the backoff between attempts,
    and the deadline past which the call is ``ShardUnavailable``."""

    def __init__(
        self,
        picker: Picker,
        find: Callable[[float], Awaitable[None]],
        loop: asyncio.AbstractEventLoop,
        deadline: float,
        what: str,
    ) -> None:
        self._picker = picker
        self._find = find  # asks the DHT for the providers again, within so many seconds
        self._loop = loop
        self._what = what  # "shard S of service V", for errors
        self.deadline = deadline
        self.tried: list[Provider] = []
        self.errors: list[str] = []
        self.delay = 0.0
        self.looked = False  # the DHT was asked again since ``tried`` last started over

    async def next(self) -> Provider:
        """The provider for the next attempt, not one tried: when every provider we knew was
        tried or is left alone, the DHT is asked again (once), then the first to be free again
        is waited for (``tried`` starts over); ShardUnavailable past the deadline."""
        loop = self._loop
        while True:
            p = self._picker.pick(exclude=self.tried)
            if p is None and not self.looked:
                self.looked = True
                await self._find(max(0.0, self.deadline - loop.time()))
                p = self._picker.pick(exclude=self.tried)
            if p is not None:
                return p
            first = self._picker.next_ready()
            if first is None or first >= self.deadline or loop.time() >= self.deadline:
                raise ShardUnavailable(self.unavailable())
            await asyncio.sleep(max(0.0, first - loop.time()))
            self.tried.clear()
            self.looked = False

    def failed(self, p: Provider, exc: BaseException, idempotent: bool) -> BaseException:
        """An attempt on ``p`` failed with ``exc``: noted; raised again if the call may have run
        there and is not idempotent."""
        self.tried.append(p)
        self.errors.append(f"{_who(p)}: {type(exc).__name__}: {exc}")
        if not idempotent and not isinstance(exc, (_Unchecked,) + RETRY_ALWAYS):
            raise exc
        return exc

    async def back_off(self, failure: BaseException | None) -> None:
        """Between a failed attempt and the next: ShardUnavailable past the deadline, else the
        backoff (none before the first retry, then doubling)."""
        loop = self._loop
        if loop.time() >= self.deadline:
            raise ShardUnavailable(self.unavailable()) from failure
        if self.delay:
            await asyncio.sleep(min(self.delay, max(0.0, self.deadline - loop.time())))
        self.delay = min(max(self.delay * 2, BACKOFF_FIRST), BACKOFF_MAX)

    def unavailable(self) -> str:
        head = f"no provider of {self._what} answered"
        if not self.errors:
            return head + " (none is registered in the DHT)"
        return head + ": " + "; ".join(self.errors[-6:])


class Stub:
    """Calls to one shard of a service (see the module docstring). Made by
    ``lattica.shards.stub(service, shard)``; ``stub.method.remote(*args)`` as with an actor ref."""

    def __init__(
        self,
        rt: Runtime,
        service: str,
        shard: str | Mapping[str, Any],
        *,
        timeout: float | None = None,
        within: float = 30.0,
        idempotent: bool = True,
        hedge: bool = True,
    ) -> None:
        self._rt = rt
        self.service = service
        self.shard = shard_id(shard)
        self.timeout = timeout
        self.within = within
        self.idempotent = idempotent
        self.hedge = hedge
        self.hedged = 0  # second attempts made because the first was slow
        self._recent: collections.deque[float] = collections.deque(maxlen=100)  # seconds of recent successful calls
        self._p95: float | None = None
        self._since_p95 = 0
        self._hedges = 0.0  # second attempts we may make now (HEDGE_SHARE more with every call)
        self._picker = Picker()
        self._checked: dict[tuple[PeerId, str], float] = {}  # providers whose node said they serve the shard -> when
        self._looked_up = float("-inf")
        self._lookup: asyncio.Future[list[tuple[ActorRef, int]]] | None = None

    def __repr__(self) -> str:
        return f"Stub({self.service!r}, {self.shard!r}, providers={len(self._picker.providers)})"

    def __getattr__(self, method: str) -> StubMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return StubMethod(self, method)

    def providers(self) -> Future:
        """Look the providers up now: a Future of their refs."""

        async def go() -> list[ActorRef]:
            await self._find(everywhere=True)
            return [p.ref for p in self._picker.providers.values()]

        return run_coroutine(self._rt, go)

    # -- on the node loop -------------------------------------------------------------------------

    async def _find(self, everywhere: bool, within: float | None = None) -> None:
        """Look the providers up (one lookup at a time, shared by the calls that need it; a call
        waits for it at most ``within`` seconds)."""
        if self._lookup is None:
            self._lookup = asyncio.ensure_future(
                self._rt.host.services.shards.providers(self.service, self.shard, everywhere)
            )
            self._lookup.add_done_callback(_lookup_done)
            self._lookup.add_done_callback(lambda _: setattr(self, "_lookup", None))
        try:
            found = await asyncio.wait_for(asyncio.shield(self._lookup), timeout=within)
        except (TimeoutError, LatticaError):
            return  # (the providers we knew stay)
        self._looked_up = self._rt.loop.time()
        self._picker.update(found)

    async def _check(self, p: Provider, left: float) -> None:
        """Ask ``p``'s node whether ``p`` serves the shard (again after ``REFRESH``): _Unchecked
        if it says no or cannot say (nothing of the call ran)."""
        key = (p.ref.peer_id, p.ref.name)
        now = self._rt.loop.time()
        if now - self._checked.get(key, float("-inf")) < REFRESH:
            return
        shards = ActorRef(p.ref.peer_id, "shards", {"check": ASYNC})
        try:
            ok = await self._rt.call(
                shards,
                "check",
                (self.service, self.shard, p.ref.name),
                {},
                timeout=max(0.001, min(CHECK_TIMEOUT, left)),
            )
        except LatticaError as exc:
            raise _Unchecked(
                f"its node did not say whether it serves {self.shard!r}: {type(exc).__name__}: {exc}"
            ) from None
        if ok is not True:
            raise _Unchecked(f"does not serve {self.shard!r} (registration stale or wrong)", mismatch=True)
        if len(self._checked) >= 4096:
            self._checked.clear()
        self._checked[key] = now

    def _hedge_after(self) -> float | None:
        """Seconds after which an attempt still unanswered gets a second one on another provider:
        ``HEDGE_FACTOR`` x the p95 of this stub's recent calls (None until enough were measured,
        or with hedging off)."""
        if not self.hedge or len(self._recent) < HEDGE_SAMPLES:
            return None
        self._since_p95 -= 1
        if self._p95 is None or self._since_p95 <= 0:  # (recomputed every 16 calls, not every call)
            ranked = sorted(self._recent)
            self._p95, self._since_p95 = ranked[int(len(ranked) * 0.95)], 16
        return max(HEDGE_MIN, HEDGE_FACTOR * self._p95)

    async def _begin(
        self, p: Provider, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float, idempotent: bool
    ) -> tuple[Provider, Future, float]:
        """Check ``p`` (usually known already) and send the call: ``(p, its Future, when)``."""
        self._picker.started(p)
        t0 = time.perf_counter()  # (latency: not the loop clock, whole milliseconds under uvloop)
        try:
            await self._check(p, timeout)
        except _Unchecked as exc:
            self._picker.failed(p, str(exc), ban=MISMATCH_BAN if exc.mismatch else None)
            raise
        except BaseException:
            self._picker.cancelled(p, 0.0)
            raise
        left = max(0.001, timeout - (time.perf_counter() - t0))
        return p, self._rt.call(p.ref, method, args, kwargs, timeout=left, idempotent=idempotent), t0

    def _end(self, p: Provider, fut: Future, t0: float) -> Any:
        """A finished attempt's value, or its error raised, with the picker's book-keeping (a
        provider that answered with the method's own error is not blamed)."""
        took = time.perf_counter() - t0
        exc = asyncio.CancelledError() if fut.cancelled() else fut.exception()
        if exc is None:
            self._picker.succeeded(p, took)
            self._recent.append(took)
            return fut.result()
        if isinstance(exc, RETRY_ALWAYS + RETRY_IDEMPOTENT):
            self._picker.failed(p, type(exc).__name__)
        else:
            self._picker.succeeded(p, took)
        raise exc

    async def _attempts(self) -> _Attempts:
        """A new call's attempts, the providers looked up again first if it is time."""
        loop = self._rt.loop

        async def find_everywhere(within: float) -> None:
            await self._find(everywhere=True, within=within)

        attempts = _Attempts(
            self._picker,
            find_everywhere,
            loop,
            loop.time() + self.within,
            f"shard {self.shard!r} of service {self.service!r}",
        )
        if loop.time() - self._looked_up > REFRESH:
            await self._find(everywhere=False, within=self.within)
        return attempts

    async def call(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None, idempotent: bool
    ) -> Any:
        loop = self._rt.loop
        attempts = await self._attempts()
        tried = attempts.tried
        while True:
            p = await attempts.next()
            left = attempts.deadline - loop.time()
            attempt = max(left if timeout is None else min(timeout, left), 0.001)
            self._hedges = min(self._hedges + HEDGE_SHARE, HEDGE_BURST)
            after = self._hedge_after() if idempotent and self._hedges >= 1.0 else None
            failure: BaseException | None = None
            pending: list[tuple[Provider, Future, float]] = []
            try:
                pending.append(await self._begin(p, method, args, kwargs, attempt, idempotent))
                hedge_at = None if after is None else loop.time() + after
                while pending:
                    finished = [a for a in pending if a[1].done()]
                    if not finished:
                        waiter = loop.create_future()

                        def wake(*_: Any, waiter: asyncio.Future[None] = waiter) -> None:
                            if not waiter.done():
                                waiter.set_result(None)

                        for a in pending:
                            a[1].add_done_callback(wake)
                        timer = None if hedge_at is None else loop.call_later(max(0.0, hedge_at - loop.time()), wake)
                        try:
                            await waiter
                        finally:
                            if timer is not None:
                                timer.cancel()
                        finished = [a for a in pending if a[1].done()]
                    if not finished:  # slow: a second attempt on another provider, the first answer wins
                        hedge_at = None
                        other = self._picker.pick(exclude=tried + [a[0] for a in pending])
                        if other is not None and self._hedges >= 1.0:
                            self._hedges -= 1.0
                            self.hedged += 1
                            try:
                                pending.append(await self._begin(other, method, args, kwargs, attempt, idempotent))
                            except _Unchecked as exc:
                                failure = attempts.failed(other, exc, idempotent)
                        continue
                    for a in finished:
                        pending.remove(a)
                        try:
                            return self._end(*a)
                        except RETRY_ALWAYS + RETRY_IDEMPOTENT as exc:
                            failure = attempts.failed(a[0], exc, idempotent)
            except _Unchecked as exc:
                failure = attempts.failed(p, exc, idempotent)
            finally:
                for q, fut, t0 in pending:  # (the other attempt answered first, or the call ended)
                    fut.cancel()
                    self._picker.cancelled(q, time.perf_counter() - t0)
            if isinstance(failure, _Unchecked) and loop.time() < attempts.deadline:
                continue  # (nothing ran: straight to another)
            await attempts.back_off(failure)

    async def stream(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
        idempotent: bool,
        out: Any,
    ) -> None:
        """A streaming call: tried on providers in turn until one sends its first item (or ends
        at once), which then feeds ``out``; ``out`` fails with the error that ended the search."""
        loop = self._rt.loop
        try:
            attempts = await self._attempts()
            deadline = attempts.deadline
            while not out._done:  # (the consumer may give up meanwhile)
                p = await attempts.next()
                left = deadline - loop.time()
                attempt = StubStream(out, loop)
                try:
                    await self._check(p, left)
                except _Unchecked as exc:
                    self._picker.failed(p, str(exc), ban=MISMATCH_BAN if exc.mismatch else None)
                    attempts.failed(p, exc, idempotent)
                    continue
                self._picker.started(p)
                t0 = time.perf_counter()
                left = max(deadline - loop.time(), 0.001)
                self._rt.call(
                    p.ref,
                    method,
                    args,
                    kwargs,
                    timeout=left if timeout is None else min(timeout, left),
                    stream=attempt,
                    idempotent=idempotent,
                )
                try:
                    await attempt.first
                except RETRY_ALWAYS + RETRY_IDEMPOTENT as exc:
                    self._picker.failed(p, type(exc).__name__)
                    attempts.failed(p, exc, idempotent)
                    await attempts.back_off(exc)
                    continue
                except BaseException:
                    # (the method's own error: not the provider's fault)
                    self._picker.succeeded(p, time.perf_counter() - t0)
                    raise
                self._picker.succeeded(p, time.perf_counter() - t0)  # (the first item's delay)
                return
        except BaseException as exc:  # noqa: BLE001 -- the consumer gets it
            out._fail(
                exc
                if not isinstance(exc, asyncio.CancelledError)
                else asyncio.CancelledError("the stub's stream was cancelled")
            )


class StubMethod:
    """``stub.method``: ``.remote(*args, **kwargs)`` calls it on a provider; ``.options(timeout=,
    idempotent=)`` for this call only."""

    __slots__ = ("_stub", "_name", "_timeout", "_idempotent")

    def __init__(self, stub: Stub, name: str, timeout: float | None = None, idempotent: bool | None = None) -> None:
        self._stub, self._name = stub, name
        self._timeout = stub.timeout if timeout is None else timeout
        self._idempotent = stub.idempotent if idempotent is None else idempotent

    def options(self, *, timeout: float | None = None, idempotent: bool | None = None) -> StubMethod:
        return StubMethod(
            self._stub,
            self._name,
            self._timeout if timeout is None else timeout,
            self._idempotent if idempotent is None else idempotent,
        )

    def remote(self, *args: Any, **kwargs: Any) -> Future:
        s = self._stub
        return run_coroutine(s._rt, lambda: s.call(self._name, args, kwargs, self._timeout, self._idempotent))

    def stream(self, *args: Any, **kwargs: Any) -> StreamCall:
        """Call a generator method on a provider; iterate the result with ``async for`` or
        ``for``. Tried on another provider until the first item arrives, not after."""
        s = self._stub
        out = StreamCall(s._rt)
        run_coroutine(s._rt, lambda: s.stream(self._name, args, kwargs, self._timeout, self._idempotent, out._state))
        return out


class StubStream:
    """One attempt of a streaming call through a stub, fed by the runtime as a stream's state:
    until its first item it only tells the stub how it went (``first``: a failure is the stub's,
    to try another provider); from the first item on it feeds the caller's stream, whose credit
    and cancel then reach this provider."""

    def __init__(self, out: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._out = out
        self._ended = False
        self._committed = False
        self._grant: Any = None
        self._cancel: Any = None
        self._rtt: Any = None
        self.first: asyncio.Future[None] = loop.create_future()

    @property
    def _done(self) -> bool:
        return self._ended or self._out._done  # (the consumer gave up: the runtime stops it)

    def _bind(self, grant: Any, cancel: Any, rtt: Any = None) -> None:
        self._grant, self._cancel, self._rtt = grant, cancel, rtt
        if self._committed:
            self._out._bind(grant, cancel, rtt)
        elif self._out._done:
            cancel()

    def _commit(self) -> None:
        if not self._committed:
            self._committed = True
            if self._grant is not None:
                self._out._bind(self._grant, self._cancel, self._rtt)
            if not self.first.done():
                self.first.set_result(None)

    def _push(self, value: Any, nbytes: int = 0) -> None:
        self._commit()
        self._out._push(value, nbytes)

    def _finish(self) -> None:
        self._ended = True
        self._commit()
        self._out._finish()

    def _fail(self, error: BaseException) -> None:
        if self._ended:
            return
        self._ended = True
        if self._committed:
            self._out._fail(error)
        elif not self.first.done():
            self.first.set_exception(error)
            self.first.exception()  # (read: the stub awaits it, or gave up)


def _lookup_done(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # (read: a failed lookup nobody waited for is not "never retrieved")


def _who(p: Provider) -> str:
    return f"{p.ref.peer_id.short()}/{p.ref.name}"
