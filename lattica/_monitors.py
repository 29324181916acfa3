"""Monitors: be told when an actor stops or its node dies (Erlang's monitor, across nodes).

``lattica.monitor(ref, on_down)`` registers with the node that hosts ``ref`` (its spawner keeps a
list of watchers per actor). The watcher is told once, with a reason, when any of these happens:
the actor stops (killed, its node shutting down: the reason says which), it did not exist when the
monitor was set (``"noproc"``), its node is declared dead or leaves the membership
(``"node down: ..."``), the hosting node cannot be reached to set the monitor (``"node
unreachable: ..."``) or refuses it (``"monitor refused: ..."``: an actor holds at most
``MAX_WATCHERS`` monitors, at most ``MAX_PER_WATCHER`` of them from one other node). ``on_down(ref,
reason)`` may be a plain function (run on a worker thread, so it may block) or a coroutine
function (run on the node loop).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica._identity import PeerId
from lattica._runtime import spawner_ref
from lattica.errors import ActorNotFound, LatticaError, PeerUnreachable, Timeout
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._runtime import ActorRef, Runtime

log = get_logger("lattica.monitors")

__all__ = ["Monitor", "Monitors"]

OnDown = Callable[["ActorRef", str], Any]
_SET_TIMEOUT = 10.0
MAX_WATCHERS = 4096  # monitors on one actor
MAX_PER_WATCHER = 64  # of them set by one other node: no peer can take an actor's every slot


class Monitor:
    """A monitor set by ``lattica.monitor``; ``cancel()`` stops it (no call after that)."""

    def __init__(self, monitors: Monitors, mid: int, ref: ActorRef) -> None:
        self._monitors = monitors
        self.id = mid
        self.ref = ref

    def cancel(self) -> None:
        rt = self._monitors.rt
        rt.loop.call_soon_threadsafe(self._monitors.cancel, self.id)

    def __repr__(self) -> str:
        return f"<Monitor {self.id} of {self.ref.name!r} on {self.ref.peer_id.short()}>"


class Monitors:
    """Both sides on one node: the monitors we set (``mine``) and those set on our actors."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._ids = itertools.count(1)
        self.mine: dict[int, tuple[ActorRef, OnDown]] = {}
        self.watchers: dict[str, dict[tuple[PeerId, int], None]] = {}  # actor -> (watcher, id)
        self._per_watcher: dict[tuple[str, PeerId], int] = {}  # (actor, other node) -> its monitors there

    # -- the watcher's side --------------------------------------------------------------------

    def watch(self, ref: ActorRef, on_down: OnDown) -> Monitor:
        """Set a monitor (on the loop)."""
        mid = next(self._ids)
        self.mine[mid] = (ref, on_down)
        rt = self.rt
        if ref.peer_id == rt.peer_id:
            try:
                self.add_watcher(ref.name, rt.peer_id, mid)
            except ActorNotFound:
                self.fire(mid, "noproc")
        else:
            state = rt.membership.state_of(ref.peer_id) if rt.membership is not None else None
            if state in ("dead", "left"):
                self.fire(mid, f"node down: {state}")
            else:
                rt.host.spawn(self._set_remote(mid, ref))
        return Monitor(self, mid, ref)

    async def _set_remote(self, mid: int, ref: ActorRef) -> None:
        try:
            await self.rt.call(spawner_ref(ref.peer_id), "monitor", (ref.name, mid), {}, timeout=_SET_TIMEOUT)
        except ActorNotFound:
            self.fire(mid, "noproc")
        except (PeerUnreachable, Timeout) as e:
            self.fire(mid, f"node unreachable: {e}")
        except LatticaError as e:
            self.fire(mid, f"monitor refused: {e}")

    def cancel(self, mid: int) -> None:
        entry = self.mine.pop(mid, None)
        if entry is None:
            return
        ref = entry[0]
        if ref.peer_id == self.rt.peer_id:
            self.remove_watcher(ref.name, self.rt.peer_id, mid)
            return
        try:
            self.rt.call(spawner_ref(ref.peer_id), "demonitor", (ref.name, mid), {}, timeout=None, tell=True)
        except LatticaError:
            pass  # its node is gone: nothing to undo there

    def down(self, sender: PeerId, mid: int, reason: str) -> None:
        """A hosting node tells us a monitored actor stopped."""
        entry = self.mine.get(mid)
        if entry is not None and entry[0].peer_id == sender:
            self.fire(mid, reason)

    def node_down(self, peer: str, reason: str) -> None:
        """Membership declared ``peer`` dead or gone: every monitor on its actors fires, and
        its monitors on ours go (nobody is left to tell)."""
        for mid, (ref, _) in list(self.mine.items()):
            if str(ref.peer_id) == peer:
                self.fire(mid, f"node down: {reason}")
        for name, watcher in [k for k in self._per_watcher if str(k[1]) == peer]:
            for key in [k for k in self.watchers.get(name, {}) if k[0] == watcher]:
                self.remove_watcher(name, watcher, key[1])

    def fire(self, mid: int, reason: str) -> None:
        entry = self.mine.pop(mid, None)
        if entry is None:
            return
        ref, on_down = entry
        loop = self.rt.loop
        if inspect.iscoroutinefunction(on_down):
            self.rt.host.spawn(self._run_async(on_down, ref, reason))
        else:
            loop.run_in_executor(None, self._run_sync, on_down, ref, reason)

    @staticmethod
    async def _run_async(on_down: OnDown, ref: ActorRef, reason: str) -> None:
        try:
            await on_down(ref, reason)
        except Exception:
            log.exception("monitor callback failed", actor=ref.name)

    @staticmethod
    def _run_sync(on_down: OnDown, ref: ActorRef, reason: str) -> None:
        try:
            on_down(ref, reason)
        except Exception:
            log.exception("monitor callback failed", actor=ref.name)

    # -- the hosting node's side ----------------------------------------------------------------

    def add_watcher(self, name: str, watcher: PeerId, mid: int) -> None:
        actor = self.rt.actors.get(name)
        if actor is None or actor.state in ("stopped", "failed"):
            raise ActorNotFound(f"no actor named {name!r} on {self.rt.peer_id}")
        watchers = self.watchers.setdefault(name, {})
        if (watcher, mid) in watchers:
            return
        if len(watchers) >= MAX_WATCHERS:
            raise LatticaError(f"actor {name!r} already has {MAX_WATCHERS} monitors")
        if watcher != self.rt.peer_id:
            n = self._per_watcher.get((name, watcher), 0)
            if n >= MAX_PER_WATCHER:
                raise LatticaError(f"{watcher} already has {MAX_PER_WATCHER} monitors on actor {name!r}")
            self._per_watcher[(name, watcher)] = n + 1
        watchers[(watcher, mid)] = None

    def remove_watcher(self, name: str, watcher: PeerId, mid: int) -> None:
        watchers = self.watchers.get(name)
        if watchers is not None and (watcher, mid) in watchers:
            del watchers[(watcher, mid)]
            if not watchers:
                del self.watchers[name]
            self._uncount(name, watcher)

    def _uncount(self, name: str, watcher: PeerId) -> None:
        n = self._per_watcher.get((name, watcher))
        if n is not None:
            if n <= 1:
                del self._per_watcher[(name, watcher)]
            else:
                self._per_watcher[(name, watcher)] = n - 1

    def actor_stopped(self, name: str, reason: str) -> None:
        """One of our actors stopped: tell everyone watching it."""
        for watcher, mid in self.watchers.pop(name, {}):
            self._per_watcher.pop((name, watcher), None)
            if watcher == self.rt.peer_id:
                self.fire(mid, reason)
                continue
            try:
                self.rt.call(spawner_ref(watcher), "down", (mid, reason), {}, timeout=None, tell=True)
            except LatticaError as e:
                log.debug("monitor notice not sent", watcher=str(watcher), reason=str(e))
