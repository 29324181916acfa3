"""``lattica.Future``: the result of a call, usable from any thread and any event loop.

It wraps an ``asyncio.Future`` owned by the node loop (awaiting it there costs one extra frame),
blocks other threads in ``result(timeout)``, bridges ``await`` from any other loop (so
``asyncio.gather`` and ``asyncio.wait_for`` work there too), and ``cancel()`` also cancels the
call where it runs. ``get`` and ``wait`` follow Ray's spelling.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Generator, Sequence
from typing import Any

from lattica.errors import Timeout

__all__ = ["Future", "get", "wait"]


class Future:
    """Result of a call: ``await fut``, ``fut.result(timeout)``, ``fut.cancel()``, ``fut.done()``."""

    __slots__ = ("_fut", "_cancel_hook", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._fut: asyncio.Future[Any] = loop.create_future()
        self._cancel_hook: Callable[[], None] | None = None

    # -- resolved by the runtime, on the node loop --------------------------------------------

    def _resolve(self, value: Any) -> None:
        self._cancel_hook = None  # nothing left to cancel; also frees whatever the hook holds
        if not self._fut.done():
            self._fut.set_result(value)

    def _reject(self, error: BaseException) -> None:
        self._cancel_hook = None
        if not self._fut.done():
            self._fut.set_exception(error)
            self._fut.exception()  # an ignored call result is normal: no "never retrieved" warning

    # -- public ---------------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The node loop this future belongs to."""
        return self._fut.get_loop()

    def done(self) -> bool:
        return self._fut.done()

    def cancelled(self) -> bool:
        return self._fut.cancelled()

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._fut.get_loop()
        except RuntimeError:
            return False

    def result(self, timeout: float | None = None) -> Any:
        """The call's value; blocks (other threads) up to ``timeout`` s, then raises Timeout."""
        if not self._fut.done():
            if self._on_loop():
                raise RuntimeError("the result is not ready; on the node loop, `await` the future")
            if not _wait_threadsafe([self], 1, timeout):
                raise Timeout(f"no result within {timeout} s (the call goes on; cancel() stops it)")
        return self._fut.result()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's error (None if it succeeded); waits like ``result``."""
        if not self._fut.done():
            if self._on_loop():
                raise RuntimeError("the call is not finished; on the node loop, `await` the future")
            if not _wait_threadsafe([self], 1, timeout):
                raise Timeout(f"the call did not finish within {timeout} s")
        return self._fut.exception()

    def add_done_callback(self, fn: Callable[[Future], Any]) -> None:
        """Call ``fn(self)`` on the node loop once the call finishes."""

        def register() -> None:
            self._fut.add_done_callback(lambda _: fn(self))

        register() if self._on_loop() else self._fut.get_loop().call_soon_threadsafe(register)

    def cancel(self) -> bool:
        """Cancel the call here and where it runs; False if it already finished."""
        if self._fut.done():
            return False
        if not self._on_loop():
            self._fut.get_loop().call_soon_threadsafe(self._cancel_on_loop)
            return True
        return self._cancel_on_loop()

    def _cancel_on_loop(self) -> bool:
        if self._fut.done():
            return False
        hook, self._cancel_hook = self._cancel_hook, None
        self._fut.cancel()  # first: the runtime's own "cancelled" reply must not win the race
        if hook is not None:
            hook()
        return True

    def __await__(self) -> Generator[Any, None, Any]:
        if self._on_loop():
            return (yield from self._fut.__await__())
        bridge: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def chain() -> None:
            def copy(f: asyncio.Future[Any]) -> None:
                if f.cancelled():
                    bridge.cancel()
                elif f.exception() is not None:
                    bridge.set_exception(f.exception())
                else:
                    bridge.set_result(f.result())

            self._fut.add_done_callback(copy)

        self._fut.get_loop().call_soon_threadsafe(chain)
        try:
            return (yield from asyncio.wrap_future(bridge).__await__())
        except asyncio.CancelledError:
            self.cancel()  # the awaiting task was cancelled (e.g. by wait_for): cancel the call
            raise

    def __repr__(self) -> str:
        state = "pending" if not self._fut.done() else ("cancelled" if self._fut.cancelled() else "done")
        return f"<lattica.Future {state}>"


def _wait_threadsafe(futs: Sequence[Future], num: int, timeout: float | None) -> bool:
    """Block this (non-loop) thread until ``num`` of ``futs`` are done; False on timeout."""
    event = threading.Event()
    lock = threading.Lock()
    count = [0]

    def one_done(_: asyncio.Future[Any]) -> None:
        with lock:
            count[0] += 1
            if count[0] >= num:
                event.set()

    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[Any]]] = {}
    for f in futs:
        by_loop.setdefault(f._fut.get_loop(), []).append(f._fut)
    for loop, group in by_loop.items():

        def register(group: list[asyncio.Future[Any]] = group) -> None:
            for f in group:
                f.add_done_callback(one_done)

        if loop.is_closed():
            raise RuntimeError("the node this future belongs to has stopped")
        loop.call_soon_threadsafe(register)
    return event.wait(timeout)


def _on_any_loop(futs: Sequence[Future]) -> bool:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return any(f._fut.get_loop() is running for f in futs)


def get(refs: Future | Sequence[Future], timeout: float | None = None) -> Any:
    """The value of a future, or the list of values of a list of futures (Ray's ``ray.get``).
    Raises the call's error, or Timeout after ``timeout`` seconds. Not for use on a node loop."""
    single = isinstance(refs, Future)
    futs: list[Future] = [refs] if isinstance(refs, Future) else list(refs)
    if _on_any_loop(futs):
        raise RuntimeError("lattica.get blocks; inside async code `await` the futures instead")
    pending = [f for f in futs if not f.done()]
    if pending and not _wait_threadsafe(pending, len(pending), timeout):
        raise Timeout(f"{sum(not f.done() for f in futs)} of {len(futs)} results not ready within {timeout} s")
    values = [f._fut.result() for f in futs]
    return values[0] if single else values


def wait(
    refs: Sequence[Future], num_returns: int = 1, timeout: float | None = None
) -> tuple[list[Future], list[Future]]:
    """Wait until ``num_returns`` futures are done or ``timeout`` passes; return (ready, pending),
    each in the order given (Ray's ``ray.wait``)."""
    futs = list(refs)
    if not 0 < num_returns <= len(futs):
        raise ValueError(f"num_returns must be between 1 and {len(futs)}")
    if _on_any_loop(futs):
        raise RuntimeError("lattica.wait blocks; inside async code use asyncio.wait on the futures")
    done_now = sum(f.done() for f in futs)
    if done_now < num_returns:
        _wait_threadsafe([f for f in futs if not f.done()], num_returns - done_now, timeout)
    ready = [f for f in futs if f.done()][:num_returns]
    chosen = set(map(id, ready))
    return ready, [f for f in futs if id(f) not in chosen]
