"""``lattica.Future``: the result of a call, usable from any thread and any event loop.

It is an ``asyncio.Future`` owned by the node loop, so awaiting it there costs nothing extra;
``result(timeout)`` blocks other threads, ``await`` from another loop is bridged, and ``cancel()``
also cancels the call where it runs. ``get`` and ``wait`` follow Ray's spelling.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Iterable, Sequence

from .errors import Timeout

__all__ = ["Future", "get", "wait"]


class Future(asyncio.Future):
    """Result of a remote call: ``await fut``, ``fut.result(timeout)``, ``fut.cancel()``."""

    _cancel_hook: Callable[[], None] | None = None

    def _on_loop(self) -> bool:
        loop = self.get_loop()
        try:
            return asyncio.get_running_loop() is loop
        except RuntimeError:
            return False

    def result(self, timeout: float | None = None) -> Any:  # type: ignore[override]
        """The call's value; blocks (other threads) up to ``timeout`` s, then raises Timeout."""
        if not self.done():
            if self._on_loop():
                raise RuntimeError("the result is not ready; on the node loop, `await` the future")
            if not _wait_threadsafe([self], 1, timeout):
                raise Timeout(f"no result within {timeout} s (the call goes on; cancel() stops it)")
        return super().result()

    def exception(self, timeout: float | None = None) -> BaseException | None:  # type: ignore[override]
        if not self.done() and not self._on_loop():
            _wait_threadsafe([self], 1, timeout)
        return super().exception()

    def cancel(self, msg: Any = None) -> bool:
        """Cancel the call here and where it runs; False if it already finished."""
        if self.done():
            return False
        if not self._on_loop():
            self.get_loop().call_soon_threadsafe(self._cancel_on_loop, msg)
            return True
        return self._cancel_on_loop(msg)

    def _cancel_on_loop(self, msg: Any = None) -> bool:
        if self.done():
            return False
        hook, self._cancel_hook = self._cancel_hook, None
        if hook is not None:
            hook()
        return super().cancel(msg)

    def __await__(self):  # type: ignore[override]
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.get_loop():
            return (yield from super().__await__())
        bridge: concurrent.futures.Future = concurrent.futures.Future()

        def chain() -> None:
            def copy(f: asyncio.Future) -> None:
                if f.cancelled():
                    bridge.cancel()
                elif f.exception() is not None:
                    bridge.set_exception(f.exception())  # type: ignore[arg-type]
                else:
                    bridge.set_result(f.result())

            self.add_done_callback(copy)

        self.get_loop().call_soon_threadsafe(chain)
        return (yield from asyncio.wrap_future(bridge).__await__())


def _wait_threadsafe(futs: Sequence[asyncio.Future], num: int, timeout: float | None) -> bool:
    """Block this (non-loop) thread until ``num`` of ``futs`` are done; False on timeout."""
    event = threading.Event()
    lock = threading.Lock()
    count = [0]

    def one_done(_: asyncio.Future) -> None:
        with lock:
            count[0] += 1
            if count[0] >= num:
                event.set()

    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
    for f in futs:
        by_loop.setdefault(f.get_loop(), []).append(f)
    for loop, group in by_loop.items():

        def register(group: list[asyncio.Future] = group) -> None:
            for f in group:
                f.add_done_callback(one_done)

        if loop.is_closed():
            raise RuntimeError("the node this future belongs to has stopped")
        loop.call_soon_threadsafe(register)
    return event.wait(timeout)


def _on_any_loop(futs: Iterable[asyncio.Future]) -> bool:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return any(f.get_loop() is running for f in futs)


def get(refs: Future | Sequence[Future], timeout: float | None = None) -> Any:
    """The value of a future, or the list of values of a list of futures (Ray's ``ray.get``).
    Raises the call's error, or Timeout after ``timeout`` seconds. Not for use on a node loop."""
    single = isinstance(refs, asyncio.Future)
    futs = [refs] if single else list(refs)  # type: ignore[list-item]
    if _on_any_loop(futs):
        raise RuntimeError("lattica.get blocks; inside async code `await` the futures instead")
    pending = [f for f in futs if not f.done()]
    if pending and not _wait_threadsafe(pending, len(pending), timeout):
        raise Timeout(f"{sum(not f.done() for f in futs)} of {len(futs)} results not ready within {timeout} s")
    values = [asyncio.Future.result(f) for f in futs]
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
