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

The replica's parts, each a module of this package: ``sync`` (anti-entropy), ``checkpoints``
(proposing and taking checkpoints), ``storage`` (the store), ``actor`` (what peers call), and
``wire`` (what replicas exchange); the rules and the policy without I/O are in lattica/crdt/.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import pycrdt

from lattica._budget import Buckets
from lattica._identity import PeerId
from lattica.actors.crdt.actor import ReplicaActor
from lattica.actors.crdt.checkpoints import Checkpoints
from lattica.actors.crdt.storage import Storage
from lattica.actors.crdt.sync import AntiEntropy
from lattica.actors.crdt.wire import MAX_BODY, MAX_PUSH, actor_name, replica_ref, topic_of
from lattica.crdt._checkpoint import Checkpoint
from lattica.crdt._envelope import ACL, MAX_DEPS, Acl, Envelope, client_id, decode_any, sign, sign_acl
from lattica.crdt._replica import REBUILD_GAP, MemoryLog, Outcome, ReplicaState, gossip_verdict
from lattica.crdt._yupdate import read_update
from lattica.errors import CrdtError, LatticaError, MalformedUpdate, NotAWriter, Timeout, UpdateRejected
from lattica.logging import get_logger
from lattica.pubsub._subscription import Subscription

if TYPE_CHECKING:
    from lattica.actors.crdt.service import CrdtService

__all__ = ["Replica", "Change"]

log = get_logger("lattica.crdt")

SYNC_BYTES_RATE = 16 << 20  # bytes a second our sync answers send one peer on average
SYNC_BYTES_BURST = 64 << 20  # (a checkpoint's state, up to 48 MiB, goes in one answer)
_TYPES = {"map": pycrdt.Map, "array": pycrdt.Array, "text": pycrdt.Text}


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
        self.observers: list[Callable[[Change], Any]] = []
        self._changes: list[Subscription] = []
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
        self.rebuilt_at = -REBUILD_GAP  # (time.monotonic() of the last rebuild)
        self.cp_states: dict[bytes, bytes] = {}  # the state of each checkpoint we took, by digest
        self._cp_calls = Buckets(1.0, 4.0, 1024)  # checkpoint calls each peer may make of us (each may cost a merge)
        self._cp_calls_all = Buckets(2.0, 8.0, 1)  # and all peers together
        self.checkpoints_taken = 0
        self.storage = Storage(self)
        self.anti_entropy = AntiEntropy(self)
        self.checkpoints = Checkpoints(self)

    # -- opening -----------------------------------------------------------------------------------

    async def load(self) -> None:
        """Take the document back from the store (if any): snapshot, then the log after it."""
        nonce, snap, envs, cps = await self.storage.load()
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
                self.apply_update(state, learn=True)
        pos = 0
        if snap is not None:
            pos, state, meta = snap
            self.state.restore(meta[0], (e for p, e in envs if p <= pos))
            self.roots.update(meta[1])
            self.apply_update(state)
        self.log_bytes = sum(e.size for _, e in envs) + sum(len(st) for st in self.cp_states.values())
        rest = [e for p, e in envs if p > pos]
        if rest:
            out = self.state.receive(rest, verified=True)
            for env in out.applied:
                self._apply_env(env)
        await self.storage.remember(clean=False)
        old = self.rt.actors.get(actor_name(self.doc))
        if old is not None:  # (the document was closed a moment ago: its actor is still stopping)
            await old.stop("document reopened")
        self.rt.create(ReplicaActor, [], None, actor_name(self.doc), instance=ReplicaActor(self), public=False)
        pubsub = self.svc.pubsub
        if pubsub is not None:
            pubsub.set_validator(self.topic, self._on_message)
            pubsub.subscribe(self.topic, handler=_ignore)
        self.anti_entropy.start()

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
        certs = self.certs()
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
            self.rebuild()
            return None
        self.act_on(out, None, local=True)
        self._publish(env)
        return env

    def certs(self) -> tuple[bytes, ...]:
        """Our mesh certificates, signed into what we sign for a mesh document."""
        trust = self.host.trust
        return tuple(trust.presented) if self.owner is None and not trust.open else ()

    def _publish(self, env: Envelope) -> None:
        pubsub = self.svc.pubsub
        raw = env.to_bytes()
        if pubsub is not None and len(raw) + 64 <= pubsub.cfg.max_message_bytes:
            try:
                pubsub.publish(self.topic, raw)
                return
            except (LatticaError, ValueError) as exc:
                log.debug("crdt publish failed; anti-entropy carries it", doc=self.name, error=str(exc))
        for peer in self.peers():
            self.anti_entropy.sync_soon(peer)

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
        return gossip_verdict(self.receive([env], msg.via, spread=False))  # (pub-sub carries it to the others)

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
        self.act_on(out, via)
        if spread and out.applied:
            # (pub-sub carries only what authors publish: without this, what one side of a healed
            # partition learns from the other would wait for the periodic sync)
            self.anti_entropy.spread(out.applied, via)
        return out

    def act_on(self, out: Outcome, via: PeerId | None, local: bool = False) -> None:
        """Do what feeding envelopes to the rules says: apply (unless ``local``: already in the
        document), log and emit what was applied, pass fork proofs on, rebuild, fetch what an
        envelope waits for, and propose a checkpoint when one is due."""
        for env in out.applied:
            if not local:
                self._apply_env(env)
            self.log_bytes += env.size
            self.applied += 1
            self._emit(Change(PeerId.from_bytes(env.author), env.seq, env.body, local))
        if out.applied:
            self.storage.append(out.applied)
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
                    self.host.spawn(self.tell(peer, proof[:MAX_PUSH]))
        if out.rebuild:
            self._rebuild_soon()
        if out.held and via is not None:
            self.anti_entropy.sync_soon(via)
        if out.applied:
            self.checkpoints.maybe_propose()

    def _emit(self, change: Change) -> None:
        for cb in list(self.observers):
            try:
                cb(change)
            except Exception:
                log.exception("crdt observer failed", doc=self.name)
        for sub in self._changes:
            # a Subscription queues whatever it is given (typed for pubsub's Message): here crdt Changes
            sub._push(cast(Any, change), len(change.update))

    async def tell(self, peer: PeerId, envs: list[Envelope]) -> None:
        """Push ``envs`` (a fork's proof) to ``peer``'s replica."""
        try:
            await self.rt.call(replica_ref(peer, self.doc), "push", ([e.to_bytes() for e in envs],), {}, timeout=10.0)
        except LatticaError as exc:
            log.debug("crdt fork proof not delivered", doc=self.name, peer=peer.short(), error=str(exc))

    def _rebuild_soon(self) -> None:
        """Rebuild now, or (after a rebuild less than REBUILD_GAP ago) once that much time has
        passed: forks cannot buy a rebuild per envelope."""
        if self._rebuild_handle is not None:
            return
        wait = self.rebuilt_at + REBUILD_GAP - time.monotonic()
        if wait <= 0:
            self.rebuild()
        else:
            self._rebuild_handle = self.host.loop.call_later(wait, self.rebuild)

    def rebuild(self) -> None:
        """Make the document again from the log, under what is known now (a fork, a writer cut
        off, a local change no replica would take): what no longer counts goes."""
        if self._rebuild_handle is not None:
            self._rebuild_handle.cancel()
            self._rebuild_handle = None
        if self.closed:
            return
        self.rebuilt_at = time.monotonic()
        had = self.state.head(self.chain)[0]
        new, out = self.state.rebuilt()
        if new.head(self.chain)[0] < had:
            # our own chain lost envelopes we signed: going on from its head would sign a second
            # envelope for a place (a fork of our own): write under a new chain from here
            self.nonce = os.urandom(8)
            self.client = client_id(self.doc, self.me, self.nonce)
            self.storage.remember_soon(clean=False)
        ydoc: pycrdt.Doc = pycrdt.Doc(client_id=self.client, allow_multithreading=True)
        # the checkpoints' states first (the replay starts from them), then the log after them
        for update in self.checkpoints.states() + [e.body for e in out.applied if e.kind != ACL]:
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
        self.storage.snapshot()
        self._emit(Change(self.rt.peer_id, 0, b"", False, rebuilt=True))
        del old
        return None

    def _apply_env(self, env: Envelope) -> None:
        if env.kind != ACL:
            self.apply_update(env.body, learn=True)

    def _learn_roots(self, update: bytes) -> None:
        """Note the root types ``update`` writes into (``to_py`` reports them)."""
        try:
            for root, kind in read_update(update).roots.items():
                if root not in self._declared and len(self.roots) < 1024:
                    have = self.roots.get(root)
                    self.roots[root] = kind if have is None or (have == "array" and kind == "text") else have
        except MalformedUpdate:  # (the rules read it already)
            pass

    def apply_update(self, update: bytes, learn: bool = False) -> None:
        """Apply ``update`` (the rules took it) to the document (``learn``: note its roots)."""
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

    # -- replica peers ------------------------------------------------------------------------------

    def peers(self) -> list[PeerId]:
        """The peers known to hold a replica (they joined the document's topic)."""
        pubsub = self.svc.pubsub
        if pubsub is None or not pubsub.routing:
            return []
        return [p for p in pubsub.router.topics.get(self.topic, ()) if isinstance(p, PeerId)]

    async def commit(self, replicas: int, timeout: float) -> int:
        """Flush, wait until our changes are durable here and held by ``replicas`` other
        replicas; how many confirmed."""
        self.flush()
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if self.storage.durable is not None:
            await asyncio.shield(self.storage.durable)
        if replicas <= 0:
            return 0
        seq = self.state.head(self.chain)[0]
        deadline = time.monotonic() + timeout
        confirmed: set[PeerId] = set()
        while True:
            todo = [p for p in self.peers() if p not in confirmed]
            if todo:
                left = max(0.1, deadline - time.monotonic())
                results = await asyncio.gather(
                    *(self.anti_entropy.sync_with(p, timeout=left) for p in todo), return_exceptions=True
                )
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
        self.act_on(out, None, local=True)
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
        return self.member_at(env.author, env.certs, env.ts)

    def member_at(self, who: bytes, certs: tuple[bytes, ...], ts: int) -> bool:
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
        self.anti_entropy.close()
        if self._rebuild_handle is not None:
            self._rebuild_handle.cancel()
        pubsub = self.svc.pubsub
        if pubsub is not None and not pubsub.closed:
            pubsub.unsubscribe(self.topic, _ignore)
            pubsub.set_validator(self.topic, None)
        for sub in self._changes:
            sub._end()
        self.storage.snapshot()
        self.storage.remember_soon(clean=True)  # (after everything we signed is written: the chain may go on next time)
        actor = self.rt.actors.get(actor_name(self.doc))
        if actor is not None:
            self.host.spawn(actor.stop("document closed"))


def _short(author: bytes) -> str:
    try:
        return PeerId.from_bytes(author).short()
    except LatticaError:
        return author[:8].hex()


def _ignore(msg: Any) -> None:
    """(the topic's subscription: the validator did the work)"""
