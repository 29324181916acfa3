"""Process-wide context: which node a call from this thread goes through, and one dial flag.

Every room may import this module and it imports none of them, so "who is the current runtime"
never needs the node, the API or the runtime to import each other:

- the default node of ``lattica.init()``;
- the runtime that owns a thread (a node's loop thread, its actors' threads), and the runtime of
  the actor task running now (nodes sharing one loop, ``Node.astart``, share its thread);
- the flag that keeps the dialer from asking the DHT for a peer's addresses while the DHT (or the
  NAT manager) is itself dialing, which would recurse.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lattica._host import Host

__all__ = [
    "NodeHandle",
    "default_node",
    "set_default_node",
    "runtime_for_thread",
    "bind_thread",
    "thread_runtime",
    "unbind_thread",
    "add_live",
    "discard_live",
    "live_runtimes",
    "ACTOR_RUNTIME",
    "NO_DHT_DIAL_LOOKUP",
]


class NodeHandle(Protocol):
    """What this module needs of a node (``lattica.Node``): its host while it runs."""

    @property
    def running(self) -> bool: ...

    @property
    def host(self) -> Host | None: ...

    def stop(self) -> None: ...


_default_node: NodeHandle | None = None
_default_lock = threading.Lock()

_BY_THREAD: dict[int, Any] = {}  # thread ident -> the Runtime that thread belongs to
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # every running Runtime in this process
_LIVE_LOCK = threading.Lock()

#: The runtime of the actor method running in this task (set by the runtime around each call).
ACTOR_RUNTIME: contextvars.ContextVar[Any] = contextvars.ContextVar("lattica_runtime", default=None)

#: True while dialing on behalf of the DHT or the NAT manager: the dialer then skips DHT lookups.
NO_DHT_DIAL_LOOKUP: contextvars.ContextVar[bool] = contextvars.ContextVar("lattica_no_dht_dial_lookup", default=False)


def default_node() -> NodeHandle | None:
    """The node ``lattica.init()`` started, if any."""
    return _default_node


def set_default_node(node: NodeHandle | None) -> NodeHandle | None:
    """Make ``node`` the default node; returns the one it replaced."""
    global _default_node
    with _default_lock:
        old, _default_node = _default_node, node
        return old


def runtime_for_thread() -> Any:
    """The runtime of the actor method running here, else of the node whose loop or actor thread
    this is, else None."""
    rt = ACTOR_RUNTIME.get() or _BY_THREAD.get(threading.get_ident())
    if rt is not None and rt.loop.is_closed():
        # a node started on an event loop that has since closed without stopping the node
        # (asyncio.run ended by an exception): it can carry no call, so this thread falls back
        unbind_thread(rt)
        return None
    return rt


def thread_runtime(tid: int | None = None) -> Any:
    """The runtime bound to thread ``tid`` (default: this thread), or None."""
    return _BY_THREAD.get(threading.get_ident() if tid is None else tid)


def bind_thread(runtime: Any, tid: int | None = None) -> None:
    """Calls made from thread ``tid`` (default: this thread) go through ``runtime``."""
    _BY_THREAD[threading.get_ident() if tid is None else tid] = runtime


def unbind_thread(runtime: Any, tid: int | None = None) -> None:
    """Forget ``runtime``'s binding of thread ``tid`` (default: this thread), if it holds it."""
    tid = threading.get_ident() if tid is None else tid
    if _BY_THREAD.get(tid) is runtime:
        del _BY_THREAD[tid]


def add_live(runtime: Any) -> None:
    """Count ``runtime`` among the live runtimes until :func:`discard_live`."""
    with _LIVE_LOCK:
        _LIVE.add(runtime)


def discard_live(runtime: Any) -> None:
    """``runtime`` stopped."""
    with _LIVE_LOCK:
        _LIVE.discard(runtime)


def live_runtimes() -> list[Any]:
    """Every runtime running in this process."""
    with _LIVE_LOCK:
        return list(_LIVE)
