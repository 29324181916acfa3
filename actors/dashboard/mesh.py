"""The whole mesh as one node's dashboard sees it: the membership view, every live member's report
(asked of its ``dashboard`` system actor: no head node, any node can show the mesh), and an event
log of what changed between two pictures (joins, deaths, restarts, hole punches, failed actors).
Pictures are taken only while someone watches; each watcher holds at most the newest one."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from lattica._identity import PeerId
from lattica._runtime import ASYNC, ActorRef
from lattica.actors.dashboard.clean import clean_member, clean_report, text
from lattica.actors.dashboard.report import NAME
from lattica.errors import LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls

__all__ = ["MeshWatch", "dashboard_ref", "NAME"]

log = get_logger("lattica.dashboard")

MAX_EVENTS = 500  # the event log's length
_FANOUT = 32  # reports asked at once
_NAMED = 5  # actors named in one event (lost with a node, failed in one picture); the rest counted


def dashboard_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s dashboard system actor."""
    return ActorRef(peer, NAME, {"report": ASYNC, "detail": ASYNC, "series": ASYNC})


class MeshWatch:
    """Takes pictures of the mesh (``picture``), every ``every`` seconds while it has watchers, and
    hands each watcher the newest one (a watcher that does not keep up skips pictures)."""

    def __init__(
        self,
        rt: Calls,
        report: Callable[[], Awaitable[dict[str, Any]]],
        every: float = 2.0,
        timeout: float = 2.0,
        max_nodes: int = 1024,
        view_from: PeerId | None = None,
    ) -> None:
        self.rt = rt
        self.report = report  # this node's own report
        self.view_from = (
            view_from  # take the membership view from this member (a node outside the view: `lattica status`)
        )
        self.every = every
        self.timeout = timeout
        self.max_nodes = max_nodes
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        self.latest: dict[str, Any] | None = None
        self._last_seen: dict[Any, Any] = {}  # what the previous picture showed, for the event log
        self._unsupervised: dict[str, dict[Any, Any]] = {}  # node -> its unsupervised user actors, as last reported
        self._watchers: set[_Watcher] = set()
        self._task: asyncio.Task | None = None
        self._taking: asyncio.Future | None = None
        self._encoded: tuple[dict[str, Any], bytes] | None = None

    # -- watchers -------------------------------------------------------------------------------

    def watch(self) -> _Watcher:
        """A new watcher: ``await w.next()`` gives pictures as they are taken; ``close()`` it."""
        w = _Watcher(self)
        self._watchers.add(w)
        if self._task is None or self._task.done():
            self._task = self.rt.host.spawn(self._run())
        return w

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    async def _run(self) -> None:
        while self._watchers:
            try:
                pic = await self.picture()
            except Exception:
                log.exception("dashboard picture failed")
                await asyncio.sleep(self.every)
                continue
            for w in list(self._watchers):
                w.offer(pic)
            await asyncio.sleep(self.every)

    def close(self) -> None:
        for w in list(self._watchers):
            w.close()
        if self._task is not None:
            self._task.cancel()

    # -- pictures -------------------------------------------------------------------------------

    async def picture(self) -> dict[str, Any]:
        """The mesh now (pictures asked for together share one round of reports)."""
        if self._taking is not None and not self._taking.done():
            return await asyncio.shield(self._taking)
        self._taking = asyncio.get_running_loop().create_future()
        try:
            pic = await self._take()
        except BaseException as e:
            self._taking.set_exception(e)
            self._taking.exception()  # (retrieved: nobody else may be waiting)
            raise
        self._taking.set_result(pic)
        return pic

    async def _take(self) -> dict[str, Any]:
        rt = self.rt
        me = str(rt.peer_id)
        membership = rt.membership
        if self.view_from is not None:
            view = await rt.call(
                ActorRef(self.view_from, "membership", {"view": ASYNC}), "view", (), {}, timeout=self.timeout
            )
            if type(view) is not list or not all(type(r) is dict and type(r.get("peer_id")) is str for r in view):
                raise LatticaError(
                    f"{self.view_from} answered its membership view with something else than a list of members"
                )
            view = [{"peer_id": me, "state": "alive", "observer": True}, *(r for r in view if r["peer_id"] != me)]
        else:
            view = membership.nodes() if membership is not None else [{"peer_id": me, "state": "alive"}]
        view = [r for r in (clean_member(r) for r in view[: self.max_nodes]) if r is not None]
        gate = asyncio.Semaphore(_FANOUT)

        async def ask(row: dict[str, Any]) -> dict[str, Any]:
            node = dict(row)
            pid = str(row["peer_id"])
            node["peer_id"] = pid
            node["self"] = pid == me
            if pid == me:
                node["report"] = await self.report()
                node["rtt_ms"] = 0.0
                return node
            if row.get("state") not in ("alive", "suspect"):
                node["report"] = None
                return node
            async with gate:
                t0 = time.perf_counter()
                try:
                    got = await rt.call(dashboard_ref(PeerId.from_string(pid)), "report", (), {}, timeout=self.timeout)
                    node["rtt_ms"] = round((time.perf_counter() - t0) * 1000, 2)
                    node["report"] = clean_report(got)
                    if node["report"] is None:
                        node["error"] = "its report is malformed"
                except (LatticaError, ValueError) as e:
                    node["report"] = None
                    node["error"] = text(f"{type(e).__name__}: {e}")
            return node

        nodes = await asyncio.gather(*(ask(r) for r in view))
        self._log_changes(nodes)
        pic = {"self": me, "time": time.time(), "nodes": nodes, "events": list(self.events)}
        self.latest = pic
        return pic

    # -- the event log --------------------------------------------------------------------------

    def encode(self, pic: dict[str, Any]) -> bytes:
        """``pic`` as JSON, encoded once however many channels send it."""
        cached = self._encoded
        if cached is not None and cached[0] is pic:
            return cached[1]
        import json  # (here: a node that serves no dashboard never loads it)

        data = json.dumps(pic, separators=(",", ":"), allow_nan=False, default=str).encode()
        self._encoded = (pic, data)
        return data

    def _event(self, kind: str, what: str, **fields: Any) -> None:
        self.events.append({"time": time.time(), "kind": kind, "text": text(what) or "", **fields})

    def _log_changes(self, nodes: list[dict[str, Any]]) -> None:
        seen: dict[Any, Any] = {}
        first = not self._last_seen
        supervised = {
            (c.get("node"), c.get("actor"))
            for n in nodes
            for sup in (n.get("report") or {}).get("supervisors", ())
            for c in sup.get("children", ())
            if type(c) is dict
        }
        for n in nodes:
            try:
                self._node_changes(n, seen, first, supervised)
            except (TypeError, AttributeError, KeyError):  # (a report is checked before: defence in depth)
                log.debug("event log skipped a node", node=str(n.get("peer_id")))
        for key, old in self._last_seen.items():  # a node that left the view altogether
            if key[0] == "state" and key not in seen and old not in ("dead", "left"):
                self._event("death", f"node …{key[1][-8:]} is gone from the view", node=key[1])
                self._lost(key[1], "gone from the view")
        self._last_seen = seen

    def _lost(self, pid: str, how: str) -> None:
        """The node's unsupervised user actors (as its last report listed them) are gone with it:
        one event, however many (a node with thousands must not push the rest of the log out)."""
        gone = self._unsupervised.pop(pid, {})
        if not gone:
            return
        names = [f"{name} ({cls})" for name, cls in list(gone.items())[:_NAMED]]
        more = f" and {len(gone) - _NAMED} more" if len(gone) > _NAMED else ""
        what = f"actor {names[0]} was" if len(gone) == 1 else f"{len(gone)} actors were"
        listed = "" if len(gone) == 1 else f": {', '.join(names)}{more}"
        self._event(
            "lost",
            f"{what} lost with node …{pid[-8:]} ({how}), no supervisor restarts them{listed}",
            node=pid,
            actors=list(gone)[:_NAMED],
            count=len(gone),
        )

    def _node_changes(
        self, n: dict[str, Any], seen: dict[Any, Any], first: bool, supervised: set[tuple[Any, Any]]
    ) -> None:
        pid = n["peer_id"]
        short = pid[-8:]
        state = n.get("state")
        seen[("state", pid)] = state
        before = self._last_seen.get(("state", pid))
        if not first and before is None:
            self._event("join", f"node …{short} joined ({state})", node=pid)
        elif before is not None and before != state:
            self._event(
                "death" if state in ("dead", "left") else "state", f"node …{short}: {before} → {state}", node=pid
            )
            if state in ("dead", "left"):
                self._lost(pid, str(state))
        rep = n.get("report") or {}
        if n.get("report") is not None:
            self._unsupervised[pid] = {
                a.get("name"): a.get("class")
                for a in rep.get("actors", ())
                if not a.get("system") and a.get("state") == "running" and (pid, a.get("name")) not in supervised
            }
            if len(self._unsupervised) > self.max_nodes:  # (nodes long gone: the oldest entries go)
                self._unsupervised.pop(next(iter(self._unsupervised)))
        for sup in rep.get("supervisors", ()):
            for c in sup.get("children", ()):
                key: tuple[Any, ...] = ("restarts", pid, sup.get("name"), c.get("id"))
                seen[key] = c.get("restarts") or 0
                old = self._last_seen.get(key)
                if old is not None and seen[key] > old:
                    where = (c.get("node") or "?")[-8:]
                    self._event(
                        "restart",
                        f"{sup.get('name')}: child {c.get('id')} restarted on …{where} (restarts: {seen[key]})",
                        node=pid,
                    )
        for p in rep.get("peers", ()):
            key = ("path", pid, p.get("peer_id"))
            seen[key] = p.get("path")
            old = self._last_seen.get(key)
            if old == "relayed" and seen[key] == "direct" and pid < (p.get("peer_id") or ""):
                self._event("holepunch", f"…{short} ↔ …{(p.get('peer_id') or '')[-8:]}: relayed → direct", node=pid)
        failed = []
        for e in rep.get("ended", ()):
            key = ("ended", pid, e.get("name"), e.get("ended"))
            seen[key] = True
            if not first and key not in self._last_seen and e.get("state") == "failed":
                failed.append(e)
        for e in failed[:_NAMED]:  # (a node's failures in one picture: a few named, the rest counted)
            self._event(
                "failure",
                f"actor {e.get('name')} on …{short} failed: {e.get('reason') or ''}",
                node=pid,
                actor=e.get("name"),
            )
        if len(failed) > _NAMED:
            self._event("failure", f"… and {len(failed) - _NAMED} more actors failed on …{short}", node=pid)
        for a in rep.get("actors", ()):
            key = ("actor", pid, a.get("name"))
            seen[key] = a.get("state")
            if a.get("state") == "failed" and self._last_seen.get(key) not in (None, "failed"):
                self._event(
                    "failure",
                    f"actor {a.get('name')} on …{short} failed: {a.get('failure') or ''}",
                    node=pid,
                    actor=a.get("name"),
                )


class _Watcher:
    """One live channel's share of the pictures: only the newest waits (bounded memory)."""

    def __init__(self, watch: MeshWatch) -> None:
        self._watch = watch
        self._pending: dict[str, Any] | None = watch.latest
        self._ready = asyncio.Event()
        if self._pending is not None:
            self._ready.set()
        self.skipped = 0
        self.closed = False

    def offer(self, pic: dict[str, Any]) -> None:
        if self._pending is not None:
            self.skipped += 1  # (it did not keep up: the older picture is dropped)
        self._pending = pic
        self._ready.set()

    async def next(self) -> dict[str, Any] | None:
        """The newest picture not yet taken (waits for one); None once closed."""
        while not self.closed:
            await self._ready.wait()
            self._ready.clear()
            if self._pending is not None:
                pic, self._pending = self._pending, None
                return pic
        return None

    def close(self) -> None:
        self.closed = True
        self._pending = None
        self._ready.set()
        self._watch._watchers.discard(self)
        if not self._watch._watchers:  # nobody watches: the last picture is not kept
            self._watch.latest = None
            self._watch._encoded = None
