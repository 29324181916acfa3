"""The ``Runtime``: one node's actors, its call channels and the calls in flight; it makes, routes,
follows (stable refs) and fails calls."""

from __future__ import annotations

import asyncio
import collections
import fnmatch
import importlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, overload

from lattica import _context as context
from lattica import _rpc as rpc
from lattica import codec
from lattica._budget import StrangersShare, Turns
from lattica._future import Future
from lattica._identity import PeerId
from lattica._metrics import Histogram
from lattica._runtime.client import Gate, LocalChannel, Pending, RemoteChannel, call_finished
from lattica._runtime.following import Following
from lattica._runtime.limits import (
    BUILTIN_ACTORS,
    CALL_CHANNELS,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_WINDOW,
    HOOK_TIMEOUT,
    MAX_ACTORS,
    MAX_STREAM_ARGS,
    NO_STATE,
    RECENT_PLACEMENT,
    STRANGERS_CALLS,
)
from lattica._runtime.local import ArgStream, EndedActor, LocalActor, error_parts, reset_quietly
from lattica._runtime.partials import PartialMessages
from lattica._runtime.refs import StreamArg, method_table, public_methods
from lattica._runtime.server import ServerChannel
from lattica._runtime.spilling import KEEP_TELLS, Spills
from lattica._runtime.window import SentItems
from lattica.errors import (
    ActorDied,
    ActorNotFound,
    CallTimeout,
    FrameTooLarge,
    LatticaError,
    MailboxFull,
    MethodNotFound,
    PathChanged,
    PeerUnreachable,
    PermissionDenied,
    PlacementError,
    ProtocolError,
    SpawnError,
    remote_error,
)
from lattica.logging import get_logger
from lattica.transports.base import PROBE_TIMEOUT, Connection, Stream

if TYPE_CHECKING:
    from lattica._host import Host
    from lattica._monitors import Monitors
    from lattica._runtime.client import Channel
    from lattica._runtime.local import Invocation
    from lattica._runtime.ports import Blocks, MembershipView, Names
    from lattica._runtime.refs import ActorRef
    from lattica.config import NodeConfig

log = get_logger("lattica.runtime")

MAX_ENDED = 64  # ended user actors remembered per node (their errors and output: the dashboard's)
_LEAVES = frozenset({str, int, float, bool, type(None), bytes})  # arguments a local call need not check


class Runtime(Following):
    """Actors of one node and its call channels; lives on the node loop."""

    def __init__(self, host: Host, config: NodeConfig) -> None:
        self.host = host
        self.loop = host.loop
        self.peer_id: PeerId = host.peer_id
        self.allow = list(config.allow)
        self.channel_idle: float = config.channel_idle
        self.partials = PartialMessages(config.inbound)  # incomplete messages held
        self.actors: dict[str, LocalActor] = {}
        self.channels: dict[PeerId, Channel] = {}
        self.moved: set[RemoteChannel] = set()  # channels that moved off a connection going away, finishing their calls
        self._ids = itertools.count(1)
        self._posted: collections.deque[Callable[[], None]] = collections.deque()
        self._post_lock = threading.Lock()
        self._post_scheduled = False
        self.local = LocalChannel(self, self.peer_id)
        self._gates: dict[tuple[PeerId, str], Gate] = {}
        self.in_flight: dict[tuple[PeerId, str], int] = {}  # calls from a peer to an actor, in progress
        # what all strangers together may have us read of their calls (the loop time they take)
        self.strangers_calls = Turns(
            StrangersShare(*STRANGERS_CALLS, lambda peer: True), self.loop
        )  # (asked for strangers' channels only)
        self.call_latency = Histogram()  # seconds from a call's creation to its answer (calls that got one)
        self.ended: collections.deque[EndedActor] = collections.deque(maxlen=MAX_ENDED)  # user actors that ended lately
        self.spills = Spills(self, config.spill_limit)  # arguments and answers over the message cap, by CID
        self._spilling: dict[
            tuple[PeerId, str], collections.deque[tuple[Pending, bool, FrameTooLarge | None]]
        ] = {}  # calls held behind a spill, in order
        self._serving: dict[PeerId, set[ServerChannel]] = {}  # the call channels each peer opened to us
        # nodes sharing one loop (Node.astart) share its thread: the first live one keeps the mapping
        current = context.thread_runtime()
        if current is None or current.host.closing or current.loop.is_closed():
            context.bind_thread(self)
        context.add_live(self)
        host.handlers[rpc.PROTOCOL] = self._serve
        host.handlers[rpc.PROTOCOL_1] = lambda stream, conn: self._serve(stream, conn, rpc.PROTOCOL_1)
        self.monitors: Monitors = None  # type: ignore[assignment]  # the host sets them right after (they import us)
        self.stop_listeners: list[Callable[[str, str], None]] = []  # told (actor name, reason) when one of ours ends
        self._placed: collections.deque[tuple[float, str, Any]] = collections.deque()  # (when, peer, its load then)
        # the services the runtime uses, handed to it as they are built (lattica/services.py)
        self.names: Names | None = None  # named actors (the DHT)
        self.membership: MembershipView | None = None  # who is up (None: the node runs without membership)
        self.blocks: Blocks | None = None  # values over the message cap travel by CID (None: no content service)
        host.spawn(self._close_idle_channels())

    def use_names(self, names: Names) -> None:
        self.names = names

    def use_membership(self, membership: MembershipView) -> None:
        self.membership = membership

    def use_blocks(self, blocks: Blocks) -> None:
        self.blocks = blocks

    async def _close_idle_channels(self) -> None:
        """Close call channels with nothing in flight for a while, so that the connections under
        them can go idle and close (an open stream keeps a connection alive)."""
        while True:
            await asyncio.sleep(max(self.channel_idle / 4, 0.05))
            for peer, ch in list(self.channels.items()):
                if isinstance(ch, RemoteChannel) and ch.idle():
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

    def create(
        self,
        cls: type,
        args: list,
        kwargs: dict | None,
        name: str | None,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        window: int = DEFAULT_WINDOW,
        instance: Any = None,
        publish: bool = False,
        state: Any = NO_STATE,
        public: Iterable[str] | bool | None = None,
    ) -> LocalActor:
        """Make an actor here; ``publish``: register its name mesh-wide in the DHT while it lives;
        ``state``: a checkpoint handed to its ``restore`` before any call; ``public``: the methods
        strangers may call (True: all), else what the class declares (``@lattica.public``)."""
        name = name or f"{cls.__name__}-{next(self._ids):x}-{id(cls) & 0xFFFF:04x}"
        if not name or len(name) > rpc.MAX_NAME:
            raise ValueError("actor names are 1 to 256 characters")
        if name in self.actors:
            raise SpawnError(f"an actor named {name!r} already exists on {self.peer_id}")
        if len(self.actors) >= MAX_ACTORS:
            raise SpawnError(f"{self.peer_id} already runs {MAX_ACTORS} actors")
        methods = method_table(cls)
        actor = LocalActor(self, name, cls, methods, max_concurrency, window)
        if public is None:
            actor.public = public_methods(cls, methods)
        else:
            actor.public = frozenset(methods) if public is True else frozenset(public or ()) & frozenset(methods)
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
        if self.membership is None:
            raise PlacementError("placement needs membership: this node runs with membership=False")
        return self.membership.nodes()

    def placed(self, peer: str, view: list[dict[str, Any]]) -> None:
        """We just sent a spawn to ``peer``: count it until its gossiped load changes."""
        row = next((r for r in view if r["peer_id"] == peer), {})
        self._placed.append((self.loop.time(), peer, row.get("load")))

    def recent_placements(self, view: list[dict[str, Any]]) -> dict[str, int]:
        """Spawns sent per node that its gossiped load does not show yet (same load as when we
        sent them, and within a few seconds)."""
        horizon = self.loop.time() - RECENT_PLACEMENT
        loads = {r["peer_id"]: r.get("load") for r in view}
        self._placed = collections.deque(e for e in self._placed if e[0] >= horizon and loads.get(e[1]) == e[2])
        return dict(collections.Counter(peer for _, peer, _ in self._placed))

    def actor_ended(self, name: str, reason: str) -> None:
        for listener in self.stop_listeners:
            try:
                listener(name, reason)
            except Exception:
                log.exception("actor stop listener failed", actor=name)

    def remember_ended(self, actor: LocalActor, reason: str) -> None:
        """Keep what a user actor that just ended leaves for the dashboard (not its instance)."""
        self.ended.append(EndedActor(actor, reason))

    def forget(self, actor: LocalActor) -> None:
        if self.actors.get(actor.name) is actor:
            del self.actors[actor.name]

    def allows(self, path: str) -> bool:
        """Whether the allow-list lets peers spawn the installed class ``path`` here."""
        return isinstance(path, str) and any(fnmatch.fnmatchcase(path, pat) for pat in (*self.allow, *BUILTIN_ACTORS))

    def resolve_class(self, path: str) -> type:
        """Import the ``@lattica.actor`` class named ``module.Class``, if the allow-list permits.

        The allow-list is checked twice: against the name asked for, and against where the class
        actually lives (``cls.__module__`` + ``__qualname__``), so a permitted module cannot be used
        to reach anything it merely imports. Only decorated actor classes can be spawned."""
        refuse = (
            f"class {path!r} is not allowed on {self.peer_id} (allow-list: {self.allow or 'empty'}; "
            "its code did not travel with the spawn: the caller ships only its script's directory and lattica.init(code=[...]))"
        )
        allowed = [*self.allow, *BUILTIN_ACTORS]
        if not self.allows(path):
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
        for ch in [*self.channels.values(), *self.moved]:
            ch.fail_all(PeerUnreachable("this node is shutting down"))
        if context.thread_runtime() is self:
            context.unbind_thread(self)
            for other in context.live_runtimes():  # another node on this shared loop (Node.astart) takes over
                if other is not self and other.host.thread_id == threading.get_ident() and not other.host.closing:
                    context.bind_thread(other)
                    break
        context.discard_live(self)

    # -- calls out ------------------------------------------------------------------------------

    def channel_for(self, peer: PeerId) -> Channel:
        if peer == self.peer_id:
            return self.local
        ch = self.channels.get(peer)
        if isinstance(ch, RemoteChannel) and ch.moving:
            if ch.quiet():
                self._retire(ch)
                ch = None
            else:  # calls are in flight on it: they finish there, new calls go on the new path
                ch = self.channels[peer] = ch.hand_over()
                self.moved.add(ch.predecessor)  # type: ignore[arg-type]
        if ch is None:
            ch = self.channels[peer] = RemoteChannel(self, peer)
        return ch

    def connection_going_away(self, conn: Connection) -> None:
        """``conn`` goes away (a better path replaced it, it was a duplicate or idle, or the peer
        retired it): the call channel on it moves to the peer's current path, at once if nothing
        is in flight on it, else at the next call (see ``RemoteChannel``)."""
        ch = self.channels.get(conn.remote_peer)
        if isinstance(ch, RemoteChannel) and ch.conn is conn:
            ch.moving = True
            if ch.quiet():
                self._retire(ch)

    def connection_expired(self, conn: Connection, grace: float) -> None:
        """``conn`` went away ``grace`` seconds ago and still carries calls: they fail with
        PathChanged (idempotent ones are sent again on the new path) before it closes."""
        peer = conn.remote_peer
        on_it = [
            ch for ch in (self.channels.get(peer), *self.moved) if isinstance(ch, RemoteChannel) and ch.conn is conn
        ]
        for ch in on_it:
            n = len(ch.pending)
            if ch.stream is not None:
                self.host.spawn(reset_quietly(ch.stream))
            self.drop_channel(
                ch,
                PathChanged(
                    f"the path to {peer} changed and {n} call(s) on the old {conn.transport} connection did not finish "
                    f"within its {grace:g} s grace period (Node(drain_grace=...)); they may or may not have run. "
                    "Calls marked .options(idempotent=True) are sent again on the new path instead"
                ),
            )

    def retire_channel(self, ch: RemoteChannel) -> None:
        self._retire(ch)

    def _retire(self, ch: RemoteChannel) -> None:
        if self.channels.get(ch.peer) is ch:
            del self.channels[ch.peer]
        self.moved.discard(ch)
        ch.closed = PeerUnreachable("call channel moved to a better connection")
        ch.leave()
        if ch.stream is not None:
            self.host.spawn(ch.stream.close())

    def member_down(self, member: Any, why: str) -> None:
        """Membership's verdict on a peer: calls waiting on it fail (or, through stable refs, follow
        their actors) instead of waiting on a frozen process; monitors on its actors fire."""
        try:
            peer = PeerId.from_string(member.id)
        except LatticaError:
            return
        for ch in [self.channels.get(peer), *(c for c in self.moved if c.peer == peer)]:
            if isinstance(ch, RemoteChannel):
                if ch.stream is not None:
                    self.host.spawn(reset_quietly(ch.stream))
                self.drop_channel(ch, PeerUnreachable(f"{peer} was declared {member.state}: {why}"))
        self.monitors.node_down(member.id, why)

    def drop_channel(self, ch: Channel, error: LatticaError) -> None:
        if self.channels.get(ch.peer) is ch:
            del self.channels[ch.peer]
        self.moved.discard(ch)
        ch.fail_all(error)

    @overload
    def call(
        self,
        ref: ActorRef,
        method: str,
        args: tuple,
        kwargs: dict,
        *,
        timeout: float | None,
        tell: Literal[False] = False,
        stream: None = None,
        block: bool = True,
        idempotent: bool = False,
    ) -> Future: ...

    @overload
    def call(
        self,
        ref: ActorRef,
        method: str,
        args: tuple,
        kwargs: dict,
        *,
        timeout: float | None,
        tell: bool = False,
        stream: Any = None,
        block: bool = True,
        idempotent: bool = False,
    ) -> Future | None: ...

    def call(
        self,
        ref: ActorRef,
        method: str,
        args: tuple,
        kwargs: dict,
        *,
        timeout: float | None,
        tell: bool = False,
        stream: Any = None,
        block: bool = True,
        idempotent: bool = False,
    ) -> Future | None:
        """Make a call (on the loop); returns its Future (None for tell or a streaming call)."""
        p = self.prepare(ref, method, args, kwargs, timeout=timeout, tell=tell, stream=stream, idempotent=idempotent)
        if ref.peer_id != self.peer_id:
            try:
                p.encoded = codec.encode(p.msg)
            except FrameTooLarge as e:
                self.spills.content_for(e)  # (raises e where nothing can travel by CID)
                self._hold(p, block, spill=e)  # its big values are stored first, off the loop; calls after it wait
                return p.future
        self.submit(p, block)
        return p.future

    def prepare(
        self,
        ref: ActorRef,
        method: str,
        args: tuple,
        kwargs: dict,
        *,
        timeout: float | None,
        tell: bool = False,
        stream: Any = None,
        encode: bool = False,
        idempotent: bool = False,
    ) -> Pending:
        """Build a call (any thread). With ``encode``, a call to another node is encoded here, so
        an argument the codec refuses raises in the caller's thread."""
        spawn = ref._spawn
        if spawn is not None and spawn.done() and not spawn.cancelled() and spawn.exception() is not None:
            if not ref.stable:
                raise spawn.exception()
            ref._spawn = None  # following it failed once; this call starts over
        flags = (rpc.F_TELL if tell else 0) | (rpc.F_STREAM if stream is not None else 0)
        arg_list = list(args)
        streamed: dict[int, Any] | None = None
        for i, a in enumerate(arg_list):
            if hasattr(a, "__aiter__") and not isinstance(a, (ArgStream,)):
                streamed = streamed or {}
                if len(streamed) >= MAX_STREAM_ARGS:
                    raise ValueError(f"at most {MAX_STREAM_ARGS} arguments of one call can be streams")
                streamed[len(streamed)] = a
                arg_list[i] = StreamArg(len(streamed) - 1)
        if streamed:
            flags |= rpc.F_ARGSTREAM
        cid = next(self._ids)  # itertools.count: safe from any thread
        msg = rpc.call(cid, ref.name, method, arg_list, kwargs or None, timeout, flags)
        p = Pending(cid, ref, msg, None if tell or stream is not None else Future(self.loop), stream)
        p.stream_args = streamed
        p.idempotent = idempotent
        if ref.peer_id != self.peer_id:
            if encode:
                try:
                    p.encoded = codec.encode(msg)
                except (
                    FrameTooLarge
                ) as e:  # its big values travel by CID, stored here and now (as Ray's .remote() puts them)
                    self._spilled(p, self.spills.spill_now(msg, e))
                    p.encoded = codec.encode(msg)
        elif not (
            _LEAVES.issuperset(map(type, arg_list)) and (not kwargs or _LEAVES.issuperset(map(type, kwargs.values())))
        ):
            # a local call passes its arguments by reference, but they must be what a remote call
            # could carry: a lambda or an open file fails in the first, local test (as in Ray),
            # not once the actor moves; the encoding is checked, not kept (big buffers are not copied)
            codec.check([arg_list, kwargs])
        return p

    def _spilled(self, p: Pending, roots: list) -> None:
        """What ``p`` stored goes when it is over (a tell's, or a stream's, after KEEP_TELLS)."""
        if p.future is not None:
            p.future.add_done_callback(lambda _f: self.spills.release(roots))
        else:
            self.loop.call_soon_threadsafe(self.spills.release_later, roots, KEEP_TELLS)

    def _hold(self, p: Pending, block: bool, spill: FrameTooLarge | None = None) -> None:
        """Queue ``p`` behind the spill in progress for its actor (or start one, ``spill``): the
        actor gets its calls in the order they were made."""
        key = (p.ref.peer_id, p.ref.name)
        q = self._spilling.get(key)
        if q is None:
            q = self._spilling[key] = collections.deque()
            self.host.spawn(self._send_held(key, q))
        q.append((p, block, spill))

    async def _send_held(self, key: tuple[PeerId, str], q: collections.deque) -> None:
        try:
            while q:
                p, block, spill = q[0]
                if spill is not None and not call_finished(p):
                    try:
                        self._spilled(p, await self.spills.spill_call(p.msg, spill))
                        p.encoded = None  # (encoded again as it goes)
                    except BaseException as e:  # noqa: BLE001 -- the caller's
                        q.popleft()
                        self.fail_call(p, e)
                        continue
                q.popleft()
                if call_finished(p):
                    p.ungate()
                    continue
                try:
                    self._submit(p, block)
                except BaseException as e:  # noqa: BLE001 -- the caller's
                    p.ungate()
                    self.fail_call(p, e)
        finally:
            del self._spilling[key]

    def submit(self, p: Pending, block: bool) -> None:
        """Send a prepared call (on the loop): held behind a spill in progress for its actor, or
        while its actor's spawn is pending, then through the channel's credit window. Raises
        MailboxFull when it may not wait."""
        if self._spilling and (p.ref.peer_id, p.ref.name) in self._spilling:
            self._hold(p, block)
            return
        self._submit(p, block)

    def _submit(self, p: Pending, block: bool) -> None:
        if p.msg.timeout is not None and not (p.msg.flags & rpc.F_TELL):
            p.timer = self.loop.call_later(p.msg.timeout, self._timed_out, p)
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
            elif not p.msg.flags & rpc.F_TELL and self._node_state(ref.peer_id) == "dead":
                self.fail_call(
                    p, PeerUnreachable(f"{ref.peer_id} was declared dead; calls to it fail until it rejoins the mesh")
                )
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

    def submit_threadsafe(self, p: Pending, block: bool) -> None:
        """``submit`` for a call prepared on another thread: failures go to its future/stream."""
        if call_finished(p):  # cancelled before it reached the loop
            p.ungate()
            return
        try:
            self.submit(p, block)
        except BaseException as e:  # noqa: BLE001 -- delivered to the caller
            p.ungate()
            self.fail_call(p, e)

    def gate(self, ref: ActorRef) -> Gate:
        key = (ref.peer_id, ref.name)
        g = self._gates.get(key)
        return g if g is not None else self._gates.setdefault(key, Gate())

    def _release_held(self, ref: ActorRef) -> None:
        """The spawn behind ``ref`` answered: send the calls held for it, in order, or fail them."""
        held, ref._held = ref._held or [], None
        spawn = ref._spawn
        error = spawn.exception() if spawn is not None and not spawn.cancelled() else None
        ch = self.channel_for(ref.peer_id)
        for p in held:
            if call_finished(p):
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

    def _timed_out(self, p: Pending) -> None:
        ch = p.channel
        if ch is not None and p.cid in ch.pending:
            if isinstance(ch, RemoteChannel):
                ch.send([rpc.CANCEL, p.cid])
                # a slow actor, or a dead path (its NAT forgot it, a relay lost the other end):
                # a probe tells them apart, and a dead connection is aborted so the next call
                # finds a way again
                conn = self.host.conns.get(ch.peer)
                if conn is not None:
                    conn.probe(PROBE_TIMEOUT)
        self.fail_call(
            p, CallTimeout(f"call to {p.ref.name}.{p.msg.method} timed out after {p.msg.timeout} s"), cancel_local=True
        )

    def fail_call(self, p: Pending, error: BaseException, cancel_local: bool = False) -> None:
        ch = p.channel
        if ch is not None and ch.pending.pop(p.cid, None) is not None:
            if not p.delivered:  # (given up: later calls need not wait for it to arrive)
                p.delivered = True
                ch.delivered(p.ref.name)
            ch.returned(p.ref.name)
            self._end_pumps(p)
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

    def complete_call(self, p: Pending, value: Any, error: tuple | None, end: bool = False) -> None:
        ch = p.channel
        if ch is None or ch.pending.pop(p.cid, None) is None:
            return  # timed out or cancelled already
        ch.returned(p.ref.name)
        self._end_pumps(p)
        if p.timer is not None:
            p.timer.cancel()
        self.call_latency.observe(time.monotonic() - p.created)
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

    def _error(self, p: Pending, kind: str, type_name: str, message: str, tb: str) -> BaseException:
        where = f"{p.ref.name}.{p.msg.method}"
        if kind == rpc.E_REMOTE:
            return remote_error(type_name, message, tb)
        if kind == rpc.E_NOT_FOUND:
            spawn = p.ref._spawn
            if spawn is not None and spawn.done() and spawn.exception() is not None:
                return spawn.exception()
            return ActorNotFound(message)
        if kind == rpc.E_METHOD:
            return MethodNotFound(message)
        if kind == rpc.E_DENIED:
            return PermissionDenied(message)
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

    def on_reply(self, ch: RemoteChannel, msg: list, size: int = 0) -> None:
        ch.last_used = time.monotonic()
        kind = msg[0]
        if kind == rpc.MAILBOX:
            ch.delivered(msg[rpc.MAILBOX_ACTOR], msg[rpc.MAILBOX_N])
            ch.returned(msg[rpc.MAILBOX_ACTOR], msg[rpc.MAILBOX_N])
            return
        p = ch.pending.get(msg[rpc.ID])
        if p is None:
            return
        if not p.delivered:
            p.delivered = True
            ch.delivered(p.ref.name)
        if kind == rpc.OK:
            self.complete_call(p, msg[rpc.VALUE], None)
        elif kind == rpc.ERR:
            self.complete_call(
                p, None, (msg[rpc.ERR_KIND], msg[rpc.ERR_TYPE], msg[rpc.ERR_MESSAGE], msg[rpc.ERR_TRACEBACK])
            )
        elif kind == rpc.ITEM:
            if p.stream is not None:
                p.stream._push(msg[rpc.VALUE], size)
        elif kind == rpc.END:
            self.complete_call(p, None, None, end=True)
        elif kind == rpc.ARGCRED:
            self._pump_arg(ch, p, msg[rpc.ARG_INDEX], *rpc.grant(msg))

    # -- client streaming -----------------------------------------------------------------------

    def _pump_arg(self, ch: RemoteChannel, p: Pending, index: int, n: int, taken: int) -> None:
        """The callee granted ``n`` more items of streamed argument ``index``, having taken the
        oldest ``taken`` we sent."""
        if not p.stream_args or index not in p.stream_args:
            return
        if p.arg_state is None:
            p.arg_state = {}
        state = p.arg_state.get(index)
        if state is None:
            sent = SentItems()
            state = p.arg_state[index] = [min(n, sent.cap()), None, sent, None]
            state[3] = self.host.spawn(self._pump(ch, p, index, p.stream_args[index], state))
            return
        state[2].taken(taken)
        state[0] = min(state[0] + n, state[2].cap())  # (credit beyond what our outstanding items allow is not taken)
        if state[1] is not None and not state[1].done():
            state[1].set_result(None)

    async def _pump(self, ch: RemoteChannel, p: Pending, index: int, source: Any, state: list) -> None:
        """Send the items of streamed argument ``index`` as its credit allows; ``state`` is
        [credit, waiter for more, the items sent and not taken (``window.SentItems``),
        this task]. The call's end stops it (``_end_pumps``) and closes the source."""
        it = aiter(source)
        try:
            async for value in it:
                while state[0] <= 0 or not state[2].may_send():
                    if p.cid not in ch.pending:
                        return
                    state[1] = self.loop.create_future()
                    await state[1]
                state[0] -= 1
                if p.cid not in ch.pending:
                    return
                chunks = codec.encode([rpc.ARG, p.cid, index, value])
                ch.send([], chunks)
                state[2].sent(sum(len(c) for c in chunks))
                state[0] = min(
                    state[0], state[2].cap()
                )  # (items that grew do not ride on credit granted for small ones)
                if ch.congested():  # a callee that grants and never reads: wait, do not queue
                    await ch.writable()
            if p.cid in ch.pending:
                ch.send([rpc.ARGEND, p.cid, index])
        except Exception as e:  # the source raised, or the codec refused an item
            if p.cid in ch.pending:
                ch.send([rpc.CANCEL, p.cid])
            self.fail_call(p, e if isinstance(e, LatticaError) else remote_error(*error_parts(e)))
        finally:
            await _close_source(it)

    def _end_pumps(self, p: Pending) -> None:
        """The call ended: its streamed arguments' pumps stop (wherever they wait) and close
        their sources; a source never pumped (no credit came) is closed here."""
        if not p.stream_args:
            return
        states = p.arg_state or {}
        me = asyncio.current_task()
        for index, source in p.stream_args.items():
            state = states.get(index)
            if state is None:
                self.host.spawn(_close_source(aiter(source)))
            elif state[3] is not None and state[3] is not me and not state[3].done():
                state[3].cancel()

    def local_arg_streams(self, inv: Invocation, p: Pending) -> None:
        """A local call with streamed arguments: hand the caller's async iterators over directly."""
        for i, a in enumerate(inv.args):
            if isinstance(a, StreamArg):
                inv.args[i] = p.stream_args[a.index]  # type: ignore[index]

    # -- serving --------------------------------------------------------------------------------

    async def _serve(self, stream: Stream, conn: Connection, protocol: str = rpc.PROTOCOL) -> None:
        chans = self._serving.setdefault(conn.remote_peer, set())
        if sum(1 for c in chans if c.conn is conn) >= CALL_CHANNELS:
            # a caller needs one: more would each hold their own replies and unread calls
            log.info(
                "refused a call channel: too many on one connection", peer=str(conn.remote_peer), limit=CALL_CHANNELS
            )
            stream.reset()
            return
        ch = ServerChannel(self, stream, conn, protocol)
        chans.add(ch)
        try:
            await ch.serve()
        finally:
            left = self._serving.get(ch.peer)
            if left is not None:
                left.discard(ch)
                if not left:
                    del self._serving[ch.peer]

    def channels_from(self, peer: PeerId) -> set[ServerChannel]:
        """The call channels ``peer`` has open to us (empty: none)."""
        return self._serving.get(peer, set())

    def unsent_to(self, peer: PeerId) -> int:
        """Bytes of replies to ``peer``'s calls not yet taken by its connection (it is slow, or
        not reading them): what a service that answers with bulk data waits on. Only the channels
        on the peer's current connection count: a path it left (a relayed one replaced by a
        punched one, which may be dead but not yet found so) must not hold back the answers
        that go out on the new one."""
        chans = self._serving.get(peer)
        if not chans:
            return 0
        primary = self.host.conns.get(peer)
        return sum(ch.writer.backlog() for ch in chans if primary is None or ch.conn is primary)


async def _close_source(it: Any) -> None:
    """Close a streamed argument's iterator (an async generator's ``finally`` runs), within
    HOOK_TIMEOUT: a source stuck as it closes must not hold the node's shutdown."""
    close = getattr(it, "aclose", None)
    if close is None:
        return
    try:
        await asyncio.wait_for(close(), HOOK_TIMEOUT)
    except (Exception, asyncio.CancelledError):  # (the user's generator failing as it closes ends nothing of ours)
        log.debug("a streamed argument's source did not close cleanly", exc_info=True)
