"""One open document on one node: its pycrdt document, its replica rules, its log, and the replica
actor peers reach it through (``crdt/<document id>``).

Local changes (any thread, in pycrdt transactions) are gathered and, once per turn of the node
loop, signed as one envelope of our chain, applied to the rules (as every replica will), logged
and published on the document's pub-sub topic. Envelopes from peers arrive through that topic's
validator (an envelope refused is never delivered nor passed on) and through anti-entropy
(``sync``/``push`` between two replicas: each says what it holds per chain, the other sends what
is missing, in an order it can apply). Once a replica's log holds ``compact_every`` envelopes,
one replica proposes a **checkpoint** of what it applied; replicas that hold the same envelopes
check it and sign it, and once it carries the signatures a newcomer needs (the owner's, or a
quorum of members') every replica drops the envelopes it covers, and gives the checkpoint with
its state to a replica that lacks them. Everything here runs on the node loop, except pycrdt's
own transactions, which users run on their threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import pycrdt

from lattica.budget import Buckets
from lattica.crdt.checkpoint import MAX_SIGNATURES, MAX_STATE, Checkpoint, Signature
from lattica.crdt.envelope import (
    ACL,
    MAX_AUTHOR,
    MAX_CERT,
    MAX_CERTS,
    MAX_DEPS,
    Acl,
    Envelope,
    client_id,
    decode_any,
    sign,
    sign_acl,
)
from lattica.crdt.replica import MAX_CHAINS, MemoryLog, Outcome, ReplicaState
from lattica.crdt.yupdate import read_update
from lattica.errors import (
    CrdtError,
    LatticaError,
    MalformedUpdate,
    NotAWriter,
    PermissionDenied,
    ProtocolError,
    Timeout,
    UpdateRejected,
)
from lattica.identity import PeerId
from lattica.logging import get_logger
from lattica.pubsub.subscription import Subscription
from lattica.runtime import current_caller
from lattica.runtime.limits import ASYNC
from lattica.runtime.refs import ActorRef

if TYPE_CHECKING:
    from lattica.actors.crdt.service import CrdtService

__all__ = ["Replica", "ReplicaActor", "Change", "actor_name", "topic_of"]

log = get_logger("lattica.crdt")

MAX_SUMMARY = MAX_CHAINS  # chains one summary names
MAX_PUSH = 1024  # envelopes one push or sync answer carries
PAGE_BYTES = 4 << 20  # and about this many bytes
HEAD_ID = 16  # bytes of a head's id a summary carries
MAX_CHECKPOINTS_SENT = 1  # checkpoints (with their states, up to MAX_STATE each) in one answer
SYNC_BYTES_RATE = 16 << 20  # bytes a second our sync answers send one peer on average
SYNC_BYTES_BURST = 64 << 20  # (a checkpoint's state, up to 48 MiB, goes in one answer)
MAX_BODY = 8 << 20  # (each replica refuses what is over its own max_update_bytes)
REBUILD_GAP = 1.0  # seconds at least between two rebuilds of a document
# refusals a forwarder should have seen for itself: its copy is rejected (scored down); others
# (a list or a view that may not have reached it yet, a full waiting room) are only ignored
_HARD = frozenset(
    {
        "bad signature",
        "malformed update",
        "malformed ACL",
        "another document",
        "too large",
        "items under another client id",
        "items do not continue the chain's clock",
        "names items of its own chain that do not exist",
        "deps are not what the update names",
        "an ACL not signed by the owner",
        "a chain's first envelope names a previous one",
    }
)
_TYPES = {"map": pycrdt.Map, "array": pycrdt.Array, "text": pycrdt.Text}


def actor_name(doc: bytes) -> str:
    return "crdt/" + doc.hex()


def topic_of(doc: bytes) -> str:
    return "lattica/crdt/" + doc.hex()


def _ref(peer: PeerId, doc: bytes) -> ActorRef:
    return ActorRef(peer, actor_name(doc), {"sync": ASYNC, "push": ASYNC, "checkpoint": ASYNC})


class Change:
    """One change a replica applied: by whom, under which chain position, and the Yjs update;
    or (``rebuilt``) the whole document made again from the log: roots taken before are stale."""

    __slots__ = ("author", "seq", "update", "local", "rebuilt")

    def __init__(self, author: PeerId, seq: int, update: bytes, local: bool, rebuilt: bool = False) -> None:
        self.author, self.seq, self.update, self.local, self.rebuilt = author, seq, update, local, rebuilt

    def __repr__(self) -> str:
        if self.rebuilt:
            return "Change(rebuilt)"
        return f"Change(author={self.author.short()}, seq={self.seq}, {len(self.update)} bytes, {'local' if self.local else 'remote'})"


class Replica:
    """One document's replica on this node (see the module docstring)."""

    def __init__(self, svc: CrdtService, name: str, doc: bytes, owner: bytes | None) -> None:
        self.svc = svc
        self.rt = svc.rt
        self.host = svc.rt.host
        self.cfg = svc.cfg
        self.name = name
        self.doc = doc
        self.owner = owner
        self.topic = topic_of(doc)
        self.me = self.rt.peer_id.to_bytes()
        self.nonce = b""
        self.client = 0
        self.ydoc: pycrdt.Doc | None = None
        self.state = ReplicaState(
            doc,
            owner,
            MemoryLog(),
            is_member=self._is_member,
            max_update=self.cfg.max_update_bytes,
            max_held=self.cfg.max_held,
        )
        self.roots: dict[str, str] = {}
        self.log_bytes = 0
        self._local: list[bytes] = []
        self._local_lock = threading.Lock()
        self._flush_handle: Any = None
        self._applying = False
        self._loop_thread = self.host.thread_id
        self._error: CrdtError | None = None
        self._rates = Buckets(self.cfg.author_rate, max(self.cfg.author_rate, 1.0), 1024)
        self._observers: list[Callable[[Change], Any]] = []
        self._changes: list[Subscription] = []
        self._durable: asyncio.Future | None = None  # the store's write of what we applied last
        self._since_snapshot = 0
        self._synced: set[PeerId] = set()
        self._known: dict[PeerId, dict] = {}  # what each replica peer held when we last heard (chain -> seq)
        self._again: set[PeerId] = set()  # peers to sync with once more when the sync under way ends
        self._syncing: dict[PeerId, asyncio.Task] = {}
        self._task: asyncio.Task | None = None
        self.closed = False
        self.refused = 0
        self.applied = 0
        self.rebuilds = 0
        self._declared: set[str] = set()  # roots this node's code named (their types are what it said)
        self._sync_calls = Buckets(20.0, 40.0, 1024)  # sync and push calls each peer may make of us
        self._sync_bytes = Buckets(SYNC_BYTES_RATE, SYNC_BYTES_BURST, 1024)  # and the bytes our answers send it
        self._observing: Any = None  # our subscription to the pycrdt document's transactions
        self._tl = threading.local()  # per thread: how deep in our own transactions
        self._rebuild_handle: asyncio.TimerHandle | None = None
        self._rebuilt_at = -REBUILD_GAP
        self.cp_states: dict[bytes, bytes] = {}  # the state of each checkpoint we took, by digest
        self._proposing = False
        self._propose_after = 0.0
        self._cp_calls = Buckets(1.0, 4.0, 1024)  # checkpoint calls each peer may make of us (each may cost a merge)
        self._cp_calls_all = Buckets(2.0, 8.0, 1)  # and all peers together
        self.checkpoints_taken = 0

    # -- opening -----------------------------------------------------------------------------------

    async def load(self) -> None:
        """Take the document back from the store (if any): snapshot, then the log after it."""
        nonce, snap, envs, cps = None, None, [], []
        store = self.svc.store
        if store is not None:
            nonce, snap, envs, cps = await asyncio.wrap_future(store.load(self.doc))
        self.nonce = nonce or os.urandom(8)
        self.client = client_id(self.doc, self.me, self.nonce)
        self.ydoc = pycrdt.Doc(client_id=self.client, allow_multithreading=True)
        self._observing = self.ydoc.observe(self._on_transaction)
        for raw, state in cps:  # (ours: taken before, checked then)
            cp = Checkpoint.from_bytes(raw)
            why, _ = self.state.adopt(cp, state)
            if why:
                log.error("a stored checkpoint could not be taken back", doc=self.name, reason=why)
                continue
            self.cp_states[cp.digest] = state
            if snap is None:
                self._apply(state, learn=True)
        pos = 0
        if snap is not None:
            pos, state, meta = snap
            self.state.restore(meta[0], (e for p, e in envs if p <= pos))
            self.roots.update(meta[1])
            self._apply(state)
        self.log_bytes = sum(e.size for _, e in envs) + sum(len(st) for st in self.cp_states.values())
        rest = [e for p, e in envs if p > pos]
        if rest:
            out = self.state.receive(rest, verified=True)
            for env in out.applied:
                self._apply_env(env)
        if store is not None:
            await asyncio.wrap_future(store.remember(self.doc, self.name, self.owner, self.nonce, clean=False))
        old = self.rt.actors.get(actor_name(self.doc))
        if old is not None:  # (the document was closed a moment ago: its actor is still stopping)
            await old.stop("document reopened")
        self.rt.create(ReplicaActor, [], None, actor_name(self.doc), instance=ReplicaActor(self), public=False)
        pubsub = self.rt.services.get("pubsub")
        if pubsub is not None:
            pubsub.set_validator(self.topic, self._on_message)
            pubsub.subscribe(self.topic, handler=_ignore)
        self._task = self.host.spawn(self._anti_entropy())

    @property
    def chain(self) -> tuple[bytes, bytes]:
        return (self.me, self.nonce)

    @contextlib.contextmanager
    def txn(self) -> Iterator[Any]:
        """A transaction on the document that waits for any other thread's to end (pycrdt's
        ``transaction()`` would join one under way on another thread), or, inside one of ours on
        this thread, that one."""
        assert self.ydoc is not None
        depth = getattr(self._tl, "depth", 0)
        cm = self.ydoc.transaction() if depth else self.ydoc.new_transaction()
        self._tl.depth = depth + 1
        try:
            with cm as t:
                yield t
        finally:
            self._tl.depth = depth

    # -- local changes -------------------------------------------------------------------------------

    def check_writer(self) -> None:
        if self.closed:
            raise CrdtError(f"the document {self.name!r} is closed")
        if self.owner is not None and not self.state.may_write(self.me):
            raise NotAWriter(f"{self.rt.peer_id} is not on the writers list of {self.name!r}")

    def _on_transaction(self, event: Any) -> None:
        """(pycrdt, on the thread that committed) A transaction ended: ours to sign, unless it
        applied a peer's update."""
        if self._applying and threading.get_ident() == self._loop_thread:
            return
        update = event.update
        if len(update) <= 2:  # (a transaction that changed nothing: b"\0\0")
            return
        with self._local_lock:
            self._local.append(update)
            if self._flush_handle is not None:
                return
            self._flush_handle = True
        if threading.get_ident() == self._loop_thread:
            self._flush_handle = self.host.loop.call_soon(self.flush)
        else:
            self.host.loop.call_soon_threadsafe(self.flush)

    def flush(self) -> Envelope | None:
        """Sign what changed locally since the last flush as one envelope, apply, log, publish."""
        with self._local_lock:
            updates, self._local = self._local, []
            self._flush_handle = None
        if not updates or self.closed:
            return None
        update = updates[0] if len(updates) == 1 else pycrdt.merge_updates(*updates)
        seq, prev = self.state.head(self.chain)
        try:
            needs = read_update(update).needs
        except MalformedUpdate as exc:
            needs, why = {}, str(exc)
        else:
            why = ""
        deps = {c: k for c, k in needs.items() if c != self.client}
        if len(deps) > MAX_DEPS and not why:
            why = f"it names items of {len(deps)} other clients (at most {MAX_DEPS})"
        certs = self._certs()
        out = None
        if not why:
            env = sign(self.host.keypair, self.doc, self.nonce, seq + 1, prev, deps, update, certs)
            out = self.state.receive([env], verified=True)
            if not out.applied:
                why = out.refused[0][1] if out.refused else "unknown"
        if why or out is None:
            # the document holds a change no replica would take: it goes (the document is rebuilt
            # from the log), and the next commit() says why
            self._error = UpdateRejected(why, f"a change to {self.name!r} cannot be replicated ({why}); it was undone")
            log.error("local change refused by our own replica; undone", doc=self.name, reason=why)
            self._rebuild()
            return None
        self._after(out, None, local=True)
        self._publish(env)
        return env

    def _certs(self) -> tuple[bytes, ...]:
        """Our mesh certificates, signed into what we sign for a mesh document."""
        trust = self.host.trust
        return tuple(trust.presented) if self.owner is None and not trust.open else ()

    def _publish(self, env: Envelope) -> None:
        pubsub = self.rt.services.get("pubsub")
        raw = env.to_bytes()
        if pubsub is not None and len(raw) + 64 <= pubsub.cfg.max_message_bytes:
            try:
                pubsub.publish(self.topic, raw)
                return
            except (LatticaError, ValueError) as exc:
                log.debug("crdt publish failed; anti-entropy carries it", doc=self.name, error=str(exc))
        for peer in self.peers():
            self.sync_soon(peer)

    # -- peers' envelopes -----------------------------------------------------------------------

    def _on_message(self, msg: Any) -> str:
        """(pub-sub validator) A peer's envelope: applied or held ("accept", passed on),
        already here ("ignore"), or refused."""
        try:
            env = decode_any(msg.data, MAX_BODY)
        except MalformedUpdate:
            self.count_malformed()
            return "reject"
        if not self._rates.take(env.author):
            return "ignore"  # (anti-entropy brings it later)
        out = self.receive([env], msg.via, spread=False)  # (pub-sub carries it to the others)
        if out.refused:
            return "reject" if out.refused[0][1] in _HARD else "ignore"
        return "accept" if out.applied or out.held else "ignore"

    def count_malformed(self, what: str = "envelope") -> None:
        self.refused += 1
        self.state.refused_total["malformed " + what] += 1

    def receive(self, envs: list[Envelope], via: PeerId | None, spread: bool = True) -> Outcome:
        if self.closed:
            return Outcome()
        room = self.cfg.max_document_bytes - self.log_bytes
        fits = []
        for e in envs:
            if e.seq > self.state.head(e.chain)[0] and e.size > room:
                self.refused += 1
                log.warning(
                    "crdt envelope refused: the document is full", doc=self.name, max_bytes=self.cfg.max_document_bytes
                )
                continue
            fits.append(e)
            room -= e.size
        out = self.state.receive(fits)
        self._after(out, via)
        if spread and out.applied:
            self._spread(out.applied, via)
        return out

    def _spread(self, applied: list[Envelope], via: PeerId | None) -> None:
        """Pass envelopes anti-entropy brought on to the replica peers that lack them, as far as
        we know (pub-sub carries only what authors publish: without this, what one side of a
        healed partition learns from the other would wait for the periodic sync)."""
        for peer, known in self._known.items():
            if peer != via and any(known.get(e.chain, 0) < e.seq for e in applied):
                self.sync_soon(peer)

    def heard(self, peer: PeerId, summary: dict, envs: Sequence[Envelope] = ()) -> None:
        """``peer`` holds ``summary``, and ``envs`` besides."""
        known = self._known[peer] = dict(summary)
        for e in envs:
            if known.get(e.chain, 0) < e.seq:
                known[e.chain] = e.seq

    def _after(self, out: Outcome, via: PeerId | None, local: bool = False) -> None:
        for env in out.applied:
            if not local:
                self._apply_env(env)
            self.log_bytes += env.size
            self.applied += 1
            self._emit(Change(PeerId.from_bytes(env.author), env.seq, env.body, local))
        if out.applied:
            self._persist(out.applied)
        for env, why in out.refused:
            self.refused += 1
            log.info(
                "crdt envelope refused",
                doc=self.name,
                author=_short(env.author),
                seq=env.seq,
                reason=why,
                via=via.short() if via else None,
            )
        proof: list[Envelope] = []
        for env, held in out.forks:
            log.warning(
                "crdt author forked its chain: it ends before the fork",
                doc=self.name,
                author=_short(env.author),
                seq=env.seq,
                envelope=env.id.hex()[:16],
                held=held.id.hex()[:16] if held else None,
            )
            proof += [e for e in (held, env) if e is not None]
        if proof:
            for peer in self.peers():  # (each replica sees both and ends the chain too; later ones get them in syncs)
                if peer != via:
                    self.host.spawn(self._tell(peer, proof[:MAX_PUSH]))
        if out.rebuild:
            self._rebuild_soon()
        if out.held and via is not None:
            self.sync_soon(via)
        if out.applied:
            self._maybe_checkpoint()

    def _emit(self, change: Change) -> None:
        for cb in list(self._observers):
            try:
                cb(change)
            except Exception:
                log.exception("crdt observer failed", doc=self.name)
        for sub in self._changes:
            # a Subscription queues whatever it is given (typed for pubsub's Message): here crdt Changes
            sub._push(cast(Any, change), len(change.update))

    async def _tell(self, peer: PeerId, envs: list[Envelope]) -> None:
        try:
            await self.rt.call(_ref(peer, self.doc), "push", ([e.to_bytes() for e in envs],), {}, timeout=10.0)
        except LatticaError as exc:
            log.debug("crdt fork proof not delivered", doc=self.name, peer=peer.short(), error=str(exc))

    def _rebuild_soon(self) -> None:
        """Rebuild now, or (after a rebuild less than REBUILD_GAP ago) once that much time has
        passed: forks cannot buy a rebuild per envelope."""
        if self._rebuild_handle is not None:
            return
        wait = self._rebuilt_at + REBUILD_GAP - time.monotonic()
        if wait <= 0:
            self._rebuild()
        else:
            self._rebuild_handle = self.host.loop.call_later(wait, self._rebuild)

    def _rebuild(self) -> None:
        """Make the document again from the log, under what is known now (a fork, a writer cut
        off, a local change no replica would take): what no longer counts goes."""
        if self._rebuild_handle is not None:
            self._rebuild_handle.cancel()
            self._rebuild_handle = None
        if self.closed:
            return
        self._rebuilt_at = time.monotonic()
        had = self.state.head(self.chain)[0]
        new, out = self.state.rebuilt()
        if new.head(self.chain)[0] < had:
            # our own chain lost envelopes we signed: going on from its head would sign a second
            # envelope for a place (a fork of our own): write under a new chain from here
            self.nonce = os.urandom(8)
            self.client = client_id(self.doc, self.me, self.nonce)
            if self.svc.store is not None:
                self.svc.store.remember(self.doc, self.name, self.owner, self.nonce, clean=False).add_done_callback(
                    _logged_failure
                )
        ydoc: pycrdt.Doc = pycrdt.Doc(client_id=self.client, allow_multithreading=True)
        # the checkpoints' states first (the replay starts from them), then the log after them
        for update in self._states() + [e.body for e in out.applied if e.kind != ACL]:
            try:
                ydoc.apply_update(update)
            except BaseException as exc:  # (yrs panics are BaseExceptions)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                log.error("pycrdt could not apply a logged update while rebuilding", doc=self.name, error=repr(exc))
        with self._local_lock:
            self._local = []  # (made on the old document)
        old, self.ydoc, self.state = self.ydoc, ydoc, new
        if old is not None and self._observing is not None:
            old.unobserve(self._observing)  # (roots taken from it before are dead: their changes go nowhere)
        self._observing = ydoc.observe(self._on_transaction)
        self.log_bytes = sum(e.size for e in out.applied) + sum(len(st) for st in self.cp_states.values())
        self.rebuilds += 1
        log.warning("crdt document rebuilt from its log", doc=self.name, applied=len(out.applied))
        self.snapshot()
        self._emit(Change(self.rt.peer_id, 0, b"", False, rebuilt=True))
        del old
        return None

    def _apply_env(self, env: Envelope) -> None:
        if env.kind != ACL:
            self._apply(env.body, learn=True)

    def _learn_roots(self, update: bytes) -> None:
        """Note the root types ``update`` writes into (``to_py`` reports them)."""
        try:
            for root, kind in read_update(update).roots.items():
                if root not in self._declared and len(self.roots) < 1024:
                    have = self.roots.get(root)
                    self.roots[root] = kind if have is None or (have == "array" and kind == "text") else have
        except MalformedUpdate:  # (the rules read it already)
            pass

    def _apply(self, update: bytes, learn: bool = False) -> None:
        assert self.ydoc is not None
        if learn:
            self._learn_roots(update)
        self._applying = True
        try:
            with self.txn():
                self.ydoc.apply_update(update)
        except BaseException as exc:  # pycrdt raises a PanicException (a BaseException) on what yrs cannot take
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            log.error("pycrdt could not apply an update the rules accepted", doc=self.name, error=repr(exc))
        finally:
            self._applying = False

    def _persist(self, envs: list[Envelope]) -> None:
        store = self.svc.store
        if store is None:
            return
        self._durable = asyncio.wrap_future(store.append(self.doc, envs))
        self._durable.add_done_callback(_logged_failure)
        self._since_snapshot += len(envs)
        if self._since_snapshot >= self.cfg.snapshot_every:
            self.snapshot()

    def snapshot(self) -> None:
        """Record the document's state now, so reopening it replays only what comes after."""
        store = self.svc.store
        if store is None or self.ydoc is None:
            return
        self._since_snapshot = 0
        with self.txn():
            state = self.ydoc.get_update()
        store.snapshot(self.doc, state, [self.state.export(), self.roots]).add_done_callback(_logged_failure)

    # -- checkpoints ------------------------------------------------------------------------------

    def _states(self) -> list[bytes]:
        """The states of the checkpoints we hold, in the order the rules hold them."""
        return [self.cp_states[cp.digest] for cp in self.state.checkpoints]

    def _maybe_checkpoint(self) -> None:
        """Propose a checkpoint once the log holds ``compact_every`` envelopes, if it falls to
        us: the owner (an owner document), else the replica with the lowest PeerId among those
        we meet (one proposer at a time, not one per replica)."""
        every = self.cfg.compact_every
        if not every or self._proposing or len(self.state.log) < every or time.monotonic() < self._propose_after:
            return
        if self.owner is not None:
            if self.owner != self.me:
                return
        else:
            peers = self.peers()
            if self.cfg.checkpoint_quorum > 1 and not peers:
                return
            # the lowest proposes at compact_every; should it not (gone, or hostile), the next at
            # twice that, every other at three times (checkpoints made apart are taken alike)
            rank = min(sum(1 for p in peers if p.to_bytes() < self.me), 2)
            if len(self.state.log) < every * (1 + rank):
                return
        self._proposing = True
        self.host.spawn(self._checkpoint_round())

    async def _checkpoint_round(self) -> None:
        try:
            await self._propose()
        except Exception as exc:  # (whatever a peer's answer did: back off, never retry at once)
            log.info("crdt checkpoint round failed", doc=self.name, error=repr(exc))
            self._propose_after = time.monotonic() + 30.0
        finally:
            self._proposing = False

    async def _propose(self) -> None:
        peers = self.peers()
        random.shuffle(peers)
        # first what they hold and we lack (and their checkpoints): the proposal covers it
        await asyncio.gather(*(self.sync_with(p) for p in peers), return_exceptions=True)
        if self.closed:
            return
        made = self.state.propose(self._states())
        if made is None:
            self._propose_after = time.monotonic() + REBUILD_GAP
            return
        cp, canon = made
        if len(canon) > MAX_STATE:
            log.warning("crdt document too large to checkpoint", doc=self.name, state_bytes=len(canon))
            self._propose_after = time.monotonic() + 600.0
            return
        cp = cp.signed(self.host.keypair, self._certs())
        for peer in peers:
            if self._settled(cp):
                break
            try:
                await self.sync_with(peer)  # (it holds what we hold: it can check the checkpoint)
                answer = await self.rt.call(_ref(peer, self.doc), "checkpoint", (cp.to_bytes(), None), {}, timeout=10.0)
            except LatticaError as exc:
                log.debug("crdt checkpoint not signed by a peer", doc=self.name, peer=peer.short(), error=str(exc))
                continue
            # (its own signature only, and only one that verifies: junk cannot fill the slots)
            theirs = [sig for sig in _parse_signatures(answer) if sig.signer == peer.to_bytes()]
            if theirs and Checkpoint(cp.doc, cp.heads, cp.state_hash, tuple(theirs[:1])).valid_signatures():
                cp = cp.with_signatures(theirs[:1])
        if self.closed:
            return
        if not self._settled(cp):
            self._propose_after = time.monotonic() + 30.0
            log.info("crdt checkpoint not signed by enough members yet", doc=self.name, signatures=len(cp.signatures))
            return
        why = self._take_checked(cp, None)
        if why:
            log.info("crdt checkpoint not taken", doc=self.name, reason=why)
            return
        for peer in self.peers():
            self.host.spawn(self._announce(peer, cp))

    async def _announce(self, peer: PeerId, cp: Checkpoint) -> None:
        try:
            await self.rt.call(_ref(peer, self.doc), "checkpoint", (cp.to_bytes(), None), {}, timeout=10.0)
        except LatticaError as exc:
            log.debug("crdt checkpoint not announced", doc=self.name, peer=peer.short(), error=str(exc))

    def _settled(self, cp: Checkpoint) -> bool:
        """Whether ``cp`` carries the signatures a replica that cannot check it needs: the
        owner's (an owner document), else ``checkpoint_quorum`` members'."""
        sigs = cp.valid_signatures()
        if self.owner is not None:
            return any(s.signer == self.owner for s in sigs)
        members = sum(1 for s in sigs if self._member_at(s.signer, s.certs, s.ts))
        return members >= max(1, self.cfg.checkpoint_quorum)

    def _take_checked(self, cp: Checkpoint, state: bytes | None, via: PeerId | None = None) -> str:
        """Take ``cp`` (settled): checked against our own log if we hold what it covers, else,
        with its ``state``, on its signatures. Why not ("" if taken)."""
        if any(cp.digest == have.digest for have in self.state.checkpoints):
            return ""
        if self.state.superseded(cp):
            return ""
        why, canon = self.state.check(cp, self._states())
        if why in ("it disagrees with an envelope we hold", "it covers a forked chain past its end"):
            # its author forked and the checkpoint, settled, names the other branch: that one
            # counts (the replicas that took it hold nothing else): ours goes, and the document
            # is rebuilt without it before the checkpoint is taken
            if self.state.disagreeing(cp) and time.monotonic() - self._rebuilt_at < REBUILD_GAP:
                return "a rebuild was made less than a second ago"  # (offered again by a later sync)
            if self.state.yield_to(cp):
                self._rebuild()
            why = "we do not hold everything it covers"  # (the branch it names: taken on its signatures)
        merge = False
        if why == "we do not hold everything it covers" and state is not None:
            seq = next((s for a, n, s, _ in cp.heads if (a, n) == self.chain), 0)
            if seq > self.state.head(self.chain)[0]:
                return "it covers more of our own chain than we signed"
            canon, merge, why = state, True, ""
        if why:
            return why
        old = {c.digest for c in self.state.checkpoints}
        why, out = self.state.adopt(cp, canon)
        if why:
            return why
        self.cp_states = {c.digest: self.cp_states.get(c.digest, canon) for c in self.state.checkpoints}
        if merge:
            self._apply(canon, learn=True)  # (Yjs merges: what we held and what it holds)
        self.checkpoints_taken += 1
        self.log_bytes = sum(e.size for e in self.state.log.all()) + sum(len(st) for st in self.cp_states.values())
        store = self.svc.store
        if store is not None and self.ydoc is not None:
            self._since_snapshot = 0
            with self.txn():
                snap = self.ydoc.get_update()
            dropped = list(old - set(self.cp_states))
            store.compact(
                self.doc,
                cp.to_bytes(),
                cp.digest,
                canon,
                dict(self.state.base),
                dropped,
                (snap, [self.state.export(), self.roots]),
            ).add_done_callback(_logged_failure)
        log.info(
            "crdt checkpoint taken",
            doc=self.name,
            chains=len(cp.heads),
            state_bytes=len(canon),
            log_envelopes=len(self.state.log),
            checked=not merge,
        )
        self._after(out, via)
        return ""

    def _from_peer(self, cp: Checkpoint, state: bytes | None, via: PeerId | None) -> str:
        """A settled checkpoint a peer gave: take it (or fetch its state by a sync if we cannot
        check it without). Why not ("" if taken)."""
        if any(cp.digest == have.digest for have in self.state.checkpoints):
            return ""
        if not self._settled(cp):
            why = "checkpoint without the signatures it needs"
        else:
            why = self._take_checked(cp, state, via)
            if why == "we do not hold everything it covers":
                if via is not None:
                    self.sync_soon(via)  # (its answer brings the checkpoint's state)
                return why
        if why:
            self.refused += 1
            self.state.refused_total["checkpoint: " + why] += 1
            log.info("crdt checkpoint refused", doc=self.name, reason=why, via=via.short() if via else None)
        return why

    # -- anti-entropy -------------------------------------------------------------------------------

    def peers(self) -> list[PeerId]:
        """The peers known to hold a replica (they joined the document's topic)."""
        pubsub = self.rt.services.get("pubsub")
        if pubsub is None or not pubsub.routing:
            return []
        return [p for p in pubsub.router.topics.get(self.topic, ()) if isinstance(p, PeerId)]

    def summary_wire(self) -> list:
        """Per chain: author, nonce, seq held and the first bytes of that envelope's id (equal
        seqs under different ids are a fork that the seqs alone would hide)."""
        return [[a, n, seq, i[:HEAD_ID]] for (a, n), (seq, i) in self.state.heads.items()]

    def sync_soon(self, peer: PeerId) -> None:
        if self.closed:
            return
        if peer in self._syncing:
            self._again.add(peer)  # (what made us want it may have come after that sync's question)
            return
        self._syncing[peer] = self.host.spawn(self._sync_task(peer))

    async def _sync_task(self, peer: PeerId) -> None:
        try:
            for _ in range(8):
                self._again.discard(peer)
                await self.sync_with(peer)
                if peer not in self._again:
                    break
        except LatticaError as exc:
            log.debug("crdt anti-entropy failed", doc=self.name, peer=peer.short(), error=str(exc))
        finally:
            self._syncing.pop(peer, None)
            self._again.discard(peer)

    async def sync_with(self, peer: PeerId, timeout: float = 10.0) -> dict:
        """Exchange what we hold with ``peer``'s replica until neither lacks anything of the
        other's (as far as a round shows); its summary."""
        ref = _ref(peer, self.doc)
        for _ in range(16):  # pages of at most PAGE_BYTES each way
            answer = await self.rt.call(ref, "sync", (self.summary_wire(),), {}, timeout=timeout)
            ids: dict = {}
            theirs, envs, given = _parse_answer(answer, ids)
            self.heard(peer, theirs)
            for cp, state in given:  # (we lack what it dropped for them: they come first)
                self._from_peer(cp, state, peer)
            if envs:
                self.receive(envs, peer)
            theirs = await self._push_missing(ref, theirs, timeout, ids)
            self.heard(peer, theirs)
            if not given and len(envs) < MAX_PUSH and sum(e.size for e in envs) < PAGE_BYTES:
                self._synced.add(peer)
                return theirs
        return theirs

    async def _push_missing(self, ref: ActorRef, theirs: dict, timeout: float, ids: dict | None = None) -> dict:
        for cp in self.state.checkpoints_for(theirs)[:MAX_CHECKPOINTS_SENT]:  # (it lacks what we dropped for them)
            answer = await self.rt.call(
                ref, "checkpoint", (cp.to_bytes(), self.cp_states[cp.digest]), {}, timeout=timeout
            )
            theirs = _parse_summary(answer[1] if type(answer) is list and len(answer) == 2 else None)
        # it holds chains we ended past their end (it should end them too), or another envelope
        # than ours at a head: it should see the fork
        proofs = self.state.proofs_for(theirs) + self.state.differing(theirs, ids or {})
        for _ in range(16):
            missing = (proofs + self.state.missing_for(theirs, PAGE_BYTES))[:MAX_PUSH]
            proofs = []
            if not missing:
                break
            answer = await self.rt.call(ref, "push", ([e.to_bytes() for e in missing],), {}, timeout=timeout)
            after = _parse_summary(answer)
            if not any(after.get(e.chain, 0) >= e.seq for e in missing):
                break  # it took none of them (refused, or waiting on what we do not hold): stop rather than loop
            theirs = after
        return theirs

    async def _anti_entropy(self) -> None:
        """Sync with every new replica peer as it appears, and with a random one every
        ``sync_interval`` seconds."""
        last = time.monotonic()
        tick = 0.1
        while not self.closed:
            await asyncio.sleep(tick)
            tick = min(0.2, tick * 1.5)
            peers = self.peers()
            here = set(peers)
            self._synced &= here  # (one that left and comes back is synced with again)
            for gone in [p for p in self._known if p not in here]:
                del self._known[gone]
            for p in peers:
                if p not in self._synced:
                    self.sync_soon(p)
            if peers and time.monotonic() - last >= self.cfg.sync_interval:
                last = time.monotonic()
                self.sync_soon(random.choice(peers))
            self._maybe_checkpoint()

    async def commit(self, replicas: int, timeout: float) -> int:
        """Flush, wait until our changes are durable here and held by ``replicas`` other
        replicas; how many confirmed."""
        self.flush()
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if self._durable is not None:
            await asyncio.shield(self._durable)
        if replicas <= 0:
            return 0
        seq = self.state.head(self.chain)[0]
        deadline = time.monotonic() + timeout
        confirmed: set[PeerId] = set()
        while True:
            todo = [p for p in self.peers() if p not in confirmed]
            if todo:
                left = max(0.1, deadline - time.monotonic())
                results = await asyncio.gather(*(self.sync_with(p, timeout=left) for p in todo), return_exceptions=True)
                for p, r in zip(todo, results):
                    if isinstance(r, dict) and (seq == 0 or r.get(self.chain, 0) >= seq):
                        confirmed.add(p)
            if len(confirmed) >= replicas:
                return len(confirmed)
            if time.monotonic() >= deadline:
                raise Timeout(
                    f"{len(confirmed)} of {replicas} replicas of {self.name!r} confirmed the change within {timeout} s"
                )
            await asyncio.sleep(0.05)

    # -- the owner's list ------------------------------------------------------------------------

    def set_writers(self, writers: list[PeerId]) -> None:
        """(owner) Sign a new writers list; removed writers keep what we hold of theirs."""
        if self.owner != self.me:
            raise NotAWriter(f"only the owner of {self.name!r} changes its writers")
        new = frozenset(w.to_bytes() for w in writers) - {self.me}
        old = self.state.acl
        if new == old.writers and self.state.acl_version:
            return
        cuts = dict(old.cuts)
        for chain, (seq, _) in self.state.heads.items():
            if chain[1] and chain[0] in old.writers and chain[0] not in new:
                cuts[chain] = seq
        version, prev = self.state.head((self.me, b""))
        env = sign_acl(self.host.keypair, self.doc, version + 1, prev, Acl(new, cuts))
        out = self.state.receive([env], verified=True)
        self._after(out, None, local=True)
        self._publish(env)

    # -- reading -------------------------------------------------------------------------------------

    def root(self, name: str, kind: str) -> Any:
        """The root ``name`` as a ``kind`` (what this node's code says it is wins over what the
        updates suggested; pycrdt raises if the document holds it as another type)."""
        assert self.ydoc is not None
        self._declared.add(name)
        self.roots[name] = kind
        with self.txn():
            return self.ydoc.get(name, type=_TYPES[kind])

    def to_py(self) -> dict:
        assert self.ydoc is not None
        out = {}
        with self.txn():
            for name, kind in sorted(self.roots.items()):
                try:
                    out[name] = self.ydoc.get(name, type=_TYPES[kind]).to_py()
                except Exception:  # (a root whose type the updates suggested wrongly)
                    continue
        return out

    def stats(self) -> dict:
        return {
            "name": self.name,
            "id": self.doc.hex(),
            "applied": self.applied,
            "refused": self.refused,
            "refused_by_reason": dict(self.state.refused_total),
            "forks": len(self.state.forks),
            "held": self.state.held(),
            "chains": len(self.state.heads),
            "log_bytes": self.log_bytes,
            "peers": len(self.peers()),
            "acl_version": self.state.acl_version,
            "rebuilds": self.rebuilds,
            "log_envelopes": len(self.state.log),
            "checkpoints": len(self.state.checkpoints),
            "checkpoints_taken": self.checkpoints_taken,
        }

    def _is_member(self, env: Envelope) -> bool:
        """(mesh documents) Whether the author was a member of our mesh when it signed."""
        return self._member_at(env.author, env.certs, env.ts)

    def _member_at(self, who: bytes, certs: tuple[bytes, ...], ts: int) -> bool:
        """Whether ``who`` was a member of our mesh at ``ts`` (ms), by ``certs``."""
        if who == self.me:
            return True
        trust = self.host.trust
        if trust.open:
            return True
        if ts > (time.time() + 60) * 1000:
            return False  # signed in the future: a certificate's window cannot be stretched that way
        try:
            verdict = trust.judge(PeerId.from_bytes(who), list(certs), ts / 1000)
        except LatticaError:
            return False
        return verdict.circle != "stranger"

    def close(self) -> None:
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self._task is not None:
            self._task.cancel()
        if self._rebuild_handle is not None:
            self._rebuild_handle.cancel()
        for t in self._syncing.values():
            t.cancel()
        pubsub = self.rt.services.get("pubsub")
        if pubsub is not None and not pubsub.closed:
            pubsub.unsubscribe(self.topic, _ignore)
            pubsub.set_validator(self.topic, None)
        for sub in self._changes:
            sub._end()
        self.snapshot()
        if self.svc.store is not None:  # (after everything we signed is written: the chain may go on next time)
            self.svc.store.remember(self.doc, self.name, self.owner, self.nonce, clean=True).add_done_callback(
                _logged_failure
            )
        actor = self.rt.actors.get(actor_name(self.doc))
        if actor is not None:
            self.host.spawn(actor.stop("document closed"))


class ReplicaActor:
    """What a document's other replicas call (members only): ``sync`` and ``push``."""

    def __init__(self, replica: Replica) -> None:
        self._r = replica

    async def sync(self, summary: list) -> list:
        """``summary``: what the caller holds per chain. Answers ours, and the envelopes the
        caller lacks (a page of them: it calls again until a short page)."""
        ids: dict = {}
        theirs = _parse_summary(summary, ids)
        r = self._r
        caller = current_caller()
        if caller is not None and not r._sync_calls.take(caller):
            raise PermissionDenied(f"{caller} asks {r.rt.peer_id} to sync {r.name!r} too often")
        if caller is not None and r._sync_bytes.wait(caller) > 0:
            raise PermissionDenied(f"{caller} had {r.rt.peer_id} send more of {r.name!r} than it sends a peer a second")
        missing = (
            r.state.proofs_for(theirs) + r.state.differing(theirs, ids) + r.state.missing_for(theirs, PAGE_BYTES)
        )[:MAX_PUSH]
        given = [
            [cp.to_bytes(), r.cp_states[cp.digest]] for cp in r.state.checkpoints_for(theirs)[:MAX_CHECKPOINTS_SENT]
        ]
        if caller is not None:  # (into debt: the next answer waits until it is paid off)
            r._sync_bytes.take(caller, sum(e.size for e in missing) + sum(len(g[1]) for g in given), force=True)
        if caller is not None and caller != r.rt.peer_id:
            r._synced.add(caller)  # (it syncs with us: we need not start one of our own)
            r.heard(caller, theirs, missing)
            if any(r.state.head(c)[0] < s for c, s in theirs.items()):
                r.sync_soon(caller)  # it holds what we lack: push it here
        return [r.summary_wire(), [e.to_bytes() for e in missing], given]

    async def push(self, envs: list) -> list:
        """Envelopes the caller found we lack; answers what we hold afterwards."""
        if type(envs) is not list or len(envs) > MAX_PUSH:
            raise ProtocolError(f"a push is a list of at most {MAX_PUSH} envelopes")
        r = self._r
        caller = current_caller()
        if caller is not None and not r._sync_calls.take(caller):
            raise PermissionDenied(f"{caller} pushes to {r.rt.peer_id}'s {r.name!r} too often")
        decoded = []
        for raw in envs:
            try:
                decoded.append(decode_any(raw, MAX_BODY))
            except MalformedUpdate:
                r.count_malformed()
        if caller is not None and caller in r._known:
            r.heard(caller, r._known[caller], decoded)
        r.receive(decoded, caller)
        return r.summary_wire()

    async def checkpoint(self, raw: Any, state: Any = None) -> list:
        """A checkpoint: proposed (``state`` None, not yet settled: we check it against our log
        and answer our signature if it is right), or settled (we take it; ``state`` for a replica
        that lacks what it covers). Answers ``[our signatures, our summary]``."""
        r = self._r
        caller = current_caller()
        if caller is not None and not (r._cp_calls.take(caller) and r._cp_calls_all.take()):
            raise PermissionDenied(f"{caller} sends {r.rt.peer_id} checkpoints of {r.name!r} too often")
        if type(state) is memoryview:  # (large bytes arrive out of band, as a view)
            state = state.tobytes()
        if state is not None and (type(state) is not bytes or len(state) > MAX_STATE):
            raise ProtocolError(f"a checkpoint's state is bytes, at most {MAX_STATE}")
        try:
            cp = Checkpoint.from_bytes(raw)
        except MalformedUpdate as exc:
            r.count_malformed("checkpoint")
            raise ProtocolError(str(exc)) from None
        if cp.doc != r.doc:
            raise ProtocolError("a checkpoint of another document")
        mine: list = []
        wrong = r.state.disagreeing(cp)
        if wrong and caller is not None:  # (its author signed two envelopes for one place: show the caller ours)
            r.host.spawn(r._tell(caller, wrong[:MAX_PUSH]))
        if state is None and not r._settled(cp):
            why, _ = r.state.check(cp, r._states())
            if not why:
                mine = [
                    [s.signer, s.ts, list(s.certs), s.sig]
                    for s in cp.signed(r.host.keypair, r._certs()).signatures
                    if s.signer == r.me
                ]
            elif why == "we do not hold everything it covers" and caller is not None:
                r.sync_soon(caller)
        else:
            r._from_peer(cp, state, caller)
        return [mine, r.summary_wire()]


def _parse_summary(raw: Any, ids: dict | None = None) -> dict:
    """Seq per chain; ``ids`` (given) gets the heads' id prefixes."""
    if type(raw) is not list or len(raw) > MAX_SUMMARY:
        raise ProtocolError(f"a replica's summary is a list of at most {MAX_SUMMARY} chains")
    out = {}
    for item in raw:
        if (
            type(item) is not list
            or len(item) not in (3, 4)
            or type(item[0]) is not bytes
            or type(item[1]) is not bytes
            or type(item[2]) is not int
            or not 0 <= item[2] < 1 << 63
            or len(item[0]) > 64
            or len(item[1]) > 16
            or (len(item) == 4 and (type(item[3]) is not bytes or not 0 < len(item[3]) <= 32))
        ):
            raise ProtocolError("a summary's entry is [author, nonce, seq, head id prefix]")
        out[(item[0], item[1])] = item[2]
        if ids is not None and len(item) == 4:
            ids[(item[0], item[1])] = item[3]
    return out


def _parse_answer(raw: Any, ids: dict | None = None) -> tuple[dict, list[Envelope], list[tuple[Checkpoint, bytes]]]:
    if (
        type(raw) is not list
        or len(raw) != 3
        or type(raw[1]) is not list
        or len(raw[1]) > MAX_PUSH
        or type(raw[2]) is not list
        or len(raw[2]) > MAX_CHECKPOINTS_SENT
    ):
        raise ProtocolError("a sync answer is [summary, envelopes, checkpoints]")
    envs = []
    for item in raw[1]:
        try:
            envs.append(decode_any(item, MAX_BODY))
        except MalformedUpdate:
            continue
    given = []
    for item in raw[2]:
        state = item[1] if type(item) is list and len(item) == 2 else None
        if type(state) is memoryview:  # (large bytes arrive out of band, as a view)
            state = state.tobytes()
        if type(state) is not bytes or len(state) > MAX_STATE:
            raise ProtocolError("a sync answer's checkpoint is [checkpoint, state]")
        try:
            given.append((Checkpoint.from_bytes(item[0]), state))
        except MalformedUpdate as exc:
            raise ProtocolError(str(exc)) from None
    return _parse_summary(raw[0], ids), envs, given


def _parse_signatures(raw: Any) -> list[Signature]:
    """Signatures a peer answered a proposal with (checked later, with the checkpoint's)."""
    if type(raw) is not list or len(raw) != 2 or type(raw[0]) is not list or len(raw[0]) > MAX_SIGNATURES:
        raise ProtocolError("a checkpoint answer is [signatures, summary]")
    out = []
    for s in raw[0]:
        if (
            type(s) is not list
            or len(s) != 4
            or type(s[0]) is not bytes
            or not 0 < len(s[0]) <= MAX_AUTHOR
            or type(s[1]) is not int
            or not 0 <= s[1] < 1 << 63
            or type(s[2]) is not list
            or len(s[2]) > MAX_CERTS
            or not all(type(c) is bytes and 0 < len(c) <= MAX_CERT for c in s[2])
            or type(s[3]) is not bytes
            or len(s[3]) != 64
        ):
            raise ProtocolError("a checkpoint signature is [signer, time, certificates, signature]")
        out.append(Signature(s[0], s[1], tuple(s[2]), s[3]))
    return out


def _short(author: bytes) -> str:
    try:
        return PeerId.from_bytes(author).short()
    except LatticaError:
        return author[:8].hex()


def _ignore(msg: Any) -> None:
    """(the topic's subscription: the validator did the work)"""


def _logged_failure(fut: Any) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("crdt store write failed", error=repr(fut.exception()))
