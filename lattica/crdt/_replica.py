"""What a replica decides about each envelope, sans-IO: apply it, hold it, or refuse it.

:class:`ReplicaState` is fed envelopes (from pub-sub, anti-entropy or its own writer) and answers
with what to apply to the Yjs document, in an order every replica can follow, and what it refused
and why. It holds the chains' heads, the document's clocks as its applied envelopes made them,
the writers list and the envelopes waiting for a gap or a dependency; the envelopes themselves
live in a :class:`Log`. The rules, in the order they are checked (docs/crdt.md):

1. the envelope is for this document and within the size limit;
2. one already held (same chain, same seq, same id) is a duplicate; a different one signed by
   the same author for the same place is a **fork**: reported (both are proof), and the chain
   ends for good just before the fork on every replica (one that applied past it rebuilds);
3. the author's signature;
4. the chain: the next seq after the held head, naming its hash (later ones wait); at most
   ``MAX_CHAINS_PER_AUTHOR`` chains per author, and a client id belongs to the first chain that
   used it;
5. the right to write: the owner, a writer on the owner's latest list, or a removed writer's
   envelope within its cut (a mesh document: a member of the mesh, by the certificates signed
   into the envelope);
6. the update, read the way yrs reads it: its items are all under the chain's client id and
   start where that client's clock stands; its ``deps`` are exactly the clocks it names of
   other clients (origins, parents, what it deletes);
7. those clocks are held here (else it waits, bounded per author and in all).

A **checkpoint** (lattica/crdt/_checkpoint.py) stands for the envelopes it covers: a replica that
took one drops them from its log, counts any that come again as duplicates, and gives a replica
that lacks some of them the checkpoint instead (:meth:`ReplicaState.propose`,
:meth:`ReplicaState.check`, :meth:`ReplicaState.adopt`).
"""

from __future__ import annotations

import collections
import hashlib
import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from lattica.crdt._checkpoint import Checkpoint, canonical_state, check_state
from lattica.crdt._envelope import ACL, GENESIS, Acl, Envelope, client_id
from lattica.crdt._yupdate import UpdateInfo, read_update_as_yrs
from lattica.errors import MalformedUpdate

__all__ = [
    "ReplicaState",
    "Outcome",
    "Log",
    "MemoryLog",
    "Chain",
    "gossip_verdict",
    "MAX_CHAINS",
    "MAX_CHAINS_PER_AUTHOR",
    "REBUILD_GAP",
]

Chain = tuple[bytes, bytes]  # (author, nonce)
MAX_CHAINS = 16384  # chains one document holds (what a summary names)
MAX_CHAINS_PER_AUTHOR = 256  # an author's sessions of writing one document (ended ones count)
MAX_CHECKPOINTS = 8  # checkpoints a replica holds that none of the others covers
MAX_FROZEN = 4096  # forked chains a document ends (beyond, forks are refused and not acted on)
HOLD_FOR = 120.0  # seconds an envelope may wait for its gap or its deps (anti-entropy brings it again)
REBUILD_GAP = 1.0  # seconds at least between two rebuilds of a document (forks cannot buy one each)
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


@dataclass
class Outcome:
    """What feeding envelopes did: ``applied`` (in order: apply them to the document),
    ``refused`` ``(envelope, reason)``, ``forks`` ``(new envelope, envelope held for its place)``,
    ``rebuild``: envelopes already applied no longer count (a fork, or a writer cut off after
    them): the document must be rebuilt from the log (:meth:`ReplicaState.rebuilt`)."""

    applied: list[Envelope] = field(default_factory=list)
    refused: list[tuple[Envelope, str]] = field(default_factory=list)
    forks: list[tuple[Envelope, Envelope | None]] = field(default_factory=list)
    rebuild: bool = False
    duplicates: int = 0
    held: int = 0


class Log:
    """Where a replica's applied envelopes live, in the order they were applied."""

    def append(self, env: Envelope) -> None:
        raise NotImplementedError

    def get(self, chain: Chain, seq: int) -> Envelope | None:
        raise NotImplementedError

    def after(self, heads: dict[Chain, int], limit_bytes: int) -> list[Envelope]:
        """Applied envelopes beyond ``heads`` (seq per chain; 0 for an unknown one), in applied
        order, up to about ``limit_bytes``."""
        raise NotImplementedError

    def all(self) -> Iterator[Envelope]:
        raise NotImplementedError

    def __len__(self) -> int:
        """The envelopes held (those a checkpoint covers dropped)."""
        raise NotImplementedError


class MemoryLog(Log):
    """A log kept in memory: the envelopes in applied order, and each chain's in seq order (so
    what another replica lacks is found without reading the rest); a chain's envelopes up to its
    **base** were dropped for a checkpoint."""

    def __init__(self) -> None:
        self._n = 0
        self._count = 0
        self._chains: dict[
            Chain, list[tuple[int, Envelope]]
        ] = {}  # chain -> [(position, envelope)], seq base+1, base+2, ...
        self._base: dict[Chain, int] = {}

    def append(self, env: Envelope) -> None:
        entries = self._chains.setdefault(env.chain, [])
        if env.seq != self._base.get(env.chain, 0) + len(entries) + 1:
            return  # (covered by a checkpoint, or not next: the rules never append such)
        entries.append((self._n, env))
        self._n += 1
        self._count += 1

    def get(self, chain: Chain, seq: int) -> Envelope | None:
        entries = self._chains.get(chain)
        i = seq - self._base.get(chain, 0) - 1
        if entries is None or not 0 <= i < len(entries):
            return None
        env = entries[i][1]
        return env if env.seq == seq else None

    def compact(self, bases: dict[Chain, int]) -> None:
        """Drop each chain's envelopes up to ``bases[chain]`` (a checkpoint holds them now)."""
        for chain, base in bases.items():
            old = self._base.get(chain, 0)
            if base <= old:
                continue
            entries = self._chains.get(chain, [])
            drop = min(base - old, len(entries))
            self._count -= drop
            self._chains[chain] = entries[drop:]
            self._base[chain] = base

    def after(self, heads: dict[Chain, int], limit_bytes: int) -> list[Envelope]:
        base = self._base
        tails = []
        for chain, entries in self._chains.items():
            skip = max(heads.get(chain, 0) - base.get(chain, 0), 0)
            if len(entries) > skip:
                tails.append(entries[skip:])
        out, size = [], 0
        for _, env in heapq.merge(*tails, key=lambda entry: entry[0]):
            out.append(env)
            size += env.size
            if size >= limit_bytes:
                break
        return out

    def all(self) -> Iterator[Envelope]:
        return (env for _, env in heapq.merge(*self._chains.values(), key=lambda entry: entry[0]))

    def __len__(self) -> int:
        return self._count


class ReplicaState:
    """The rules above for one document (``doc``), owned by ``owner`` (PeerId bytes) or, with
    None, written by the mesh's members (``is_member(envelope)`` says whether its author was one
    when it signed)."""

    def __init__(
        self,
        doc: bytes,
        owner: bytes | None,
        log: Log | None = None,
        *,
        is_member: Callable[[Envelope], bool] | None = None,
        max_update: int = 1 << 20,
        max_held: int = 4096,
        max_held_per_author: int = 256,
        max_held_bytes: int = 64 << 20,
        verify: Callable[[Envelope], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.doc = doc
        self.owner = owner
        self.log = log if log is not None else MemoryLog()
        self.is_member = is_member or (lambda env: True)
        self.max_update = max_update
        self.max_held = max_held
        self.max_held_per_author = max_held_per_author
        self.max_held_bytes = max_held_bytes
        self._verify = verify or Envelope.verify
        self._clock = clock
        self.heads: dict[Chain, tuple[int, bytes]] = {}
        self.clocks: dict[int, int] = {}
        self.clients: dict[int, Chain] = {}  # client id -> the chain that writes under it
        self.chains_by: collections.Counter[bytes] = collections.Counter()  # chains per author
        self.frozen: dict[Chain, int] = {}  # forked chains: the last seq that counts
        self.acl = Acl(frozenset({owner}) if owner else frozenset())
        self.acl_version = 0
        self._held: dict[Chain, dict[int, tuple[Envelope, float]]] = {}
        self._held_count = 0
        self._held_bytes = 0
        self._held_by: collections.Counter[bytes] = collections.Counter()  # envelopes waiting per author
        self._held_bytes_by: collections.Counter[bytes] = collections.Counter()
        self.refused_total: collections.Counter[str] = collections.Counter()
        self.forks: list[tuple[Envelope, Envelope | None]] = []  # the last forks seen (for stats and logs)
        self.proofs: dict[Chain, tuple[Envelope, Envelope]] = {}  # a frozen chain's fork: two envelopes for one place
        # the checkpoints taken (more than one only when made apart, as on two sides of a
        # partition); the log holds only what came after them
        self.checkpoints: list[Checkpoint] = []
        self.base: dict[Chain, int] = {}  # per chain, the seq they cover
        self._cp_ends: dict[bytes, dict[int, int]] = {}  # per checkpoint, each client's clock in its state
        self._checked: tuple[bytes, int, bytes] | None = (
            None  # the last canonical state computed (heads, checkpoints, state)
        )

    # -- reading ------------------------------------------------------------------------------------

    def head(self, chain: Chain) -> tuple[int, bytes]:
        return self.heads.get(chain, (0, GENESIS))

    def summary(self) -> dict[Chain, int]:
        """Seq held per chain: what anti-entropy tells another replica."""
        return {c: s for c, (s, _) in self.heads.items()}

    def missing_for(self, theirs: dict[Chain, int], limit_bytes: int = 4 << 20) -> list[Envelope]:
        """What a replica that holds ``theirs`` lacks of ours, in an order it can apply."""
        return self.log.after(theirs, limit_bytes)

    def held(self) -> int:
        return self._held_count

    def may_write(self, author: bytes) -> bool:
        """Whether ``author`` is on the latest writers list (owner documents)."""
        return self.owner is None or author == self.owner or author in self.acl.writers

    def differing(self, theirs: dict[Chain, int], ids: dict[Chain, bytes]) -> list[Envelope]:
        """Our head envelopes where a replica holding ``theirs`` is at the same seq under another
        id (``ids``: the first bytes of its heads' ids): its author signed two envelopes for one
        place, and equal summaries would hide it; fed ours, that replica sees the fork."""
        out = []
        for chain, prefix in ids.items():
            seq, head = self.heads.get(chain, (0, b""))
            if seq and theirs.get(chain) == seq and not head.startswith(prefix):
                env = self.log.get(chain, seq)
                if env is not None:
                    out.append(env)
        return out

    def proofs_for(self, theirs: dict[Chain, int]) -> list[Envelope]:
        """The fork proofs a replica that holds ``theirs`` lacks: for each chain we ended that it
        holds past the end, both envelopes (feeding them, it sees the fork and ends it too)."""
        out: list[Envelope] = []
        for chain, cut in self.frozen.items():
            if theirs.get(chain, 0) > cut and chain in self.proofs:
                out.extend(self.proofs[chain])
        return out

    def export(self) -> list:
        """The book-keeping a snapshot keeps with the document's state (msgpack-able)."""
        return [
            [[a, n, seq, i] for (a, n), (seq, i) in self.heads.items()],
            [[c, k] for c, k in self.clocks.items()],
            self.acl.encode(),
            self.acl_version,
            [[a, n, s] for (a, n), s in self.frozen.items()],
            [[x.to_bytes(), y.to_bytes()] for x, y in self.proofs.values()],
        ]

    def restore(self, meta: list, envs: Iterable[Envelope]) -> None:
        """Take back what :meth:`export` gave, with the log's envelopes up to that point."""
        heads, clocks, acl, version, frozen, proofs = meta
        self.heads = {(a, n): (seq, i) for a, n, seq, i in heads}
        self.clocks = {c: k for c, k in clocks}
        self.frozen = {(a, n): s for a, n, s in frozen}
        for x, y in proofs:
            one, two = Envelope.from_bytes(x), Envelope.from_bytes(y)
            self.proofs[one.chain] = (one, two)
        if version:
            self.acl, self.acl_version = Acl.decode(acl), version
        self._count_chains()
        for env in envs:
            if env.seq <= self.heads.get(env.chain, (0,))[0]:
                self.log.append(env)

    def _count_chains(self) -> None:
        """Rebuild the per-author chain counts and client ids from the heads; ended (frozen)
        chains count too: forking is no way around the cap."""
        self.clients, self.chains_by = {}, collections.Counter()
        for a, n in set(self.heads) | set(self.frozen):
            if n:
                self.clients[client_id(self.doc, a, n)] = (a, n)
                self.chains_by[a] += 1

    def rebuilt(self) -> tuple[ReplicaState, Outcome]:
        """A fresh state that replays this one's log under what is known now (forks, the latest
        writers list): what it applied, in order, is the document to rebuild."""
        new = ReplicaState(
            self.doc,
            self.owner,
            MemoryLog(),
            is_member=self.is_member,
            max_update=self.max_update,
            max_held=self.max_held,
            max_held_per_author=self.max_held_per_author,
            max_held_bytes=self.max_held_bytes,
            verify=self._verify,
            clock=self._clock,
        )
        new.frozen = dict(self.frozen)
        new.proofs = dict(self.proofs)
        new.forks = self.forks
        new._count_chains()
        for cp in self.checkpoints:
            new._take(cp, self._cp_ends[cp.digest])
        acls = [e for e in self.log.all() if e.kind == ACL]
        out = new.receive(acls, verified=True)  # (the latest list first: what it cuts off stays out)
        out2 = new.receive([e for e in self.log.all() if e.kind != ACL], verified=True)
        out.applied += out2.applied
        out.refused += out2.refused
        new.refused_total = self.refused_total  # (what the replay left out was counted when it came)
        return new, out

    # -- checkpoints -----------------------------------------------------------------------------------

    def propose(self, states: list[bytes]) -> tuple[Checkpoint, bytes] | None:
        """A checkpoint of everything applied here, and its canonical state (``states``: those
        of the checkpoints we hold); None while a chain is applied past a fork's end (a rebuild
        is due)."""
        if any(self.heads.get(c, (0,))[0] > cut for c, cut in self.frozen.items()):
            return None
        heads = tuple(sorted((a, n, s, i) for (a, n), (s, i) in self.heads.items() if n))
        bodies = self._covered(Checkpoint(self.doc, heads, bytes(32)), states)
        if bodies is None:
            return None
        canon = canonical_state(bodies)
        return Checkpoint(self.doc, heads, hashlib.sha256(canon).digest()), canon

    def check(self, cp: Checkpoint, states: list[bytes]) -> tuple[str, bytes]:
        """Whether ``cp`` is this document's state at its heads, computed from our own log (and
        ``states``, our checkpoints'): ``("", canonical state)``, or why not (we lack what it
        covers, or it differs)."""
        if cp.doc != self.doc:
            return "another document", b""
        for a, n, s, _i in cp.heads:
            if s > self.frozen.get((a, n), s):
                return "it covers a forked chain past its end", b""
        if self.disagreeing(cp):
            return "it disagrees with an envelope we hold", b""
        heads = Checkpoint(self.doc, cp.heads, bytes(32)).digest
        if self._checked is not None and self._checked[0] == heads and self._checked[1] == len(self.checkpoints):
            canon = self._checked[2]  # (the same heads make the same state: a second claim costs no merge)
        else:
            bodies = self._covered(cp, states)
            if bodies is None:
                return "we do not hold everything it covers", b""
            canon = canonical_state(bodies)
            self._checked = (heads, len(self.checkpoints), canon)
        if hashlib.sha256(canon).digest() != cp.state_hash:
            return "its state is not what the envelopes it covers make", b""
        return "", canon

    def yield_to(self, cp: Checkpoint) -> bool:
        """End the chains where we hold another envelope than ``cp`` names for a place (the
        author forked, and a checkpoint others took decided for the other branch): True if any
        ended (the document must be rebuilt before ``cp`` is taken)."""
        ended = False
        for env in self.disagreeing(cp):
            cut = env.seq - 1
            if self.frozen.get(env.chain, cut + 1) > cut:
                self.frozen[env.chain] = cut
                ended = True
        return ended

    def disagreeing(self, cp: Checkpoint) -> list[Envelope]:
        """The envelopes we hold at places where ``cp`` names another (its author signed both:
        a fork, which whoever holds the other sees once it gets ours)."""
        out = []
        for a, n, s, i in cp.heads:
            if self.base.get((a, n), 0) < s:
                env = self.log.get((a, n), s)
                if env is not None and env.id != i:
                    out.append(env)
        return out

    def superseded(self, cp: Checkpoint) -> bool:
        """Whether a checkpoint we hold covers everything ``cp`` does (taking it adds nothing)."""
        return any(_supersedes(have, cp) for have in self.checkpoints)

    def _covered(self, cp: Checkpoint, states: list[bytes]) -> list[bytes] | None:
        """The updates whose merge is ``cp``'s canonical state (merging is the same for any
        split of one set of updates): our checkpoints' states and our logged envelopes up to
        its heads; None if we lack any, or it covers less than our checkpoints."""
        covers = cp.covers()
        if any(covers.get(c, 0) < b for c, b in self.base.items()):
            return None
        if len(states) != len(self.checkpoints):
            return None
        bodies = list(states)
        for a, n, s, i in cp.heads:
            chain = (a, n)
            base = self.base.get(chain, 0)
            if self.head(chain)[0] < s:
                return None
            if s == base:
                if self._base_id(chain) != i:
                    return None
                continue
            last = self.log.get(chain, s)
            if last is None or last.id != i:
                return None
            for seq in range(base + 1, s + 1):
                env = self.log.get(chain, seq)
                if env is None:
                    return None
                bodies.append(env.body)
        return bodies

    def _base_id(self, chain: Chain) -> bytes | None:
        """The id of the envelope at ``chain``'s base (as the checkpoint that set it names it)."""
        best = None
        for cp in self.checkpoints:
            for a, n, s, i in cp.heads:
                if (a, n) == chain and (best is None or s > best[0]):
                    best = (s, i)
        return best[1] if best else None

    def checkpoints_for(self, theirs: dict[Chain, int]) -> list[Checkpoint]:
        """Our checkpoints that a replica holding ``theirs`` lacks part of (we no longer hold
        those envelopes: it takes the checkpoint instead)."""
        return [cp for cp in self.checkpoints if any(theirs.get((a, n), 0) < s for a, n, s, _ in cp.heads)]

    def adopt(self, cp: Checkpoint, state: bytes) -> tuple[str, Outcome]:
        """Take ``cp`` (checked, or signed by whom the document trusts) with its ``state``: drop
        what it covers from the log, take the heads and clocks it is ahead in (the caller merges
        ``state`` into the document). Why not ("" if taken), and the envelopes that were waiting
        and now apply."""
        out = Outcome()
        if cp.doc != self.doc:
            return "another document", out
        if self.superseded(cp):
            return "", out  # (nothing to take: an old one replayed, or ours again)
        why, info = check_state(cp, state)
        if info is None:
            return why, out
        ends = {c: e for c, (_, e) in info.structs.items()}
        new_chains = 0
        for a, n, s, i in cp.heads:
            chain = (a, n)
            client = client_id(self.doc, a, n)
            base, ours = self.base.get(chain, 0), self.head(chain)[0]
            if s == base and self._base_id(chain) != i:
                return "it disagrees with a checkpoint we hold", out
            if base < s <= ours:
                held = self.log.get(chain, s)
                if held is not None and held.id != i:
                    return "it disagrees with an envelope we hold", out
            if s <= ours and self.clocks.get(client, 0) < ends.get(client, 0):
                return "its state is ahead of the envelopes it names", out
            if s == ours and self.clocks.get(client, 0) != ends.get(client, 0):
                return "its state is behind envelopes we hold", out
            if s > ours and self.clocks.get(client, 0) > ends.get(client, 0):
                return "its state is behind envelopes we hold", out
            if ours == 0 and s > 0:
                new_chains += 1
        if len(self.heads) + new_chains > MAX_CHAINS:
            return "too many chains", out
        # what we hold of the chains it covers must be in its state (it may add, never leave out)
        bodies = []  # what we hold of the chains it covers
        for a, n, s, _ in cp.heads:
            for seq in range(self.base.get((a, n), 0) + 1, min(s, self.head((a, n))[0]) + 1):
                env = self.log.get((a, n), seq)
                if env is not None:
                    bodies.append(env.body)
        if bodies and canonical_state([state, *bodies]) != state:
            return "its state leaves out envelopes we hold", out
        kept = [have for have in self.checkpoints if not _supersedes(cp, have)]
        if len(kept) >= MAX_CHECKPOINTS:
            return "too many checkpoints", out
        self._take(cp, ends)
        self._drain(out)
        return "", out

    def _take(self, cp: Checkpoint, ends: dict[int, int]) -> None:
        for a, n, s, i in cp.heads:
            chain = (a, n)
            if s > self.frozen.get(chain, s):
                # a chain we ended for a fork, which the checkpoint takes past the fork: what it
                # covers is decided (the branch it names counts), and the chain goes on from there
                del self.frozen[chain]
                self.proofs.pop(chain, None)
            if self.head(chain)[0] < s:
                self.heads[chain] = (s, i)
            c = client_id(self.doc, a, n)
            if self.clocks.get(c, 0) < ends.get(c, 0):
                self.clocks[c] = ends[c]
            if c not in self.clients:
                self.clients[c] = chain
                self.chains_by[a] += 1
            self.base[chain] = max(self.base.get(chain, 0), s)
        self.checkpoints = [have for have in self.checkpoints if not _supersedes(cp, have)] + [cp]
        self._cp_ends = {have.digest: self._cp_ends[have.digest] for have in self.checkpoints[:-1]}
        self._cp_ends[cp.digest] = ends
        if isinstance(self.log, MemoryLog):
            self.log.compact(self.base)

    # -- feeding --------------------------------------------------------------------------------------

    def receive(self, envs: Iterable[Envelope], verified: bool = False) -> Outcome:
        """Check ``envs`` (see the module docstring) and apply what can be; ``verified``: their
        signatures are known good (our own, or our log's)."""
        out = Outcome()
        for env in envs:
            self._one(env, out, verified)
        return out

    def _one(self, env: Envelope, out: Outcome, verified: bool) -> None:
        if env.doc != self.doc:
            return self._refuse(env, "another document", out)
        if len(env.body) > self.max_update:
            return self._refuse(env, "too large", out)
        seq, head_id = self.head(env.chain)
        frozen = self.frozen.get(env.chain)
        if env.seq <= self.base.get(env.chain, 0):
            out.duplicates += 1  # (covered by a checkpoint: what it covers is settled)
            return None
        if env.seq <= seq:
            held = self.log.get(env.chain, env.seq)
            if held is not None and held.id == env.id:
                out.duplicates += 1
                return None
            if not (verified or self._verify(env)):
                return self._refuse(env, "bad signature", out)
            return self._fork(env, held, out)
        waiting = self._held.get(env.chain)
        if waiting is not None and env.seq in waiting:
            other = waiting[env.seq][0]
            if other.id == env.id:
                out.duplicates += 1
                return None
            if not (verified or self._verify(env)):
                return self._refuse(env, "bad signature", out)
            return self._fork(env, other, out)
        if frozen is not None and env.seq > frozen:
            return self._refuse(env, "forked chain", out)
        if not (verified or self._verify(env)):
            return self._refuse(env, "bad signature", out)
        if env.kind == ACL and (self.owner is None or env.author != self.owner):
            return self._refuse(env, "an ACL not signed by the owner", out)
        if env.kind != ACL:
            why = self._right(env)
            if why:
                return self._refuse(env, why, out)  # (sent again by anti-entropy if a later list admits it)
            if seq == 0:
                why = self._new_chain(env)
                if why:
                    return self._refuse(env, why, out)
        if env.seq > seq + 1:
            return self._hold(env, out)
        if not self._try(env, out):
            return self._hold(env, out)
        self._drain(out)
        return None

    def _new_chain(self, env: Envelope) -> str:
        """Why ``env`` may not start a chain ("" if it may)."""
        if len(self.heads) >= MAX_CHAINS:
            return "too many chains"
        if self.chains_by[env.author] >= MAX_CHAINS_PER_AUTHOR:
            return "too many chains of one author"
        taken = self.clients.get(env.client)
        if taken is not None and taken != env.chain:
            return "client id taken"
        return ""

    def _try(self, env: Envelope, out: Outcome) -> bool:
        """Apply ``env`` (the next of its chain) if it may be: True if applied or refused, False
        if it waits for its deps."""
        seq, head_id = self.head(env.chain)
        if env.prev != head_id:
            if seq == 0:
                self._refuse(env, "a chain's first envelope names a previous one", out)
            else:
                self._fork(env, self.log.get(env.chain, seq), out, at=seq)
            return True
        if env.kind == ACL:
            try:
                acl = Acl.decode(env.body)
            except MalformedUpdate:
                self._refuse(env, "malformed ACL", out)
                return True
            self._accept(env, out)
            self._set_acl(acl, env.seq, out)
            return True
        if seq == 0:
            why = self._new_chain(env)  # (again: another chain may have started since it was held)
            if why:
                self._refuse(env, why, out)
                return True
        try:
            info = read_update_as_yrs(env.body)
        except MalformedUpdate:
            self._refuse(env, "malformed update", out)
            return True
        why = self._check_update(env, info)
        if why:
            self._refuse(env, why, out)
            return True
        clocks = self.clocks
        for c, k in env.deps:
            if clocks.get(c, 0) < k:
                return False  # waits (held by the caller)
        self._accept(env, out)
        span = info.structs.get(env.client)
        if span is not None:
            clocks[env.client] = span[1]
        return True

    def _check_update(self, env: Envelope, info: UpdateInfo) -> str:
        """Why the update may not be ``env``'s ("" if it may)."""
        client = env.client
        for c in info.structs:
            if c != client:
                return "items under another client id"
        span = info.structs.get(client)
        if span is not None and span[0] != self.clocks.get(client, 0):
            return "items do not continue the chain's clock"
        own_end = span[1] if span is not None else self.clocks.get(client, 0)
        if info.needs.get(client, 0) > own_end:
            return "names items of its own chain that do not exist"
        needs = {c: k for c, k in info.needs.items() if c != client}
        if dict(env.deps) != needs or len(env.deps) != len(needs):
            return "deps are not what the update names"
        return ""

    def _right(self, env: Envelope) -> str:
        """Why ``env``'s author may not write it ("" if it may)."""
        if self.owner is None:
            return "" if self.is_member(env) else "author not a member of the mesh"
        a = env.author
        if a == self.owner or a in self.acl.writers:
            return ""
        if env.seq <= self.acl.cuts.get(env.chain, 0):
            return ""
        return "author not on the writers list"

    def _accept(self, env: Envelope, out: Outcome) -> None:
        self.log.append(env)
        if env.seq == 1 and env.nonce and env.client not in self.clients:
            self.clients[env.client] = env.chain
            self.chains_by[env.author] += 1
        self.heads[env.chain] = (env.seq, env.id)
        out.applied.append(env)

    def _set_acl(self, acl: Acl, version: int, out: Outcome) -> None:
        self.acl = acl
        self.acl_version = version
        for chain, (seq, _) in self.heads.items():
            author = chain[0]
            if chain[1] == b"" or author == self.owner or author in acl.writers:
                continue
            if seq > acl.cuts.get(chain, 0):
                out.rebuild = True  # (applied beyond where the owner cut it off)

    def _hold(self, env: Envelope, out: Outcome) -> None:
        now = self._clock()
        self._expire(now)
        a = env.author
        if (
            self._held_count >= self.max_held
            or self._held_bytes + env.size > self.max_held_bytes
            or self._held_by[a] >= self.max_held_per_author
            or self._held_bytes_by[a] + env.size > self.max_held_bytes // 8
        ):
            return self._refuse(env, "too many envelopes waiting", out)
        self._held.setdefault(env.chain, {})[env.seq] = (env, now)
        self._held_count += 1
        self._held_bytes += env.size
        self._held_by[a] += 1
        self._held_bytes_by[a] += env.size
        out.held += 1
        return None

    def _expire(self, now: float) -> None:
        """Let go of envelopes that waited longer than HOLD_FOR (anti-entropy brings them again
        once what they wait for is here)."""
        for chain in list(self._held):
            waiting = self._held[chain]
            for seq in [s for s, (_, t) in waiting.items() if now - t > HOLD_FOR]:
                self._unhold(waiting, seq)
            if not waiting:
                del self._held[chain]

    def _drain(self, out: Outcome) -> None:
        """Apply held envelopes that have become next in their chain with their deps met, until
        none is."""
        progress = True
        while progress and self._held:
            progress = False
            for chain in list(self._held):
                waiting = self._held[chain]
                while waiting:
                    nxt = self.head(chain)[0] + 1
                    entry = waiting.get(nxt)
                    if entry is None:
                        for s in [s for s in waiting if s < nxt]:
                            self._unhold(waiting, s)
                        break
                    if not self._try(entry[0], out):
                        break
                    self._unhold(waiting, nxt)
                    progress = True
                if not waiting:
                    del self._held[chain]

    def _unhold(self, waiting: dict[int, tuple[Envelope, float]], seq: int) -> None:
        env = waiting.pop(seq)[0]
        self._held_count -= 1
        self._held_bytes -= env.size
        self._held_by[env.author] -= 1
        self._held_bytes_by[env.author] -= env.size
        if self._held_by[env.author] <= 0:
            del self._held_by[env.author]
            self._held_bytes_by.pop(env.author, None)

    def _fork(self, env: Envelope, held: Envelope | None, out: Outcome, at: int | None = None) -> None:
        """``env`` and ``held`` (ours) are two envelopes the author signed for one place: its
        chain ends just before it, on every replica that sees both — if the author may write
        now (a removed writer's forks, or anyone's within a cut, change nothing) and fewer than
        MAX_FROZEN chains have ended."""
        place = env.seq if at is None else at
        cut = place - 1
        counts = (
            held is not None
            and env.kind == held.kind
            and not self._right(env)
            and not (self.owner is not None and env.author != self.owner and env.author not in self.acl.writers)
        )
        if (
            counts
            and self.frozen.get(env.chain, cut + 1) > cut
            and (env.chain in self.frozen or len(self.frozen) < MAX_FROZEN)
        ):
            assert held is not None
            self.frozen[env.chain] = cut
            self.proofs[env.chain] = (held, env)
            if self.head(env.chain)[0] > cut:
                out.rebuild = True
            self.forks = (self.forks + [(env, held)])[-64:]
            out.forks.append((env, held))
        self._refuse(env, "forked chain", out)

    def _refuse(self, env: Envelope, reason: str, out: Outcome) -> None:
        out.refused.append((env, reason))
        self.refused_total[reason] += 1


def gossip_verdict(out: Outcome) -> str:
    """What a pub-sub validator answers for an envelope a peer forwarded, by what feeding it did:
    "accept" (applied or held: passed on), "reject" (a refusal the forwarder should have seen for
    itself: it is scored down), or "ignore" (already here, or refused for what it may not know)."""
    if out.refused:
        return "reject" if out.refused[0][1] in _HARD else "ignore"
    return "accept" if out.applied or out.held else "ignore"


def _supersedes(new: Checkpoint, old: Checkpoint) -> bool:
    """Whether ``new`` covers everything ``old`` does."""
    covers = new.covers()
    return all(covers.get((a, n), 0) >= s for a, n, s, _ in old.heads)
