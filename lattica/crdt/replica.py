"""What a replica decides about each envelope, sans-IO: apply it, hold it, or refuse it.

:class:`ReplicaState` is fed envelopes (from pub-sub, anti-entropy or its own writer) and answers
with what to apply to the Yjs document, in an order every replica can follow, and what it refused
and why. It holds the chains' heads, the document's clocks as its applied envelopes made them,
the writers list and the envelopes waiting for a gap or a dependency; the envelopes themselves
live in a :class:`Log` (in memory here, SQLite in ``lattica.crdt.store``). The rules, in the
order they are checked (docs/crdt.md):

1. the envelope is for this document and within the size limit;
2. one already held (same chain, same seq, same id) is a duplicate; a different one signed by
   the same author for the same place is a **fork**: reported (both are proof) and refused;
3. the author's signature;
4. the chain: the next seq after the held head, naming its hash (later ones wait);
5. the right to write: the owner, a writer on the owner's latest list, or a removed writer's
   envelope within its cut (a mesh document: a member of the mesh, by the certificates signed
   into the envelope);
6. the update's items are all under the chain's client id and start where that client's clock
   stands; everything it deletes was in the author's document when it wrote (its ``deps``);
7. its ``deps`` are held here (else it waits, bounded).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from lattica.crdt.envelope import ACL, GENESIS, Acl, Envelope
from lattica.crdt.yupdate import read_update
from lattica.errors import MalformedUpdate

__all__ = ["ReplicaState", "Outcome", "Log", "MemoryLog", "Chain"]

Chain = tuple[bytes, bytes]  # (author, nonce)


@dataclass
class Outcome:
    """What feeding envelopes did: ``applied`` (in order: apply them to the document),
    ``refused`` ``(envelope, reason)``, ``forks`` ``(new envelope, held envelope id)``,
    ``revoked``: applied envelopes a new ACL cuts off (the document holds their changes)."""

    applied: list[Envelope] = field(default_factory=list)
    refused: list[tuple[Envelope, str]] = field(default_factory=list)
    forks: list[tuple[Envelope, bytes]] = field(default_factory=list)
    revoked: list[tuple[Chain, int]] = field(default_factory=list)
    duplicates: int = 0
    held: int = 0


class Log:
    """Where a replica's applied envelopes live, in the order they were applied."""

    def append(self, env: Envelope) -> None:
        raise NotImplementedError

    def id_of(self, chain: Chain, seq: int) -> bytes | None:
        raise NotImplementedError

    def after(self, heads: dict[Chain, int], limit_bytes: int) -> list[Envelope]:
        """Applied envelopes beyond ``heads`` (seq per chain; 0 for an unknown one), in applied
        order, up to about ``limit_bytes``."""
        raise NotImplementedError

    def all(self) -> Iterator[Envelope]:
        raise NotImplementedError


class MemoryLog(Log):
    """A log kept in memory (a replica without a data directory)."""

    def __init__(self) -> None:
        self._order: list[Envelope] = []
        self._ids: dict[tuple[Chain, int], bytes] = {}

    def append(self, env: Envelope) -> None:
        self._order.append(env)
        self._ids[(env.chain, env.seq)] = env.id

    def id_of(self, chain: Chain, seq: int) -> bytes | None:
        return self._ids.get((chain, seq))

    def after(self, heads: dict[Chain, int], limit_bytes: int) -> list[Envelope]:
        out, size = [], 0
        for env in self._order:
            if env.seq > heads.get(env.chain, 0):
                out.append(env)
                size += env.size
                if size >= limit_bytes:
                    break
        return out

    def all(self) -> Iterator[Envelope]:
        return iter(self._order)


class ReplicaState:
    """The rules above for one document (``doc``), owned by ``owner`` (PeerId bytes) or, with
    None, written by the mesh's members (``is_member(envelope)`` says whether its author was one
    when it signed)."""

    def __init__(self, doc: bytes, owner: bytes | None, log: Log | None = None, *,
                 is_member: Callable[[Envelope], bool] | None = None, max_update: int = 1 << 20,
                 max_held: int = 4096, max_held_per_author: int = 1024, max_held_bytes: int = 64 << 20, verify: Callable[[Envelope], bool] | None = None) -> None:
        self.doc = doc
        self.owner = owner
        self.log = log if log is not None else MemoryLog()
        self.is_member = is_member or (lambda env: True)
        self.max_update = max_update
        self.max_held = max_held
        self.max_held_bytes = max_held_bytes
        self._verify = verify or Envelope.verify
        self.heads: dict[Chain, tuple[int, bytes]] = {}
        self.clocks: dict[int, int] = {}
        self.acl = Acl(frozenset({owner}) if owner else frozenset())
        self.acl_version = 0
        self._held: dict[Chain, dict[int, Envelope]] = {}
        self._held_count = 0
        self._held_by: dict[bytes, int] = {}  # envelopes waiting per author
        self.max_held_per_author = max_held_per_author
        self._held_bytes = 0
        self.refused_total: collections.Counter[str] = collections.Counter()
        self.forks: list[tuple[Envelope, bytes]] = []  # proof: the envelope and the id held for its place

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

    def export(self) -> list:
        """The book-keeping a snapshot keeps with the document's state (msgpack-able)."""
        return [[[a, n, seq, i] for (a, n), (seq, i) in self.heads.items()], [[c, k] for c, k in self.clocks.items()],
                self.acl.encode(), self.acl_version]

    def restore(self, meta: list, envs: Iterable[Envelope]) -> None:
        """Take back what :meth:`export` gave, with the log's envelopes up to that point."""
        heads, clocks, acl, version = meta
        self.heads = {(a, n): (seq, i) for a, n, seq, i in heads}
        self.clocks = {c: k for c, k in clocks}
        if version:
            self.acl, self.acl_version = Acl.decode(acl), version
        for env in envs:
            self.log.append(env)

    # -- feeding --------------------------------------------------------------------------------------

    def receive(self, envs: Iterable[Envelope], verified: bool = False) -> Outcome:
        """Check ``envs`` (see the module docstring) and apply what can be; ``verified``: their
        signatures are known good (our own)."""
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
        if env.seq <= seq:
            held = self.log.id_of(env.chain, env.seq)
            if held == env.id:
                out.duplicates += 1
                return None
            if not (verified or self._verify(env)):
                return self._refuse(env, "bad signature", out)
            return self._fork(env, held or b"", out)
        waiting = self._held.get(env.chain)
        if waiting is not None and env.seq in waiting:
            if waiting[env.seq].id == env.id:
                out.duplicates += 1
                return None
            if not (verified or self._verify(env)):
                return self._refuse(env, "bad signature", out)
            return self._fork(env, waiting[env.seq].id, out)
        if not (verified or self._verify(env)):
            return self._refuse(env, "bad signature", out)
        if env.kind == ACL and (self.owner is None or env.author != self.owner):
            return self._refuse(env, "an ACL not signed by the owner", out)
        if env.kind != ACL:
            why = self._right(env)
            if why:
                return self._refuse(env, why, out)  # (sent again by anti-entropy if a later list admits it)
        if env.seq > seq + 1:
            return self._hold(env, out)
        if not self._try(env, out):
            return self._hold(env, out)
        self._drain(out)
        return None

    def _try(self, env: Envelope, out: Outcome) -> bool:
        """Apply ``env`` (the next of its chain) if it may be: True if applied or refused, False
        if it waits for its deps."""
        seq, head_id = self.head(env.chain)
        if env.prev != head_id:
            if seq == 0:
                self._refuse(env, "a chain's first envelope names a previous one", out)
            else:
                self._fork(env, head_id, out)
            return True
        if env.kind == ACL:
            if self.owner is None or env.author != self.owner:
                self._refuse(env, "an ACL not signed by the owner", out)
                return True
            try:
                acl = Acl.decode(env.body)
            except MalformedUpdate:
                self._refuse(env, "malformed ACL", out)
                return True
            self._accept(env, out)
            self._set_acl(acl, env.seq, out)
            return True
        why = self._right(env)
        if why:
            self._refuse(env, why, out)
            return True
        try:
            info = read_update(env.body)
        except MalformedUpdate:
            self._refuse(env, "malformed update", out)
            return True
        client = env.client
        for c in info.structs:
            if c != client:
                self._refuse(env, "items under another client id", out)
                return True
        span = info.structs.get(client)
        if span is not None and span[0] != self.clocks.get(client, 0):
            self._refuse(env, "items do not continue the chain's clock", out)
            return True
        deps = dict(env.deps)
        clocks = self.clocks
        for c, k in env.deps:
            if clocks.get(c, 0) < k:
                return False  # waits (held by the caller)
        own_end = span[1] if span is not None else clocks.get(client, 0)
        for c, clock, length in info.deletes:
            bound = own_end if c == client else deps.get(c, 0)
            if clock + length > bound:
                self._refuse(env, "deletes what its author had not seen", out)
                return True
        self._accept(env, out)
        if span is not None:
            clocks[client] = span[1]
        return True

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
        self.heads[env.chain] = (env.seq, env.id)
        out.applied.append(env)

    def _set_acl(self, acl: Acl, version: int, out: Outcome) -> None:
        self.acl = acl
        self.acl_version = version
        for chain, (seq, _) in self.heads.items():
            author = chain[0]
            if chain[1] == b"" or author == self.owner or author in acl.writers:
                continue
            cut = acl.cuts.get(chain, 0)
            if seq > cut:
                out.revoked.append((chain, cut))

    def _hold(self, env: Envelope, out: Outcome) -> None:
        mine = self._held_by.get(env.author, 0)
        if (self._held_count >= self.max_held or self._held_bytes + env.size > self.max_held_bytes
                or mine >= self.max_held_per_author):
            return self._refuse(env, "too many envelopes waiting", out)
        self._held_by[env.author] = mine + 1
        self._held.setdefault(env.chain, {})[env.seq] = env
        self._held_count += 1
        self._held_bytes += env.size
        out.held += 1
        return None

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
                    env = waiting.get(nxt)
                    if env is None:
                        stale = [s for s in waiting if s < nxt]
                        for s in stale:
                            self._unhold(waiting, s)
                        break
                    if not self._try(env, out):
                        break
                    self._unhold(waiting, nxt)
                    progress = True
                if not waiting:
                    del self._held[chain]

    def _unhold(self, waiting: dict[int, Envelope], seq: int) -> None:
        env = waiting.pop(seq)
        n = self._held_by.pop(env.author) - 1
        if n:
            self._held_by[env.author] = n
        self._held_count -= 1
        self._held_bytes -= env.size

    def _fork(self, env: Envelope, held: bytes, out: Outcome) -> None:
        out.forks.append((env, held))
        if len(self.forks) < 64:
            self.forks.append((env, held))
        self._refuse(env, "forked chain", out)

    def _refuse(self, env: Envelope, reason: str, out: Outcome) -> None:
        out.refused.append((env, reason))
        self.refused_total[reason] += 1
