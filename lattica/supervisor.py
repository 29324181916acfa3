"""Supervisors: OTP-style trees of actors, restarted wherever there is room, with no head node.

A ``Supervisor`` is an ordinary actor. It starts its children in order (each placed by the
membership view, ``lattica._placement``), monitors them (``lattica.monitor``: an actor stopping or
its node dying), and restarts them by its strategy:

* ``one_for_one``: only the child that went down;
* ``one_for_all``: every child (the others are stopped in reverse order first);
* ``rest_for_one``: the child and those started after it.

Restart types: ``permanent`` (always), ``transient`` (unless it ended normally), ``temporary``
(never). More than ``max_restarts`` restarts ``within`` seconds means the trouble is not
local: the supervisor stops its children (reverse order) and itself, and its own supervisor, if
any, decides (escalation). Children are bound to their supervisor: when it goes down, so do they.

Children are named ``<supervisor>/<id>`` and registered in the DHT; the refs it hands out are
*stable* (they follow a child to its next incarnation on any node). A child class with
``checkpoint()`` and ``restore(state)`` keeps its state across restarts: the supervisor asks
for a checkpoint every ``checkpoint_every`` seconds, keeps the latest (on its own node, which
placement keeps apart from the child's when it can, and a copy on a third node: see
``actors/supervisor.py``) and hands it to the next incarnation, its own or, after its own node
died, that of its successor.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from dataclasses import dataclass, field
from typing import Any, cast

from lattica import codec
from lattica._code.tickets import known_ticket
from lattica._context import runtime_for_thread
from lattica._identity import PeerId
from lattica._remote import ActorClass, ShippedClass, actor, class_path, offer_spawn, spawn_placed
from lattica._runtime import (
    DEFAULT_WINDOW,
    ActorRef,
    LocalActor,
    current_actor,
    method_table,
    require_caller,
    spawner_ref,
)
from lattica.actors.supervisor import checkpoints_ref, members, ranked, read_copies, sign_copy
from lattica.errors import LatticaError, SpawnError
from lattica.logging import get_logger

__all__ = ["Supervisor", "STRATEGIES", "RESTARTS"]

log = get_logger("lattica.supervisor")

STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one")
RESTARTS = ("permanent", "transient", "temporary")
NORMAL = ("normal", "shutdown")  # reasons a transient child is not restarted for
_COPY_READS = 4  # nodes of a name's ranking asked for a checkpoint copy
# nodes a checkpoint copy is sent to: a member whose PeerId is ground to rank first for a name
# holds one of them, not all (an invited member's identity is not free: an administrator issues it)
_COPY_WRITES = 3
_PLACE_PATIENCE = 30.0  # seconds a restart may go unplaced (no node took it) before giving up


@dataclass(slots=True)
class _Child:
    id: str
    class_path: str
    # the ticket of the package its class travels in (None: installed)
    code: list[Any] | None = field(init=False, default=None)
    # its method table (from its class, else from its first start)
    methods: dict[str, str] = field(init=False, default_factory=dict)
    args: list[Any]
    kwargs: dict[str, Any] | None
    restart: str
    resources: dict[str, float]
    labels: dict[str, str]
    placement: str
    node: PeerId | None
    checkpoint_every: float | None
    ref: ActorRef | None = field(init=False, default=None)  # the current incarnation (None while stopped)
    # its token: what the spawner stops it by (not by name alone)
    incarnation: str | None = field(init=False, default=None)
    monitor: Any = field(init=False, default=None)
    state: Any = field(init=False, default=None)  # the latest checkpoint
    has_state: bool = field(init=False, default=False)
    stamp: float = field(init=False, default=0.0)  # when it was taken (wall clock: copies on other nodes compare by it)
    # a copy of its checkpoint was looked for (once per supervisor incarnation)
    recovered: bool = field(init=False, default=False)
    restarts: int = field(init=False, default=0)
    nodes: list[str] = field(init=False, default_factory=list)  # where each incarnation ran


def _spec(
    cls: Any,
    args: Any = (),
    kwargs: Any = None,
    *,
    id: str | None = None,
    restart: str = "permanent",
    resources: dict[str, float] | None = None,
    labels: dict[str, str] | None = None,
    placement: str = "spread",
    node: PeerId | str | None = None,
    checkpoint_every: float | None = None,
    index: int = 0,
) -> _Child:
    code = None
    if isinstance(cls, ActorClass):
        path = class_path(cls.cls)
        ticket = known_ticket(cls.cls)
        code = ticket.to_wire() if ticket is not None else None
    elif isinstance(cls, ShippedClass):
        path, code = cls.path, cls.code  # its code travels with it: the spawner checks the ticket
    elif isinstance(cls, str):
        path = cls
    else:
        raise SpawnError(f"a child is an @lattica.actor class or its 'module.Class' path, not {type(cls).__name__}")
    if restart not in RESTARTS:
        raise SpawnError(f"restart must be one of {RESTARTS}, not {restart!r}")
    if not isinstance(args, (list, tuple)) or (kwargs is not None and not isinstance(kwargs, dict)):
        raise SpawnError("args must be a list and kwargs a map")
    if checkpoint_every is not None and not (isinstance(checkpoint_every, (int, float)) and checkpoint_every > 0):
        raise SpawnError("checkpoint_every must be a positive number of seconds")
    child_id = id or f"{path.rpartition('.')[2]}-{index}"
    if not isinstance(child_id, str) or "/" in child_id or not 0 < len(child_id) <= 64:
        raise SpawnError("a child id is 1 to 64 characters without '/'")
    peer = PeerId.from_string(node) if isinstance(node, str) else node
    child = _Child(
        child_id,
        path,
        list(args),
        kwargs,
        restart,
        dict(resources or {}),
        dict(labels or {}),
        placement,
        peer,
        checkpoint_every,
    )
    child.code = code
    if isinstance(cls, ActorClass):
        child.methods = method_table(cls.cls)
    return child


@actor
class Supervisor:
    """Starts, watches and restarts its children (see the module docstring)."""

    def __init__(
        self, strategy: str = "one_for_one", max_restarts: int = 3, within: float = 5.0, children: Any = ()
    ) -> None:
        if strategy not in STRATEGIES:
            raise SpawnError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
        if not (
            isinstance(max_restarts, int) and max_restarts >= 0 and isinstance(within, (int, float)) and within > 0
        ):
            raise SpawnError("max_restarts must be >= 0 and within > 0 seconds")
        self.strategy = strategy
        self.max_restarts = max_restarts
        self.within = float(within)
        self._initial = [
            _spec(**c, index=i) if isinstance(c, dict) else _spec(c, index=i) for i, c in enumerate(children)
        ]
        self._children: list[_Child] = []
        self._restarts: collections.deque[float] = collections.deque()
        self._me: ActorRef | None = None
        self._actor: LocalActor | None = None  # this incarnation (others may follow under the same name)
        self._rt: Any = None
        self._ready: asyncio.Event | None = None
        self._busy: asyncio.Lock | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.events: list[dict[str, Any]] = []  # what happened, newest last (bounded)

    async def on_start(self) -> None:
        self._me = cast(ActorRef, current_actor())  # on_start runs as this actor
        self._rt = runtime_for_thread()
        self._ready = asyncio.Event()
        self._busy = asyncio.Lock()
        me = self._rt.actors.get(self._me.name)
        self._actor = me if me is not None and me.instance is self else None
        if self._actor is None:  # stopped before it could start anything
            self._stopping = True
            self._ready.set()
            return
        try:
            async with self._busy:
                for child in self._initial:
                    self._children.append(child)
                    await self._start_patiently(child)
        except LatticaError as e:
            log.warning(
                "supervisor could not start its children", supervisor=self._me.name if self._me else "?", reason=str(e)
            )
            self._ready.set()
            await self._give_up(f"a child failed to start: {e}")
            return
        self._ready.set()

    # -- what callers use ------------------------------------------------------------------------

    async def start_child(
        self,
        cls: Any,
        args: Any = (),
        kwargs: Any = None,
        *,
        id: str | None = None,
        restart: str = "permanent",
        resources: dict[str, float] | None = None,
        labels: dict[str, str] | None = None,
        placement: str = "spread",
        node: Any = None,
        checkpoint_every: float | None = None,
    ) -> ActorRef:
        """Add a child and start it now; returns its stable ref (for whoever controls this
        supervisor: the node that created it, its own supervisor's, this node, an administrator)."""
        require_caller("owner")
        await self._wait_ready()
        async with self._busy:  # type: ignore[union-attr]
            # (the default id is chosen under the lock: calls fired together get different ones)
            taken = {c.id for c in self._children}
            index = len(self._children)
            child = _spec(
                cls,
                args,
                kwargs,
                id=id,
                restart=restart,
                resources=resources,
                labels=labels,
                placement=placement,
                node=node,
                checkpoint_every=checkpoint_every,
                index=index,
            )
            while id is None and child.id in taken:
                index += 1
                child.id = f"{child.class_path.rpartition('.')[2]}-{index}"
            if child.id in taken:
                raise SpawnError(f"this supervisor already has a child {child.id!r}")
            self._children.append(child)
            try:
                await self._start(child)
            except BaseException:
                self._children.remove(child)
                raise
        return self._stable(child)

    async def locate(self, name: str) -> ActorRef | None:
        """Where child ``name`` (its full name, ``<supervisor>/<id>``) runs now: its plain ref,
        or None while it is down or being restarted. Stable refs ask this when their actor is
        gone: the supervisor, not whoever registered the name last in the DHT, says where it is."""
        child = next((c for c in self._children if self._name(c) == name), None) if self._me is not None else None
        ref = child.ref if child is not None else None
        if ref is None or self._rt.node_down(ref.peer_id):
            return None
        return ActorRef(ref.peer_id, ref.name, ref.methods, ref.window)

    async def children(self) -> list[ActorRef]:
        """Stable refs of the children, in start order (valid across restarts)."""
        await self._wait_ready()
        return [self._stable(c) for c in self._children]

    async def which_children(self) -> list[dict[str, Any]]:
        """Per child: id, class, restart type, where it runs now (node and actor name), restarts,
        the nodes it ran on."""
        await self._wait_ready()
        return [
            {
                "id": c.id,
                "class": c.class_path,
                "restart": c.restart,
                "node": str(c.ref.peer_id) if c.ref else None,
                "actor": c.ref.name if c.ref else None,
                "restarts": c.restarts,
                "nodes": list(c.nodes),
                "checkpointed": c.has_state,
            }
            for c in self._children
        ]

    async def terminate_child(self, id: str) -> None:
        """Stop child ``id`` for good (it is not restarted) and forget it (for whoever controls
        this supervisor)."""
        require_caller("owner")
        await self._wait_ready()
        async with self._busy:  # type: ignore[union-attr]
            child = next((c for c in self._children if c.id == id), None)
            if child is None:
                raise SpawnError(f"no child {id!r}")
            await self._stop(child, "shutdown")
            self._children.remove(child)
            if child.checkpoint_every:
                self._drop_copies(child)

    async def history(self) -> list[dict[str, Any]]:
        """Restarts and give-ups so far (time, child, reason, from and to node)."""
        return list(self.events)

    async def on_stop(self) -> None:
        self._stopping = True
        for t in list(self._tasks):
            t.cancel()
        for child in reversed(self._children):
            await self._stop(child, "shutdown")

    # -- starting and stopping children -----------------------------------------------------------

    def _name(self, child: _Child) -> str:
        return f"{self._me.name}/{child.id}"  # type: ignore[union-attr]

    def _stable(self, child: _Child) -> ActorRef:
        ref = child.ref
        methods = child.methods or (ref.methods if ref is not None else {})  # (known even while it is down)
        peer = ref.peer_id if ref is not None else self._rt.peer_id
        return ActorRef(
            peer,
            self._name(child),
            methods,
            ref.window if ref is not None else DEFAULT_WINDOW,
            stable=True,
            supervisor=self._anchor(),
        )

    def _anchor(self) -> ActorRef:
        """This supervisor as its children's stable refs name it: stable itself (following its
        own supervisor) when it is a supervised child, else its plain ref."""
        me = self._me
        parent = self._rt.host.services.spawner.supervisors.get(me.name)  # type: ignore[union-attr]
        if parent is None:
            return me  # type: ignore[return-value]
        return ActorRef(me.peer_id, me.name, me.methods, me.window, stable=True, supervisor=parent)  # type: ignore[union-attr]

    async def _start(self, child: _Child, avoid: str | None = None) -> None:
        rt = self._rt
        if child.checkpoint_every and not child.has_state and not child.recovered:
            child.recovered = True
            await self._recover(child)
        incarnation = os.urandom(8).hex()
        opts: dict[str, Any] = {"publish": True, "supervisor": self._anchor(), "incarnation": incarnation}
        spawner = rt.host.services.spawner
        owner = spawner.owners.get(self._me.name) if self._me is not None else None
        if owner is not None:
            opts["owner"] = str(owner)  # the member whose supervisor this is owns (and is charged for) its children
        job = spawner.jobs.of(self._me.name) if self._me is not None else None
        if job is not None:
            opts["job"] = str(job)  # children end with the job their supervisor belongs to
        if child.code is not None:
            opts["code"] = child.code
        if child.has_state:
            opts["state"] = child.state
        name = self._name(child)
        if child.node is not None and not rt.node_down(child.node) and str(child.node) != avoid:
            if child.resources:
                opts["reserve"] = child.resources
            call = (child.class_path, child.args, child.kwargs, name, opts)
            ref = await offer_spawn(rt, call, [str(child.node)], [])
        else:
            opts["reserve"] = child.resources
            if child.labels:
                opts["labels"] = child.labels
            call = (child.class_path, child.args, child.kwargs, name, opts)
            # a child that keeps checkpoints here goes elsewhere when it can: one node's loss then
            # never takes both the child and its latest state
            apart = {str(rt.peer_id)} if child.checkpoint_every else set()
            ref = await spawn_placed(
                rt,
                call,
                child.resources,
                child.labels,
                child.placement,
                last=apart | ({avoid} if avoid is not None else set()),
            )
        child.ref, child.incarnation = ref, incarnation
        child.methods = dict(ref.methods) or child.methods
        child.nodes.append(str(ref.peer_id))
        child.monitor = rt.monitors.watch(ref, self._on_down)
        if child.checkpoint_every and "checkpoint" in ref.methods:
            self._spawn(self._checkpoints(child, ref))

    async def _start_patiently(self, child: _Child) -> None:
        """``_start``, retried while no node takes the child (unreachable, refused, nothing
        fits) for up to ``_PLACE_PATIENCE`` s; a failure of the child itself raises at once."""
        delay, avoid = 0.05, None
        deadline = time.monotonic() + _PLACE_PATIENCE
        while True:
            try:
                return await self._start(child, avoid=avoid)
            except SpawnError:
                raise
            except LatticaError as e:
                if time.monotonic() > deadline or self._ended() or self._rt.host.closing:
                    raise
                if child.node is not None:
                    avoid = str(child.node)
                log.debug("child not placed yet", child=child.id, reason=str(e))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _stop(self, child: _Child, reason: str) -> None:
        """Stop the incarnation of ``child`` this supervisor started, and no other: when this
        supervisor was stopped (its ``on_stop`` stops its children) and its next incarnation
        already runs, a child of the same name may be that one's."""
        ref, child.ref = child.ref, None
        incarnation, child.incarnation = child.incarnation, None
        if child.monitor is not None:
            self._rt.monitors.cancel(child.monitor.id)
            child.monitor = None
        if ref is None:
            return
        try:
            if ref.peer_id == self._rt.peer_id:
                local = self._rt.host.services.spawner.holder(ref.name, incarnation)
                if local is not None:
                    await local.stop(reason)
            else:
                await self._rt.call(spawner_ref(ref.peer_id), "kill", (ref.name, incarnation), {}, timeout=5.0)
        except LatticaError as e:  # already gone, or its node is: nothing left to stop
            log.debug("child not stopped", child=child.id, reason=str(e))

    async def _checkpoints(self, child: _Child, ref: ActorRef) -> None:
        every = cast(float, child.checkpoint_every)  # only children with checkpoint_every set run this
        while child.ref is ref and not self._ended():
            await asyncio.sleep(every)
            if child.ref is not ref:
                return
            try:
                child.state = await self._rt.call(ref, "checkpoint", (), {}, timeout=max(5.0, every))
                child.has_state = True
                child.stamp = time.time()
            except LatticaError as e:
                log.debug("checkpoint failed", child=child.id, reason=str(e))
                continue
            await self._replicate(child, ref)

    # -- copies of checkpoints on a third node (actors/supervisor.py) -----------------------------

    async def _replicate(self, child: _Child, ref: ActorRef) -> None:
        """Send the latest checkpoint to the first nodes in the name's ranking that are neither
        ours nor the child's: any one node's loss, or one holder keeping it to itself, leaves a copy."""
        name = self._name(child)
        avoid = {str(self._rt.peer_id), str(ref.peer_id)}
        order = [
            m for m in ranked(name, members(self._rt.peer_id, self._rt.host.services.membership)) if m not in avoid
        ][:_COPY_WRITES]
        if not order:
            return
        try:
            blob = codec.encode_bytes(child.state)
        except (LatticaError, ValueError, TypeError) as e:
            log.debug("checkpoint not copied", child=child.id, reason=str(e))
            return
        signature = sign_copy(self._rt.host.keypair, name, child.stamp, blob)
        certs = self._rt.host.trust.presented

        async def keep(member: str) -> None:
            try:
                await self._rt.call(
                    checkpoints_ref(PeerId.from_string(member)),
                    "keep",
                    (name, child.stamp, blob, signature, certs),
                    {},
                    timeout=5.0,
                )
            except LatticaError as e:
                log.debug("checkpoint not copied", child=child.id, to=member, reason=str(e))

        await asyncio.gather(*(keep(m) for m in order))

    async def _recover(self, child: _Child) -> None:
        """Before a first start here: the newest copy of the child's checkpoint held by the first
        nodes of its name's ranking (a previous incarnation of this supervisor put it there)."""
        name = self._name(child)

        async def ask(member: str) -> Any:
            try:
                return await self._rt.call(
                    checkpoints_ref(PeerId.from_string(member)), "fetch", (name,), {}, timeout=1.0
                )
            except LatticaError:
                return None

        got = await asyncio.gather(
            *(ask(m) for m in ranked(name, members(self._rt.peer_id, self._rt.host.services.membership))[:_COPY_READS])
        )
        ranked_copies = [(self._trust_in_writer(c[2], c[3]), c) for g in got for c in read_copies(g, name)]
        best = max((t for t, _ in ranked_copies), default=0)
        copies = [c for t, c in ranked_copies if t == best and t > 0]
        if not copies:
            return
        stamp, blob = max(copies, key=lambda c: c[0])[:2]
        try:
            child.state = codec.decode(blob)
        except LatticaError as e:
            log.warning("checkpoint copy unreadable", child=child.id, reason=str(e))
            return
        child.has_state, child.stamp = True, stamp
        self._event("recovered", child, f"checkpoint copy taken {time.time() - stamp:.1f} s ago")

    def _trust_in_writer(self, writer: PeerId, certs: list[Any]) -> int:
        """How far a checkpoint copy's writer is believed: 2 for this node, a node that controls
        this supervisor (its creator, its own supervisor's) or an administrator of the mesh by the
        certificates it signed with; 1 for any other member whose node membership holds gone (the
        node a previous incarnation ran on, when it was invited); 0 for anyone else. The newest
        copy of the best kind wins."""
        if writer == self._rt.peer_id:
            return 2
        if self._me is not None and self._rt.host.services.spawner.controls(self._me.name, writer):
            return 2
        verdict = self._rt.host.trust.judge(writer, certs, time.time())
        if verdict.admin:
            return 2
        # a plain member's copy only once its node is gone: the node a previous incarnation ran on
        # died (why we recover elsewhere); a live one's copy is one it may have made up to be
        # restored here (a copy is only as good as its writer's right to this child's state)
        return 1 if verdict.circle != "stranger" and self._rt.node_gone(writer) else 0

    def _drop_copies(self, child: _Child) -> None:
        name = self._name(child)
        for m in ranked(name, members(self._rt.peer_id, self._rt.host.services.membership))[:_COPY_READS]:
            try:
                self._rt.call(checkpoints_ref(PeerId.from_string(m)), "drop", (name,), {}, timeout=None, tell=True)
            except LatticaError as e:
                log.debug("checkpoint copy not dropped", child=child.id, at=m, reason=str(e))

    # -- reacting to a child going down ------------------------------------------------------------

    async def _on_down(self, ref: ActorRef, reason: str) -> None:
        if self._ended() or self._rt.host.closing:
            return
        child = next(
            (
                c
                for c in self._children
                if c.ref is not None and c.ref.name == ref.name and c.ref.peer_id == ref.peer_id
            ),
            None,
        )
        if child is None:
            return  # stopped by us meanwhile
        async with self._busy:  # type: ignore[union-attr]
            if child.ref is None or child.ref.peer_id != ref.peer_id or self._ended():
                return
            child.ref = child.monitor = None
            self._event("down", child, reason, str(ref.peer_id))
            if child.restart == "temporary" or (child.restart == "transient" and reason in NORMAL):
                self._children.remove(child)
                if child.checkpoint_every:
                    self._drop_copies(child)
                return
            now = time.monotonic()
            self._restarts.append(now)
            while self._restarts and self._restarts[0] < now - self.within:
                self._restarts.popleft()
            if len(self._restarts) > self.max_restarts:
                await self._give_up(
                    f"more than {self.max_restarts} restarts within {self.within:g} s (last: {child.id}: {reason})"
                )
                return
            i = self._children.index(child)
            if self.strategy == "one_for_one":
                group = [child]
            elif self.strategy == "one_for_all":
                group = list(self._children)
            else:
                group = self._children[i:]
            for other in reversed(group):
                if other is not child:
                    await self._stop(other, "restarting")
            down_node = str(ref.peer_id) if reason.startswith("node ") else None
            for c in group:
                await self._restart(c, reason, down_node)

    async def _restart(self, child: _Child, reason: str, down_node: str | None) -> None:
        """Start ``child`` again. A start that fails in the child (its constructor) counts toward
        the restart intensity; one that no node took (unreachable, refused, nothing fits) is
        retried, away from a pinned node that failed, for up to ``_PLACE_PATIENCE`` s."""
        before = child.nodes[-1] if child.nodes else None
        delay = 0.05
        avoid = down_node
        deadline = time.monotonic() + max(self.within, _PLACE_PATIENCE)
        while not self._ended() and not self._rt.host.closing:
            try:
                await self._start(child, avoid=avoid)
                child.restarts += 1
                self._event("restarted", child, reason, before, str(child.ref.peer_id))  # type: ignore[union-attr]
                return
            except SpawnError as e:
                now = time.monotonic()
                self._restarts.append(now)
                while self._restarts and self._restarts[0] < now - self.within:
                    self._restarts.popleft()
                if len(self._restarts) > self.max_restarts:
                    await self._give_up(f"{child.id} could not be restarted: {e}")
                    return
            except LatticaError as e:
                if child.node is not None:
                    avoid = str(child.node)
                if time.monotonic() > deadline:
                    await self._give_up(f"{child.id} could not be placed anywhere: {e}")
                    return
                log.debug("restart not placed yet", child=child.id, reason=str(e))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _give_up(self, why: str) -> None:
        """Escalate: stop every child (reverse order), then this supervisor itself."""
        self._event("gave up", None, why)
        log.warning("supervisor gives up", supervisor=self._me.name if self._me else "?", reason=why)
        self._stopping = True
        for child in reversed(self._children):
            await self._stop(child, "shutdown")
        if self._actor is not None:  # this incarnation, not a later one of the same name
            self._spawn(self._actor.stop(f"escalated: {why}"))

    # -- helpers -----------------------------------------------------------------------------------

    def _ended(self) -> bool:
        """This incarnation is over: stopping, or stopped with its ``on_stop`` still to come. It
        then restarts nothing: a later incarnation may run under the same name by now, with
        children of its own under the same names."""
        return self._stopping or (self._actor is not None and self._actor.state != "running")

    async def _wait_ready(self) -> None:
        while self._ready is None:  # a call can arrive before on_start ran
            await asyncio.sleep(0.005)
        await self._ready.wait()
        if self._stopping:
            raise SpawnError("this supervisor has given up (see its history)")

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _event(
        self, what: str, child: _Child | None, reason: str, src: str | None = None, dst: str | None = None
    ) -> None:
        self.events.append(
            {
                "t": time.time(),
                "event": what,
                "child": child.id if child else None,
                "reason": reason,
                "from": src,
                "to": dst,
            }
        )
        log.info(
            f"child {what}" if child else what,
            supervisor=self._me.name if self._me else "?",
            child=child.id if child else None,
            reason=reason,
            src=src,
            dst=dst,
        )
        del self.events[:-200]
