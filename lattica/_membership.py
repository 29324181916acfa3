"""Membership and failure detection without a head node (sans-IO).

Every node keeps a view of the mesh: each member's state (alive, suspect, dead, left), its
incarnation, and what it says about itself (resources, labels, load). The view is kept by two
kinds of messages, both plain maps:

* **Heartbeats.** Members are placed on a ring by a hash of their id; every ``interval`` each node
  sends a heartbeat to the ``monitors`` members after it in its view, and so asks them to watch
  it (when its view changes it tells the ones it drops). A watcher runs a phi-accrual detector on
  the arrivals: when phi passes ``phi_suspect`` (or no heartbeat came for ``max_silence``) it
  suspects the member; a suspicion not refuted within ``suspect_timeout`` makes it dead. Being
  watched at the sender's request (not by the watcher's own view of the ring) means two nodes
  whose views differ for a moment never judge each other on heartbeats that were never sent.
* **Gossip.** Every ``interval`` each node also sends its news to ``fanout`` random members, and
  every heartbeat carries news too. News are rumors ``(member, incarnation, state, info)`` that are
  retransmitted a number of times that grows with log(n), so a verdict reaches everyone in
  O(log n) rounds. A member that hears a rumor that it is suspect or dead raises its incarnation
  and spreads that it is alive (SWIM's refutation); a newer incarnation wins, and at equal
  incarnations dead/left beats suspect beats alive.

A node that leaves says so (``leave``): its watchers mark it ``left`` at once, no timeout. Glue that
sees a connection reset and a refused redial may call ``declare_dead`` directly (a killed process).

Only a member speaks for itself: its ``alive`` and ``left`` statements (incarnation, state and
info) are sealed by a :class:`Notary` (in a node: signed with its identity key and carrying its
mesh certificates, ``lattica.trust.MemberNotary``), and a row without a valid seal from an
admitted member is ignored, so nobody can revive, retire, re-describe or invent another member.
A member raises its incarnation whenever its info changes, so an old statement replayed never
overrides a newer one. Suspicions and death verdicts are hearsay by nature (a detector's
finding): they name only an incarnation we already know, and a death needs two members' word.

Nothing here reads a clock or touches a socket: ``tick(now)`` and ``receive(now, sender, msg)``
return the messages to send and the events for the user, in the h11 style.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from lattica._digest import sha256
from lattica.config import MembershipConfig

__all__ = [
    "ALIVE",
    "SUSPECT",
    "DEAD",
    "LEFT",
    "MembershipConfig",
    "Member",
    "Membership",
    "MemberUp",
    "MemberChanged",
    "MemberDown",
    "SelfDowned",
    "PhiAccrual",
    "Notary",
    "statement",
]

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"
_RANK = {ALIVE: 0, SUSPECT: 1, DEAD: 2, LEFT: 2}
_MAX_RUMORS = 32  # per message
_MAX_INFO_KEYS = 32
_MAX_VIEW = 4096  # members in one full view
MAX_MEMBERS = 4096  # members one node keeps (dead and departed ones until they are forgotten)
_JUMP_EVERY = 60.0  # seconds between refutations of incarnations we never stated (see _about_us)
_HEARSAY_FOR = 30.0  # seconds an unconfirmed verdict waits for a second member to say it
_MAX_HEARSAY = 1024
MAX_JUMP = 1 << 20  # hearsay about us names at most this many incarnations past our own
_MAX_ID = 128
MAX_INCARNATION = 1 << 48  # a rumor naming more is refused: the refutation (+1) must still encode
_MAX_AMOUNT = 1e15  # the largest resource amount believed (bytes of memory included)
_RESOURCE_KEYS = ("cpu", "memory", "gpus")
_MAX_LABELS, _MAX_LABEL = 64, 256
MAX_ALLOW = 32  # allow-list patterns a member reports (placement skips nodes that cannot run a class)
MAX_ADDRS, _MAX_ADDR = 8, 256  # addresses a member gives, and the length of one (text)


def _amount(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and 0 <= v <= _MAX_AMOUNT


def valid_info(info: Any) -> bool:
    """A member's self-reported row is usable: resources and reservations are finite amounts
    in range, labels, addresses and allow-list patterns short strings, its code setting known. A row that is not is skipped (it never reaches placement)."""
    if (
        type(info) is not dict
        or len(info) > _MAX_INFO_KEYS
        or not all(type(k) is str and len(k) <= _MAX_LABEL for k in info)
    ):
        return False
    if not all(_amount(info[k]) for k in _RESOURCE_KEYS if k in info):
        return False
    labels = info.get("labels", {})
    if type(labels) is not dict or len(labels) > _MAX_LABELS:
        return False
    if not all(
        type(k) is str and type(v) is str and len(k) <= _MAX_LABEL and len(v) <= _MAX_LABEL for k, v in labels.items()
    ):
        return False
    addrs = info.get("addrs", [])
    if (
        type(addrs) is not list
        or len(addrs) > MAX_ADDRS
        or not all(type(a) is str and len(a) <= _MAX_ADDR for a in addrs)
    ):
        return False
    code = info.get("code", {})
    if type(code) is not dict or code.get("accept", "admins") not in ("admins", "members", "nobody"):
        return False
    allow = code.get("allow", [])
    if (
        type(allow) is not list
        or len(allow) > MAX_ALLOW
        or not all(type(a) is str and len(a) <= _MAX_LABEL for a in allow)
    ):
        return False
    load = info.get("load", {})
    if type(load) is not dict:
        return False
    reserved = load.get("reserved", {})
    if (
        not _amount(load.get("actors", 0))
        or type(reserved) is not dict
        or not all(k in _RESOURCE_KEYS and _amount(v) for k, v in reserved.items())
    ):
        return False
    return True


class Notary(Protocol):
    """Seals our own statements and checks a member's seal on its statement (see the module
    docstring); ``statement`` is the bytes :func:`statement` makes."""

    def seal(self, statement: bytes) -> Any: ...

    def admits(self, member_id: str, statement: bytes, proof: Any) -> bool: ...


def statement(member_id: str, incarnation: int, state: str, info: dict) -> bytes:
    """The bytes a member seals to say it is ``state`` (alive or left) in ``incarnation``."""
    return msgpack.packb(("lattica-membership/1", member_id, incarnation, state, info))


@dataclass(slots=True)
class Member:
    id: str
    incarnation: int = 0
    state: str = ALIVE
    info: dict = field(default_factory=dict)
    since: float = 0.0  # local time of the last state change
    proof: Any = None  # the member's seal on its newest alive/left statement we hold

    def __post_init__(self) -> None:
        if self.info is None:  # (None is taken for no info)
            self.info = {}


@dataclass(slots=True)
class MemberUp:
    member: Member


@dataclass(slots=True)
class MemberChanged:
    """A member's state (alive <-> suspect) or its info changed."""

    member: Member


@dataclass(slots=True)
class MemberDown:
    """Dead (a detector's verdict) or left (said goodbye)."""

    member: Member
    reason: str


@dataclass(slots=True)
class SelfDowned:
    """The mesh declared *us* dead (we were frozen or cut off): we refute and rejoin in a newer
    incarnation, but what the others did meanwhile stands (our supervised actors were restarted
    elsewhere), so the glue stops what would now be duplicates."""

    incarnation: int


class PhiAccrual:
    """Hayashibara et al.'s phi-accrual detector over the last heartbeat intervals."""

    def __init__(self, first_interval: float, min_std: float, acceptable_pause: float, window: int = 100) -> None:
        self._intervals: deque[float] = deque(maxlen=window)
        self._intervals.extend((first_interval - first_interval / 4, first_interval + first_interval / 4))
        self._min_std = min_std
        self._pause = acceptable_pause
        self.last: float | None = None
        self._heard = float("-inf")  # the member's other traffic: as alive as a heartbeat, not a sample

    def heartbeat(self, now: float) -> None:
        if self.last is not None:
            self._intervals.append(now - self.last)
        self.last = now

    def heard(self, at: float) -> None:
        """Bytes from the member arrived at ``at``: it is alive then (its heartbeats may be queued
        behind a large transfer on the same connection), without changing the interval statistics."""
        self._heard = max(self._heard, at)

    def silence(self, now: float) -> float:
        """Seconds since the member was last heard from (heartbeat or other traffic)."""
        return 0.0 if self.last is None else now - max(self.last, self._heard)

    def phi(self, now: float) -> float:
        if self.last is None:
            return 0.0
        n = len(self._intervals)
        mean = sum(self._intervals) / n
        var = sum((x - mean) ** 2 for x in self._intervals) / n
        std = max(math.sqrt(var), self._min_std)
        y = (now - max(self.last, self._heard) - mean - self._pause) / std
        # logistic approximation of the normal tail (as Akka does): -log10(P(later than now))
        e = math.exp(-y * (1.5976 + 0.070566 * y * y))
        p = e / (1.0 + e) if y > 0 else 1.0 - 1.0 / (1.0 + e)
        return -math.log10(max(p, 1e-300))


def _ring_key(member_id: str) -> bytes:
    return sha256(member_id.encode())


class Membership:
    """One node's view of the mesh; see the module docstring."""

    def __init__(
        self,
        me: str,
        info: dict | None = None,
        config: MembershipConfig | None = None,
        *,
        notary: Notary,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg = config or MembershipConfig()
        self._notary = notary
        self._left = False
        self.me = Member(me, 0, ALIVE, dict(info or {}))
        self._seal()
        self.members: dict[str, Member] = {}
        self._detectors: dict[str, PhiAccrual] = {}
        self._rumors: dict[str, int] = {}  # member id -> transmissions left
        self._rng = rng or random.Random()
        self._ring: list[str] | None = None
        self._sent_to: set[str] = set()  # our watchers as of the last tick
        self._welcome: set[str] = set()  # new members that get our full view at the next tick
        # whom we may send to (the glue: peers we are connected to); heartbeats, gossip and views
        # go only there, so membership never makes a node dial anyone
        self.reachable: Callable[[str], bool] = lambda member_id: True
        self._next_sync = 0.0
        self._downed_at = -1  # the newest incarnation in which we heard we were declared dead
        self._refuted = False  # we raised our incarnation to refute something this round
        self._jumped_at = float("-inf")  # when we last refuted an incarnation we never stated
        self._hearsay: dict[
            tuple[str, int, str], tuple[float, set[str]]
        ] = {}  # unconfirmed verdicts: first heard, by whom
        # members that must hear they were declared dead (still talking to us, or back in a newer
        # incarnation without having heard it), with the incarnation of the verdict
        self._tell_dead: dict[str, int] = {}
        # members some other member suspects or declared dead while they beat to us: they hear
        # it from us (as a suspicion), so they refute it where we cannot
        self._tell_suspected: dict[str, int] = {}

    # -- the view ---------------------------------------------------------------------------

    def alive(self) -> list[Member]:
        """Members believed up (alive or suspect), without ourselves."""
        return [m for m in self.members.values() if m.state in (ALIVE, SUSPECT)]

    def get(self, member_id: str) -> Member | None:
        return self.me if member_id == self.me.id else self.members.get(member_id)

    def update_info(self, info: dict) -> None:
        """Our own resources, labels or load changed: spread it in a newer incarnation (so an
        older statement of ours, replayed, never overrides it)."""
        self.me.info = dict(info)
        self.me.incarnation += 1
        self._seal()
        self._spread(self.me.id)

    def _seal(self) -> None:
        me = self.me
        me.proof = self._notary.seal(
            statement(me.id, me.incarnation, LEFT if self._left else ALIVE, {} if self._left else me.info)
        )

    # -- inputs -----------------------------------------------------------------------------

    def add(self, now: float, member_id: str) -> list:
        """A member we learned of by other means (a connection): alive until shown otherwise."""
        if member_id == self.me.id or member_id in self.members or len(self.members) >= MAX_MEMBERS:
            return []
        m = Member(member_id, 0, ALIVE, {}, now)
        self.members[member_id] = m
        self._ring = None
        self._spread(member_id)
        self._welcome.add(member_id)
        return [MemberUp(m)]

    def receive(self, now: float, sender: str, msg: Any) -> list:
        """A heartbeat or gossip message from ``sender``; returns events. Malformed parts are
        ignored (a peer's bad message costs only itself)."""
        if type(msg) is not dict:
            return []
        events: list = []
        if sender != self.me.id and sender not in self.members:
            events += self.add(now, sender)  # (and it gets our view at the next tick)
        elif sender in self.members and self.members[sender].state == DEAD:
            self._tell_dead[sender] = self.members[
                sender
            ].incarnation  # it must hear its verdict to refute it (and to know)
        if msg.get("hb") is True:  # the sender asks us to watch it (we are on its watcher list)
            m = self.members.get(sender)
            if m is not None and m.state in (ALIVE, SUSPECT):
                det = self._detectors.get(sender)
                if det is None:
                    det = self._detectors[sender] = PhiAccrual(
                        self.cfg.interval, self.cfg.min_std, self.cfg.acceptable_pause
                    )
                det.heartbeat(now)
        elif msg.get("unwatch") is True:  # it chose other watchers
            self._detectors.pop(sender, None)
        rumors = msg.get("rumors")
        if type(rumors) is list:
            for r in rumors[:_MAX_RUMORS]:
                events += self._rumor(now, r, sender)
        view = msg.get("view")
        if type(view) is list:
            for r in view[:_MAX_VIEW]:
                events += self._rumor(now, r, sender, spread=False)
        return events

    def _rumor(self, now: float, r: Any, sender: str, spread: bool = True) -> list:
        if type(r) is not list or len(r) != 5:
            return []
        mid, inc, state, info, proof = r
        if (
            type(mid) is not str
            or len(mid) > _MAX_ID
            or type(inc) is not int
            or not 0 <= inc < MAX_INCARNATION
            or type(state) is not str
            or state not in _RANK
            or not valid_info(info)
        ):
            return []
        own = state in (ALIVE, LEFT)  # the member's own statement: believed only under its seal
        if own:
            try:
                said = statement(mid, inc, state, info)
            except (OverflowError, TypeError, ValueError):  # (not encodable: nobody could have sealed it)
                return []
            if not self._notary.admits(mid, said, proof):
                return []
        if mid != sender and state != ALIVE and self._seen_alive(mid, now):
            # hearsay does not outweigh our own evidence (it beats to us), but the one who said
            # it holds it down until the member itself refutes, in a newer incarnation: tell it
            m = self.members.get(mid)
            if m is not None and inc == m.incarnation:
                self._tell_suspected[mid] = inc
            return []
        if mid == self.me.id:
            return self._about_us(now, inc, state, sender)
        m = self.members.get(mid)
        if not own:  # a suspicion or a verdict: some detector's finding, hearsay to us
            if m is None or mid == sender or inc > m.incarnation or not _overrides(inc, state, m.incarnation, m.state):
                # only a member raises its own incarnation: a verdict naming a newer one than we
                # know of it comes from no detector (and would leave it no room to refute)
                return []
            if state == DEAD and not self._heard_from_enough(now, mid, inc, state, sender):
                return []  # one member's word is not enough (and is not passed on until confirmed)
            return self._set(now, m, state, inc, m.info)
        if m is None:
            if state == LEFT or len(self.members) >= MAX_MEMBERS:
                return []  # the goodbye of a member we never knew: nothing to do (or no room)
            m = self.members[mid] = Member(mid, inc, state, info, now, proof)
            self._ring = None
            if spread:
                self._spread(mid)
            return [MemberUp(m)]
        if m.proof is None and state == ALIVE == m.state and inc == m.incarnation:
            m.info, m.proof = info, proof  # the first statement of a member we met by connection
            self._spread(mid)
            return [MemberChanged(m)]
        if not _overrides(inc, state, m.incarnation, m.state):
            return []
        m.proof = proof
        return self._set(now, m, state, inc, info or m.info)

    def _about_us(self, now: float, inc: int, state: str, sender: str) -> list:
        """A rumor about ourselves: a suspicion or verdict is refuted in a newer incarnation; our
        death, once two members say it, is also reported (SelfDowned)."""
        events: list = []
        if state == ALIVE or inc > self.me.incarnation + MAX_JUMP:
            return []  # nobody else can know a much newer incarnation of ours: forged
        # our death needs two members' word (one if no other is up): one liar cannot make us
        # stop our supervised actors
        if (
            state == DEAD
            and inc > self._downed_at
            and not self._left
            and self._heard_from_enough(now, self.me.id, inc, state, sender)
        ):
            self._downed_at = inc  # (told once per verdict, even if a suspicion was refuted first)
            events.append(SelfDowned(max(self.me.incarnation, inc + 1)))
        if inc >= self.me.incarnation and not self._left and not self._refuted:
            if inc > self.me.incarnation:
                # an incarnation this process never stated: the mesh remembers a previous run of
                # ours (a restart), or someone invents one. Jumped to at most once a minute, so
                # rows naming ever higher ones cannot drive ours towards MAX_INCARNATION.
                if now - self._jumped_at < _JUMP_EVERY:
                    return events
                self._jumped_at = now
            self.me.incarnation = inc + 1  # refute: we are alive, in a newer incarnation
            self._refuted = True  # (once a round: a refutation spreads; more rows cannot race it up)
            self._seal()
            self._spread(self.me.id)
        return events

    def _heard_from_enough(self, now: float, mid: str, inc: int, state: str, sender: str) -> bool:
        """A verdict about ``mid`` we have only by hearsay (or, about us, our death) counts once
        two different members said it (one when no other member is up to say it): a single
        member, lying or mistaken, cannot take a live node out of the mesh."""
        key = (mid, inc, state)
        heard = self._hearsay.pop(key, None)
        if heard is None or now - heard[0] > _HEARSAY_FOR:
            heard = (now, set())
        heard[1].add(sender)
        others = sum(1 for m in self.members.values() if m.id != mid and m.state in (ALIVE, SUSPECT))
        if len(heard[1]) >= min(2, max(others, 1)):
            return True
        self._hearsay[key] = heard  # (re)inserted last; bounded: the oldest is forgotten
        while len(self._hearsay) > _MAX_HEARSAY:
            del self._hearsay[next(iter(self._hearsay))]
        return False

    def _set(self, now: float, m: Member, state: str, inc: int, info: dict, reason: str | None = None) -> list:
        was, old_inc = m.state, m.incarnation
        m.state, m.incarnation, m.info, m.since = state, inc, info, now
        self._spread(m.id)
        if state in (DEAD, LEFT):
            self._ring = None
            self._detectors.pop(m.id, None)
            return [] if was in (DEAD, LEFT) else [MemberDown(m, reason or state)]
        if was in (DEAD, LEFT):  # back in a newer incarnation (a restarted or healed node)
            if was == DEAD:
                # it may have refuted a mere suspicion and never heard the verdict: tell it, so it
                # stops what was restarted elsewhere meanwhile (SelfDowned)
                self._tell_dead[m.id] = old_inc
            self._ring = None
            self._detectors.pop(m.id, None)
            return [MemberUp(m)]
        if state == ALIVE and was == SUSPECT:
            det = self._detectors.get(m.id)
            if det is not None:  # a fresh start: the pause that made us suspect is over
                self._detectors[m.id] = PhiAccrual(self.cfg.interval, self.cfg.min_std, self.cfg.acceptable_pause)
                self._detectors[m.id].last = now
        return [MemberChanged(m)]

    def _seen_alive(self, member_id: str, now: float) -> bool:
        """We have evidence of our own that ``member_id`` is up: it heartbeats to us and our
        detector holds it alive (its goodbye, were it leaving, would reach us directly)."""
        det = self._detectors.get(member_id)
        return det is not None and det.last is not None and det.phi(now) < self.cfg.phi_suspect

    def watched(self) -> list[str]:
        """The members whose heartbeats our detector judges."""
        return list(self._detectors)

    def heard(self, at: float, member_id: str) -> None:
        """Bytes from ``member_id`` arrived at ``at`` (loop time): evidence for our detector."""
        det = self._detectors.get(member_id)
        if det is not None:
            det.heard(at)

    def link_closed(self, member_id: str) -> list:
        """Our link to ``member_id`` was closed on purpose (by either side): its heartbeats can no
        longer reach us, so stop judging it on them. It picks other watchers at its next tick;
        the members still linked to it judge it from now on. A member we met by that link and
        never heard from (it runs no membership: an observer such as ``lattica status``; or one
        whose statement has not reached us yet) is forgotten with it, quietly: nobody else
        knows it from us, so nobody would ever judge it, and it is no verdict (no MemberDown:
        a real member's statement, when it comes, brings it back)."""
        self._detectors.pop(member_id, None)
        m = self.members.get(member_id)
        if m is None or m.proof is not None or m.state != ALIVE:
            return []
        del self.members[member_id]
        self._ring = None
        self._rumors.pop(member_id, None)
        self._welcome.discard(member_id)
        return []

    def suspect(self, now: float, member_id: str) -> list:
        """Evidence from outside the detector that ``member_id`` may be gone (its connection
        dropped and a redial failed): suspect it now; it is dead after ``suspect_timeout``
        unless it refutes."""
        m = self.members.get(member_id)
        if m is None or m.state != ALIVE:
            return []
        return self._set(now, m, SUSPECT, m.incarnation, m.info, "suspect")

    def declare_dead(self, now: float, member_id: str, reason: str) -> list:
        """Certain evidence from outside the detector (e.g. the connection was reset and a redial
        was refused): dead at once."""
        m = self.members.get(member_id)
        if m is None or m.state in (DEAD, LEFT):
            return []
        return self._set(now, m, DEAD, m.incarnation, m.info, reason)

    def leave(self) -> dict:
        """We are leaving: the message to send to everyone we can (watchers first)."""
        self._left = True
        self._seal()
        return {"rumors": [[self.me.id, self.me.incarnation, LEFT, {}, self.me.proof]]}

    # -- the clock ------------------------------------------------------------------------------

    def tick(self, now: float) -> tuple[list[tuple[str, dict]], list]:
        """Run the detector and produce this round's messages: ``([(to, message)], events)``."""
        events: list = []
        for mid, det in list(self._detectors.items()):
            m = self.members.get(mid)
            if m is None or m.state in (DEAD, LEFT):
                del self._detectors[mid]
                continue
            if m.state == ALIVE and (det.phi(now) > self.cfg.phi_suspect or det.silence(now) > self.cfg.max_silence):
                events += self._set(now, m, SUSPECT, m.incarnation, m.info, "suspect")
        for m in list(self.members.values()):
            if m.state == SUSPECT and now - m.since >= self.cfg.suspect_timeout:
                events += self._set(now, m, DEAD, m.incarnation, m.info, "unreachable")
            elif m.state in (DEAD, LEFT) and now - m.since >= self.cfg.forget_after:
                del self.members[m.id]
                self._rumors.pop(m.id, None)
        self._refuted = False
        out: list[tuple[str, dict]] = []
        if self._left:
            return out, events
        news = self._news()
        watchers = self._watchers()
        for mid in self._sent_to.difference(watchers):
            if mid in self.members and self.members[mid].state in (ALIVE, SUSPECT):
                out.append((mid, {"unwatch": True, "rumors": news}))
        self._sent_to = set(watchers)
        for mid in watchers:
            out.append((mid, {"hb": True, "rumors": news}))
        targets = [m.id for m in self.alive() if m.id not in self._sent_to and self.reachable(m.id)]
        for mid in self._rng.sample(targets, min(self.cfg.fanout, len(targets))):
            out.append((mid, {"rumors": news}))
        for mid, inc in self._tell_dead.items():
            m = self.members.get(mid)
            if m is not None and m.state != LEFT and self.reachable(mid):
                out.append((mid, {"rumors": [[m.id, inc, DEAD, m.info, None]]}))
        self._tell_dead.clear()
        for mid, inc in self._tell_suspected.items():
            m = self.members.get(mid)
            if m is not None and m.state in (ALIVE, SUSPECT) and m.incarnation == inc and self.reachable(mid):
                out.append((mid, {"rumors": [[mid, inc, SUSPECT, {}, None]]}))
        self._tell_suspected.clear()
        sync = [mid for mid in self._welcome if mid in self.members and self.reachable(mid)][:3]
        self._welcome.clear()
        if now >= self._next_sync and self.members:
            self._next_sync = now + self.cfg.sync_interval
            up = [m for m in self.alive() if self.reachable(m.id)]
            if up:
                sync.append(self._rng.choice(up).id)
        if sync:
            view = self.view()
            out += [(mid, {"view": view}) for mid in sync]
        return out, events

    def view(self) -> list:
        """Everything we believe, as rumors (for anti-entropy)."""
        rows = [_row(self.me)]
        rows += [_row(m) for m in self.members.values() if m.proof is not None or m.state in (SUSPECT, DEAD)]
        return rows[:_MAX_VIEW]

    # -- internals ------------------------------------------------------------------------------

    def _ring_order(self) -> list[str]:
        if self._ring is None:
            ids = [m.id for m in self.alive()] + [self.me.id]
            self._ring = sorted(ids, key=_ring_key)
        return self._ring

    def _watchers(self) -> list[str]:
        """The members we send heartbeats to: the next reachable ones on the ring."""
        ring = self._ring_order()
        n = len(ring)
        i = ring.index(self.me.id)
        out: list[str] = []
        for k in range(1, n):
            mid = ring[(i + k) % n]
            if self.reachable(mid):
                out.append(mid)
                if len(out) >= self.cfg.monitors:
                    break
        return out

    def _spread(self, member_id: str) -> None:
        n = len(self.members) + 1
        self._rumors[member_id] = 3 * max(1, math.ceil(math.log2(n + 1)))

    def _news(self) -> list:
        out = []
        for mid in list(self._rumors):
            m = self.get(mid)
            if m is None or (m.proof is None and m.state in (ALIVE, LEFT)):
                del self._rumors[mid]  # (a member we met by connection: its own statement is news)
                continue
            out.append(_row(m))
            self._rumors[mid] -= 1
            if self._rumors[mid] <= 0:
                del self._rumors[mid]
            if len(out) >= _MAX_RUMORS:
                break
        if not any(r[0] == self.me.id for r in out):  # always say who we are (joins, info)
            out.append(_row(self.me))
        return out


def _row(m: Member) -> list:
    """A member as a rumor: its own sealed statement when alive or left, a bare finding otherwise."""
    return [m.id, m.incarnation, m.state, m.info, m.proof if m.state in (ALIVE, LEFT) else None]


def _overrides(inc: int, state: str, cur_inc: int, cur_state: str) -> bool:
    """Whether a rumor ``(inc, state)`` replaces what we believe ``(cur_inc, cur_state)``."""
    if inc != cur_inc:
        return inc > cur_inc
    return _RANK[state] > _RANK[cur_state]
