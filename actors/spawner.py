"""The ``spawner`` system actor: creates, finds and stops actors on its node for remote callers.

It imports actor classes installed here by qualified name, if the node owner allowed them
(``lattica.init(allow=["myapp.*"])``), or loads them from the code package a spawn brings (a
ticket: source files by CID, signed by a sender the node's ``accept_code`` setting trusts);
nothing is unpickled. Every actor it creates belongs to a job (the process that spawned it,
directly or through its actors and supervisors) and is stopped when that job ends, unless it was
spawned detached (docs/api.md, "Actor lifetimes").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from lattica._code.library import CodeLibrary
from lattica._code.tickets import Ticket
from lattica._identity import PeerId
from lattica._placement import RESOURCES
from lattica._remote import class_path as lattica_class_path
from lattica._runtime import DEFAULT_MAX_CONCURRENCY, DEFAULT_WINDOW, NO_STATE, ActorRef, current_caller
from lattica.errors import ActorNotFound, CodeError, LatticaError, PermissionDenied, PlacementError, SpawnError

if TYPE_CHECKING:
    from lattica._membership import Member
    from lattica._monitors import Monitor
    from lattica._runtime import LocalActor
    from lattica._runtime.calls import Calls
    from lattica.actors.membership import MembershipService

_MAX_WINDOW = 1 << 16
_MAX_CONCURRENCY = 1 << 16
MAX_ACTORS_PER_MEMBER = 1000  # actors one member (not an administrator) may own on a node
MAX_CODE_SPAWNS = 8  # spawns with a code package one caller may have in progress on a node (they may wait on a fetch)
# of each resource a node offers, what the actors one member (not an administrator) owns there
# may hold reserved at once: no single member books a whole node (or, one spawn per node, a mesh)
MEMBER_SHARE = 0.5


def _key(ref: ActorRef) -> tuple[str, str]:
    return (str(ref.peer_id), ref.name)


class Jobs:
    """The job each actor of a node ends with: the node (a driver process) that spawned it, directly
    or through its actors and supervisors. Actors absent here are the node's own (or detached)."""

    def __init__(self, runtime: Calls) -> None:
        self._rt = runtime
        self._of: dict[str, PeerId] = {}

    def of(self, name: str) -> PeerId | None:
        return self._of.get(name)

    def adopt(self, name: str, job: PeerId) -> None:
        """Actor ``name`` here ends with ``job`` (spawned by it, or by one of its actors)."""
        if job != self._rt.peer_id and name in self._rt.actors:
            self._of[name] = job

    def forget(self, name: str) -> None:
        self._of.pop(name, None)

    def ended(self, member: Member, reason: str) -> None:
        """A node left the mesh or was declared dead (membership's down listener): the actors of
        its job here stop."""
        try:
            peer = PeerId.from_string(member.id)
        except LatticaError:
            return
        for name in [n for n, j in self._of.items() if j == peer]:
            actor = self._rt.actors.get(name)
            if actor is not None:
                self._rt.host.spawn(actor.stop(f"its job ended: {peer} {reason}"))


class Bindings:
    """Which actors here stop when another goes down (their supervisor, an actor linked to
    them): bound by the spawner and by this node's own code (``lattica.link``), never asked by a
    peer directly (the spawner's methods are what peers may call; this is no method of it)."""

    def __init__(self, runtime: Calls, release: Callable[[str, str], None]) -> None:
        self._rt = runtime
        self._release = release  # (the spawner forgets an actor it stops)
        self._bound: dict[str, dict[tuple, Monitor]] = {}  # actor name -> monitors that stop it with another

    def of(self, name: str) -> set[tuple]:
        """The actors ``name`` is bound to (as keys)."""
        return set(self._bound.get(name, {}))

    def bind(self, name: str, other: ActorRef) -> None:
        """Stop actor ``name`` when ``other`` (its supervisor, or a linked actor) goes down: a
        restarted supervisor starts its children afresh, so the old ones must not linger. An
        actor may be bound to several others (its supervisor and its links).

        The binding holds for the incarnation of ``name`` living now, not for the name (an
        Erlang link is to a pid): the notice that ``other`` went down is handled in a task of
        its own, and may come after this actor stopped and the next incarnation of its
        supervisor started another under the same name (a supervisor restarted on the same
        node, whose child is placed here again). That notice is about the old binding only;
        the new actor and its own bindings stay."""
        bound = self._rt.actors.get(name)

        async def down(ref: ActorRef, why: str) -> None:
            actor = self._rt.actors.get(name)
            if actor is None or actor is not bound:
                return  # stopped already; the name may have a new holder, bound on its own
            self.forget(name)
            await actor.stop(f"linked actor {ref.name} went down: {why}")

        self.unbind(name, other)
        self._bound.setdefault(name, {})[_key(other)] = self._rt.monitors.watch(other, down)

    def unbind(self, name: str, other: ActorRef) -> None:
        bound = self._bound.get(name)
        watch = bound.pop(_key(other), None) if bound is not None else None
        if watch is not None:
            watch.cancel()
        if bound == {}:
            del self._bound[name]

    def forget(self, name: str) -> None:
        """``name`` stopped: nothing stops it any more."""
        for watch in self._bound.pop(name, {}).values():
            watch.cancel()

    def stop_all(self) -> None:
        """The mesh took this node for dead: every actor bound to a supervisor or a link has
        been replaced or stopped on the other side by now, so ours stop too."""
        for name in list(self._bound):
            self._release(name, "node downed")
            actor = self._rt.actors.get(name)
            if actor is not None:
                self._rt.host.spawn(actor.stop("this node was declared dead by the mesh"))


class Spawner:
    NAME = "spawner"

    def __init__(self, runtime: Calls) -> None:
        self._rt = runtime
        self.reserved: dict[str, dict[str, float]] = {}  # actor name -> resources held for it
        self.bindings = Bindings(runtime, self._release)  # (an attribute, not a method: peers call only methods)
        self._supervisor: dict[str, str] = {}  # actor name -> the name of the supervisor it is bound to
        self._incarnation: dict[str, str] = {}  # actor name -> the token its supervisor started it with
        self._owner: dict[str, PeerId] = {}  # actor name -> the node that spawned it (absent: this node)
        self._supervisor_node: dict[str, PeerId] = {}  # actor name -> its supervisor's node
        self._supervisor_ref: dict[str, ActorRef] = {}  # actor name -> its supervisor, as it named itself
        self._owned: dict[PeerId, int] = {}  # node -> how many actors here it owns
        self._jobs = Jobs(runtime)
        self._code_spawns: dict[PeerId | None, int] = {}  # caller -> its spawns with code in progress here
        self.code: CodeLibrary | None = None  # packages of code that travels (None: this node cannot fetch them)
        self.membership: MembershipService | None = None  # where reservations are gossiped (None: no membership)
        runtime.stop_listeners.append(self._release)

    def _reserved_total(self) -> dict[str, float]:
        """What this node has promised to its placed actors, per resource (gossiped in ``load``)."""
        total = {r: 0.0 for r in RESOURCES}
        for need in self.reserved.values():
            for r, amount in need.items():
                total[r] += amount
        return {r: v for r, v in total.items() if v}

    @property
    def reserved_total(self) -> Callable[[], dict[str, float]]:
        """``reserved_total()``: what this node has promised to its placed actors, per resource
        (a property, not a method: peers call only methods)."""
        return self._reserved_total

    @property
    def controls(self) -> Callable[[str, PeerId | None], bool]:
        """``controls(name, peer)``: whether ``peer`` may stop, link or replace actor ``name`` here
        (a property, not a method: peers call only methods)."""
        return self._controls

    @property
    def supervisors(self) -> Mapping[str, ActorRef]:
        """Actor name -> the supervisor it is bound to, as that supervisor named itself (a
        property: peers call only methods)."""
        return MappingProxyType(self._supervisor_ref)

    @property
    def jobs(self) -> Jobs:
        """Which job each actor here ends with (a property: peers call only methods)."""
        return self._jobs

    @property
    def owners(self) -> Mapping[str, PeerId]:
        """Actor name -> the node that spawned it here (absent: this node). A property, not a
        method: the spawner's methods are what peers may call."""
        return MappingProxyType(self._owner)

    def _reserve(self, name: str, need: object, labels: object, owner: PeerId | None = None) -> None:
        """Hold ``need`` for actor ``name`` or refuse (PlacementError: the caller tries the next
        node). The caller chose us from gossip a few seconds old; this is the last word. A member
        ``owner`` (not an administrator) holds at most ``MEMBER_SHARE`` of each resource here."""
        if not isinstance(need, dict) or not all(
            r in RESOURCES and type(v) in (int, float) and 0 <= v < 1e15 for r, v in need.items()
        ):
            raise SpawnError(f"reserve must map {list(RESOURCES)} to amounts")
        membership = self.membership
        offered = membership.resources if membership is not None else {}
        mine = membership.labels if membership is not None else {}
        if labels is not None:
            if not isinstance(labels, dict) or any(mine.get(k) != v for k, v in labels.items()):
                raise PlacementError(f"{self._rt.peer_id} does not carry the labels {labels}")
        held = self._reserved_total()
        short = {r: amount for r, amount in need.items() if float(offered.get(r, 0)) - held.get(r, 0.0) < amount}
        if short:
            room = {r: float(offered.get(r, 0)) - held.get(r, 0.0) for r in short}
            raise PlacementError(f"{self._rt.peer_id} cannot reserve {short}: {room} left")
        if owner is not None and not self._rt.host.is_admin(owner):
            theirs: dict[str, float] = {}
            for actor, held_by in self.reserved.items():
                if self._owner.get(actor) == owner:
                    for r, amount in held_by.items():
                        theirs[r] = theirs.get(r, 0.0) + amount
            over = {
                r: amount
                for r, amount in need.items()
                if amount and theirs.get(r, 0.0) + amount > MEMBER_SHARE * float(offered.get(r, 0))
            }
            if over:
                raise PlacementError(
                    f"{owner} may hold at most {MEMBER_SHARE:.0%} of {sorted(over)} on {self._rt.peer_id} "
                    f"(it holds {theirs}; a member's share: spawner.MEMBER_SHARE)"
                )
        self.reserved[name] = {r: float(v) for r, v in need.items()}
        if membership is not None:
            membership.load_changed()

    def _release(self, name: str, reason: str) -> None:
        self._supervisor.pop(name, None)
        self._incarnation.pop(name, None)
        self._supervisor_node.pop(name, None)
        self._supervisor_ref.pop(name, None)
        self._jobs.forget(name)
        if self.code is not None:
            self.code.release(name)
        owner = self._owner.pop(name, None)
        if owner is not None:
            left = self._owned.pop(owner, 1) - 1
            if left:
                self._owned[owner] = left
        self.bindings.forget(name)
        membership = self.membership
        if self.reserved.pop(name, None) is not None and membership is not None:
            membership.load_changed()

    # -- ownership ---------------------------------------------------------------------------

    def _controls(self, name: str, peer: PeerId | None) -> bool:
        """Whether ``peer`` may stop, link or replace actor ``name`` here: this node, the node that
        created it, its supervisor's node, or an administrator of our mesh (None: this node)."""
        if peer is None or peer == self._rt.peer_id or self._rt.host.is_admin(peer):
            return True
        return peer == self._owner.get(name) or peer == self._supervisor_node.get(name)

    def _require_control(self, name: str, what: str) -> None:
        caller = current_caller()
        if not self._controls(name, caller):
            raise PermissionDenied(
                f"{caller} may not {what} {name!r}: only the node that created it, its supervisor's node, this node or an administrator of the mesh may"
            )

    async def link(self, name: str, other: ActorRef) -> None:
        """Tie actor ``name`` here to ``other``: when ``other`` goes down, ``name`` is stopped
        (who controls ``name`` only: a link is the power to stop it)."""
        self._check_link(name, other)
        self._require_control(name, "link")
        self.bindings.bind(name, other)

    async def unlink(self, name: str, other: ActorRef) -> None:
        """Undo ``link``: ``other`` going down no longer stops ``name``."""
        self._check_link(name, other)
        self._require_control(name, "unlink")
        self.bindings.unbind(name, other)

    def _check_link(self, name: str, other: ActorRef) -> None:
        if type(name) is not str or not isinstance(other, ActorRef):
            raise SpawnError("link and unlink take an actor name and an actor ref")
        if name not in self._rt.actors or self._rt.actors[name].system:
            raise ActorNotFound(f"no actor named {name!r} on {self._rt.peer_id}")

    async def spawn(
        self, class_path: str, args: list, kwargs: dict | None, name: str | None, options: dict
    ) -> ActorRef:
        """Create an actor of an allowed class, or of a class from the code package the spawn
        brings; returns its ref once its constructor has run. ``options["get_if_exists"]``: the
        live actor ``name`` of that class if there is one; ``options["detached"]``: it does not
        end with its job."""
        if not isinstance(class_path, str) or not isinstance(args, list) or not isinstance(options, dict):
            raise SpawnError("spawn needs a class path, an argument list and an options map")
        if name is not None and options.get("get_if_exists") is True:
            existing = self._rt.actors.get(name)
            if existing is not None and not existing.system:
                if lattica_class_path(existing.cls) != class_path:
                    raise SpawnError(
                        f"{name!r} on {self._rt.peer_id} is a {lattica_class_path(existing.cls)}, not a {class_path}"
                    )
                return existing.ref
        caller = current_caller()
        job = self._job_for(options, caller)
        ticket = Ticket.from_wire(options["code"]) if options.get("code") is not None else None
        if ticket is not None:
            busy = self._code_spawns.get(caller, 0)
            if busy >= MAX_CODE_SPAWNS:
                raise CodeError(
                    f"{caller} has {busy} spawns with code in progress on {self._rt.peer_id} already (at most {MAX_CODE_SPAWNS}): try again in a moment"
                )
            self._code_spawns[caller] = busy + 1
            if self.code is not None:
                self.code.spawning(ticket.cid, +1)
        try:
            cls, package = await self._class(class_path, ticket, caller)
            return await self._spawn(cls, class_path, args, kwargs, name, options, caller, job, package)
        finally:
            if ticket is not None:
                left = self._code_spawns.pop(caller, 1) - 1
                if left:
                    self._code_spawns[caller] = left
                if self.code is not None:
                    self.code.spawning(ticket.cid, -1)
                    self.code.unload_unused(ticket.cid)  # (a spawn that failed leaves no package behind)

    async def _spawn(
        self,
        cls: type,
        class_path: str,
        args: list,
        kwargs: dict | None,
        name: str | None,
        options: dict,
        caller: PeerId | None,
        job: PeerId | None,
        package: str | None,
    ) -> ActorRef:
        max_concurrency = options.get("max_concurrency", DEFAULT_MAX_CONCURRENCY)
        window = options.get("window", DEFAULT_WINDOW)
        if not (isinstance(max_concurrency, int) and 0 < max_concurrency <= _MAX_CONCURRENCY):
            raise SpawnError(f"max_concurrency must be 1..{_MAX_CONCURRENCY}")
        if not (isinstance(window, int) and 0 < window <= _MAX_WINDOW):
            raise SpawnError(f"window must be 1..{_MAX_WINDOW}")
        if job is not None and job != caller and self._rt.node_gone(job):
            # (a job that asks itself is alive, whatever the view says: a process that restarted
            # with the same key rejoins the mesh a moment after its first call)
            raise SpawnError(
                f"the job that spawns {name or class_path!r} has ended ({job} left the mesh or was declared dead)"
            )
        # Registered before the first await: calls that follow this one on the channel find it.
        publish = options.get("publish", False) is True
        sup = options.get("supervisor")
        owner = caller if caller is not None and caller != self._rt.peer_id else None
        on_behalf = options.get("owner")
        if (
            type(on_behalf) is str
            and isinstance(sup, ActorRef)
            and (caller is None or (caller == sup.peer_id and self._rt.host.is_admin(caller)))
        ):
            # a supervisor's node (ourselves, or one we trust to say so) spawns for the member that
            # owns the supervisor: that member owns the child and is charged for it
            try:
                owner = PeerId.from_string(on_behalf)
            except LatticaError:
                raise SpawnError("owner must be a PeerId") from None
            if owner == self._rt.peer_id:
                owner = None
        if name is not None and name in self._rt.actors:
            held_by = self._jobs.of(name)
            if held_by is not None and self._rt.node_gone(held_by):
                # the last run of the same script: its job ended, and the notice is on its way
                await self._rt.actors[name].stop(f"its job ended ({held_by} left the mesh or was declared dead)")
        replacing = name is not None and name in self._rt.actors  # (a replacement owns nothing more)
        if (
            owner is not None
            and not replacing
            and not self._rt.host.is_admin(owner)
            and self._owned.get(owner, 0) >= MAX_ACTORS_PER_MEMBER
        ):
            raise SpawnError(
                f"{owner} already owns {MAX_ACTORS_PER_MEMBER} actors on {self._rt.peer_id} (the limit for a member)"
            )
        if name is not None and name in self._rt.actors:
            if not (
                isinstance(sup, ActorRef)
                and self._supervisor.get(name) == sup.name
                and self._may_replace(name, sup, caller)
            ):
                raise SpawnError(
                    f"an actor named {name!r} already exists on {self._rt.peer_id} "
                    "(.options(get_if_exists=True) returns it; lattica.kill(ref) ends it)"
                )
            # asked by its supervisor's next incarnation (restarted elsewhere) before we heard
            # the old one died: this child is an orphan of the old one; the new one replaces it
            await self._rt.actors[name].stop("replaced by its supervisor's next incarnation")
            if name in self._rt.actors:
                raise SpawnError(f"an actor named {name!r} already exists on {self._rt.peer_id}")
        incarnation = options.get("incarnation")
        if incarnation is not None and not (
            type(incarnation) is str and 0 < len(incarnation) <= 64 and isinstance(sup, ActorRef)
        ):
            raise SpawnError("incarnation is a supervised child's token, 1 to 64 characters")
        if "reserve" in options:
            if not isinstance(name, str):
                raise SpawnError("a reserving spawn must name its actor")
            self._reserve(name, options["reserve"], options.get("labels"), owner)
        state = options.get("state", NO_STATE)
        try:
            actor = self._rt.create(
                cls, args, kwargs, name, max_concurrency=max_concurrency, window=window, publish=publish, state=state
            )
        except BaseException:
            self._release(name or "", "not created")
            raise
        if owner is not None:
            self._owner[actor.name] = owner
            self._owned[owner] = self._owned.get(owner, 0) + 1
        if job is not None:
            self._jobs.adopt(actor.name, job)
        if package is not None and self.code is not None:
            self.code.use(actor.name, package)
        if sup is not None:
            if not isinstance(sup, ActorRef):
                await actor.stop("spawn refused")
                raise SpawnError("supervisor must be an actor ref")
            self.bindings.bind(actor.name, sup)
            self._supervisor[actor.name] = sup.name
            self._supervisor_node[actor.name] = sup.peer_id
            self._supervisor_ref[actor.name] = sup
            if incarnation is not None:
                self._incarnation[actor.name] = incarnation
        failure = await asyncio.shield(actor.ready)
        if failure is not None:
            type_name, message, tb = failure
            raise SpawnError(f"{class_path} failed to start: {type_name}: {message}\n{tb}".rstrip())
        if job is not None and job != caller and self._rt.node_gone(job) and actor.name in self._rt.actors:
            await actor.stop("its job ended while it started")  # (the notice came while the constructor ran)
            raise SpawnError(f"the job that spawned {actor.name!r} ended while it started")
        return actor.ref

    async def _class(self, path: str, ticket: Ticket | None, caller: PeerId | None) -> tuple[type, str | None]:
        """The class to spawn, and the CID of the package it came from: an allowed class
        installed here (None), else one from the package the ticket names, if this node runs
        that code for this caller."""
        if ticket is None:
            return self._rt.resolve_class(path), None
        if self._rt.allows(path):
            try:
                return self._rt.resolve_class(path), None
            except SpawnError:
                pass  # allowed but not installed here: the package has it
        if self.code is None:
            raise CodeError(
                f"{self._rt.peer_id} runs without the content service, so code cannot travel to it: "
                f"install the module of {path!r} there and allow it (lattica node --allow)"
            )
        host = self._rt.host
        self.code.check(
            ticket,
            caller,
            host.circle_of(caller) if caller is not None else "self",
            caller is None or host.is_admin(caller),
        )
        return await self.code.actor_class(path, ticket), ticket.cid

    def _job_for(self, options: dict, caller: PeerId | None) -> PeerId | None:
        """The job a new actor ends with: none if detached, the job the spawn names (an actor or a
        supervisor of that job spawns), else the calling node (None: this node's own)."""
        if options.get("detached") is True:
            return None
        job = options.get("job")
        peer: PeerId | None
        if job is not None:
            if type(job) is not str:
                raise SpawnError("job must be a PeerId")
            try:
                peer = PeerId.from_string(job)
            except LatticaError:
                raise SpawnError("job must be a PeerId") from None
        else:
            peer = caller
        return None if peer is None or peer == self._rt.peer_id else peer

    def _may_replace(self, name: str, sup: ActorRef, caller: PeerId | None) -> bool:
        """A spawn naming the supervisor of ``name``'s holder asks to replace it (the supervisor's
        next incarnation, restarted elsewhere before we heard the old one died): allowed to whoever
        controls it, or to the new supervisor's own node once the old one's is dead (not merely suspect)."""
        if self._controls(name, caller):
            return True
        old = self._supervisor_node.get(name)
        return caller is not None and sup.peer_id == caller and old is not None and self._rt.node_gone(old)

    @property
    def holder(self) -> Callable[[str, str | None], LocalActor | None]:
        """``holder(name, incarnation)``: the actor ``name`` living here, only if of that
        incarnation (None: none; a property, not a method: peers call only methods)."""
        return self._holder

    def _holder(self, name: str, incarnation: str | None = None) -> LocalActor | None:
        """The actor ``name`` living here; with ``incarnation``, only if it is the one its
        supervisor started with that token. A supervisor stops its children by incarnation (as
        Erlang's by pid): the stop a previous incarnation of the supervisor sends late must not
        reach the child its next incarnation started under the same name."""
        actor = self._rt.actors.get(name)
        if actor is None or (incarnation is not None and self._incarnation.get(name) != incarnation):
            return None
        return actor

    async def kill(self, name: str, incarnation: str | None = None) -> None:
        """Stop the actor ``name`` (its on_stop hook runs; calls in flight fail with ActorDied);
        with ``incarnation`` (a supervisor's token for its child), only that incarnation of it."""
        actor = self._holder(name, incarnation)
        if actor is None:
            raise ActorNotFound(
                f"no actor named {name!r} on {self._rt.peer_id}"
                + (" of that incarnation" if incarnation is not None else "")
            )
        if actor.system:
            raise SpawnError(f"{name!r} is a system actor of {self._rt.peer_id}; it cannot be killed")
        self._require_control(name, "kill")
        await actor.stop("killed")

    async def lookup(self, name: str) -> ActorRef:
        actor = self._rt.actors.get(name)
        caller = current_caller()
        stranger = caller is not None and self._rt.host.circle_of(caller) == "stranger"
        if stranger and (actor is None or not actor.public):
            assert caller is not None  # (a stranger is a caller)
            # a stranger sees only the actors open to it, and learns nothing of the others (not
            # even whether the name is taken): it is told why, which is what it can act on
            raise PermissionDenied(
                f"{caller} is not a member of {self._rt.peer_id}'s mesh ({self._rt.host.circle_reason(caller)}): "
                f"it sees only actors opened to strangers, and {name!r} is not one it may look up; "
                "a node of the same mesh starts with its key or an invitation (LATTICA_MESH; docs/security.md)"
            )
        if actor is None:
            raise ActorNotFound(f"no actor named {name!r} on {self._rt.peer_id}")
        if stranger:
            ref = actor.ref  # ...and of those only the methods open to it
            return ActorRef(
                ref.peer_id, ref.name, {m: k for m, k in ref.methods.items() if m in actor.public}, ref.window
            )
        return actor.ref

    async def monitor(self, name: str, monitor_id: int) -> None:
        """The caller wants to hear (``down``) when actor ``name`` stops; ActorNotFound if it
        is not here."""
        caller = current_caller()
        if caller is None or type(name) is not str or type(monitor_id) is not int:
            raise SpawnError("monitor needs an actor name and a monitor id")
        self._rt.monitors.add_watcher(name, caller, monitor_id)

    async def demonitor(self, name: str, monitor_id: int) -> None:
        caller = current_caller()
        if caller is not None:
            self._rt.monitors.remove_watcher(name, caller, monitor_id)

    async def down(self, monitor_id: int, reason: str) -> None:
        """A node tells us an actor we monitor there stopped."""
        caller = current_caller()
        if caller is not None and type(monitor_id) is int and type(reason) is str:
            self._rt.monitors.down(caller, monitor_id, reason[:500])

    async def names(self) -> list[str]:
        """Names of the actors living on this node."""
        return sorted(self._rt.actors)
