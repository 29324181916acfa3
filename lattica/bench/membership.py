"""Membership in simulation: many ``Membership`` state machines on one simulated clock.

Messages take a random latency; each node ticks every ``interval`` with its own phase and a little
jitter. After the views converge, one node is killed (it stops sending and receiving) and the run
measures how long until every other node holds it dead; another node leaves cleanly. False
verdicts (a live node declared dead anywhere) are counted over the whole run.
"""

from __future__ import annotations

import heapq
import random
import statistics
import time
from typing import Any

from lattica._digest import sha256
from lattica._identity import KeyPair, verify_signature
from lattica._membership import DEAD, LEFT, MemberDown, Membership, MembershipConfig


class SimNotary:
    """Seals for simulated members named by plain strings: each name gets an Ed25519 key derived
    from it, statements are really signed and checked (each distinct one once, as a node's
    cache would), and every named member is admitted. One notary serves a whole simulation."""

    def __init__(self) -> None:
        self._keys: dict[str, KeyPair] = {}
        self._checked: dict[tuple, bool] = {}
        self.me = ""  # whose statements ``seal`` signs (see ``for_member``)

    def _key(self, name: str) -> KeyPair:
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = KeyPair.from_seed(sha256(name.encode()))
        return key

    def for_member(self, name: str) -> SimNotary:
        """The notary as seen by member ``name`` (sharing keys and the check cache)."""
        view = object.__new__(SimNotary)
        view._keys, view._checked, view.me = self._keys, self._checked, name
        return view

    def seal(self, statement: bytes) -> bytes:
        return self._key(self.me).sign(statement)

    def admits(self, member_id: str, statement: bytes, proof: Any) -> bool:
        if type(proof) is not bytes:
            return False
        key = (member_id, statement, proof)
        ok = self._checked.get(key)
        if ok is None:
            ok = self._checked[key] = verify_signature(self._key(member_id).public_key, proof, statement)
        return ok


def simulate(
    n: int = 200,
    *,
    seed: int = 1,
    latency: tuple[float, float] = (0.001, 0.02),
    jitter: float = 0.05,
    settle: float = 20.0,
    after: float = 10.0,
    config: MembershipConfig | None = None,
) -> dict[str, Any]:
    cfg = config or MembershipConfig()
    rng = random.Random(seed)
    ids = [f"n{i}" for i in range(n)]
    notary = SimNotary()
    nodes = {
        i: Membership(i, {"cpu": 4}, cfg, notary=notary.for_member(i), rng=random.Random(rng.random())) for i in ids
    }
    running = set(ids)
    heap: list = []
    seq = 0

    def push(t: float, kind: str, *data: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, data))

    for i in ids[1:]:  # everyone knows the first node; the rest comes from gossip
        nodes[i].add(0.0, ids[0])
    for i in ids:
        push(rng.uniform(0, cfg.interval), "tick", i)
    push(0.05, "check")
    false_downs = 0
    dead_seen: dict[str, float] = {}
    victim, leaver = ids[n // 2], ids[n // 3]
    t_kill = settle
    t_leave = settle + 0.25
    push(t_kill, "kill", victim)
    push(t_leave, "leave", leaver)
    end = settle + after
    converged_at = None
    messages = 0
    wall = time.perf_counter()

    def on_events(node_id: str, now: float, events: list) -> None:
        nonlocal false_downs
        for ev in events:
            if isinstance(ev, MemberDown):
                who = ev.member.id
                if who in running or (who == victim and now < t_kill) or (who == leaver and now < t_leave):
                    false_downs += 1

    while heap:
        now, _, kind, data = heapq.heappop(heap)
        if now > end:
            break
        if kind == "tick":
            (i,) = data
            if i not in running:
                continue
            out, events = nodes[i].tick(now)
            on_events(i, now, events)
            for to, msg in out:
                messages += 1
                push(now + rng.uniform(*latency), "msg", i, to, msg)
            push(now + cfg.interval * (1 + rng.uniform(-jitter, jitter)), "tick", i)
        elif kind == "msg":
            src, dst, msg = data
            if dst in running:
                on_events(dst, now, nodes[dst].receive(now, src, msg))
        elif kind == "kill":
            running.discard(data[0])
        elif kind == "leave":
            (i,) = data
            bye = nodes[i].leave()
            for to in list(nodes[i].members):
                push(now + rng.uniform(*latency), "msg", i, to, bye)
            running.discard(i)
        elif kind == "check":  # every 50 ms of simulated time
            push(now + 0.05, "check")
            if converged_at is None and now < t_kill and all(len(nodes[i].alive()) == n - 1 for i in ids):
                converged_at = now
            for gone, t0 in ((victim, t_kill), (leaver, t_leave)):
                if now >= t0 and gone not in dead_seen:
                    if all((m := nodes[i].get(gone)) is not None and m.state in (DEAD, LEFT) for i in running):
                        dead_seen[gone] = now - t0
    return {
        "bench": "membership-sim",
        "nodes": n,
        "converged_s": None if converged_at is None else round(converged_at, 2),
        "kill_known_by_all_s": None if victim not in dead_seen else round(dead_seen[victim], 2),
        "leave_known_by_all_s": None if leaver not in dead_seen else round(dead_seen[leaver], 2),
        "false_downs": false_downs,
        "messages_per_node_s": round(messages / n / end, 1),
        "wall_s": round(time.perf_counter() - wall, 1),
        "view_sizes_median": statistics.median(len(nodes[i].alive()) for i in running),
    }
