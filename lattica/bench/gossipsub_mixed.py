"""``lattica bench gossipsub-mixed``: GossipSub delivery latency in one topic shared by 6 nodes of
three implementations (issue 50): 2 go-libp2p (p2pd ``-pubsub``, go-libp2p-pubsub v0.10), 2
js-libp2p (peer.mjs, @libp2p/gossipsub 17) and 2 Lattica nodes, each in a process of its own on
127.0.0.1 (TCP); then, in the same run, the same topology with one implementation only (the
baselines).

The topology: the 6 nodes on a ring in the order go, Lattica, js, go, Lattica, js, each also
linked to the node opposite (``LINKS``): 3 links each, every ring link between two kinds, the
diameters between the two nodes of a kind. Every node's mesh then holds its 3 neighbours (fewer
than D_lo = 4 of all three), a publisher reaches 3 receivers itself (flood publishing) and the 2
others through one forwarder (the diameter is 2), so both a node's own sending and its
forwarding of the others' messages are measured. A full mesh of 6 would measure only a
publisher's own sending (everyone is everyone's neighbour).

Every node publishes ``messages`` messages of ``size`` bytes, one every ``gap`` seconds, the
publishers evenly staggered (the topic carries one message every gap / 6 s), after the meshes
formed and a warm-up round. Each message carries its publish time: the wall clock read by the
publisher's own process just before its publish call (Lattica: ``lattica.pubsub.publish`` in the
node's process; js: ``pubsub.publish`` in peer.mjs; go: the request written to the daemon's
control socket by the go node's agent, a Python process of its own). Each receiver takes the
receive time as the message reaches the application: Lattica in its subscription's handler on
the node loop, js on GossipSub's 'message' event in peer.mjs, go as its agent reads the message
from the daemon's subscription socket (one unix-socket hop and a Python wake-up more than go's
own subscriber would see: it counts against go). Latency = receive - publish for every (message,
receiver) pair, all on one machine's CLOCK_REALTIME: js reads it as performance.timeOrigin plus
performance.now() (sub-µs), Python as time.time_ns(); js's offset from ours is measured before
and after and printed. go and Lattica also give a node's subscribers its own messages (js does
not: emitSelf off): those are left out.

The notes row of each case: seconds until every node had its neighbours' subscriptions (and, where
it shows them, meshes), js's clock minus ours, CPU per node and per message the topic carried
during the measured round (a go node's is p2pd's and its agent's), and each Lattica node's
delivered/received copies and, on a topic open to strangers, the strangers' RPCs it refused
unread (counted by wrapping the service's ``Strangers.admit``: a diagnostic, nothing else
changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from lattica.bench._peers.js_peer import JsPeer, LinePeer

TOPIC = "lattica-bench-gossipsub"
KINDS = ("go", "lattica", "js")
MIXED = ("go", "lattica", "js", "go", "lattica", "js")  # the ring's order
# the ring and its 3 diameters; the first of a pair dials the second (each kind dials and is dialed)
LINKS = ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0), (0, 3), (1, 4), (2, 5))
# case -> (the 6 nodes' implementations in ring order, the Lattica nodes' mode: _LatticaAgent)
CASES: dict[str, tuple[tuple[str, ...], str]] = {
    # as docs/pubsub.md has it: the libp2p nodes are strangers, the topic is opened to them
    "mixed": (MIXED, "strangers"),
    # every libp2p node a member of the Lattica nodes' mesh (mesh="open"): no strangers' budgets
    "mixed-open": (MIXED, "open"),
    "go": (("go",) * 6, "strangers"),
    "js": (("js",) * 6, "strangers"),
    "lattica": (("lattica",) * 6, "strangers"),
}
HEAD = 13  # a message's first bytes: its publish time (8, big-endian ns), tag (1), index (4)
ROUND = 16  # a tag is round * ROUND + the publisher's place in the ring
LISTEN_TCP = "/ip4/127.0.0.1/tcp/0"


def neighbours(i: int, links: tuple[tuple[int, int], ...] = LINKS) -> set[int]:
    return {b for a, b in links if a == i} | {a for a, b in links if b == i}


# -- the agents: one process per node ------------------------------------------------------------


class _Agent:
    """The operations a node's process answers, as peer.mjs has them (``LinePeer``): subscribe,
    dial, peers, paced (the publisher, started at once) and paced_done, messages (the receive
    log, taken), clock, stats; run on one asyncio loop."""

    def __init__(self) -> None:
        self.received: list[tuple[int, str, bytes]] = []  # (receive time ns, author, head of data)
        self._pacing: asyncio.Task | None = None

    async def publish(self, topic: str, data: bytes) -> None:
        raise NotImplementedError

    async def op_paced(self, topic: str, start_ns: str, gap_ns: str, count: int, tag: int, size: int) -> dict:
        self._pacing = asyncio.get_running_loop().create_task(
            self._paced(topic, int(start_ns), int(gap_ns), count, tag, size)
        )
        return {}

    async def _paced(self, topic: str, start_ns: int, gap_ns: int, count: int, tag: int, size: int) -> dict:
        published, errors = 0, []
        pad = bytes(max(size - HEAD, 0))
        for i in range(count):
            wait = (start_ns + i * gap_ns - time.time_ns()) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            data = time.time_ns().to_bytes(8, "big") + bytes((tag,)) + i.to_bytes(4, "big") + pad
            try:
                await self.publish(topic, data)
                published += 1
            except Exception as e:  # noqa: BLE001 -- counted and reported, the schedule goes on
                errors.append(f"{type(e).__name__}: {e}")
        return {"published": published, "errors": errors[:5]}

    async def op_paced_done(self) -> dict:
        assert self._pacing is not None
        result: dict = await self._pacing
        return result

    async def op_messages(self, topic: str) -> dict:
        taken, self.received = self.received, []
        return {"messages": [{"from": a, "data_hex": d.hex(), "t_ns": str(t)} for t, a, d in taken]}

    async def op_clock(self) -> dict:
        return {"t_ns": str(time.time_ns())}

    async def op_stats(self) -> dict:
        return {}


class _GoAgent(_Agent):
    """A p2pd with GossipSub, driven through its control socket: publishes on one control
    connection held open (the daemon answers request after request on it), reads its
    subscription's socket in a task of its own."""

    def __init__(self, p2pd: pathlib.Path) -> None:
        super().__init__()
        from lattica.bench._peers.p2pd import daemon  # (the agent's process only)

        self._cm = daemon(p2pd, (LISTEN_TCP,), flags=("-pubsub",))
        self.d = self._cm.__enter__()
        self._control: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._reading: asyncio.Task | None = None

    async def hello(self) -> dict:
        peer, addrs = await self.d.identify()
        self.peer = peer
        return {"peer": str(peer), "addrs": [str(a.with_peer_id(peer)) for a in addrs]}

    async def op_subscribe(self, topic: str) -> dict:
        sub = await self.d.ps_subscribe(topic)

        async def read() -> None:
            while True:
                author, _, data = await sub.next(timeout=1e6)
                self.received.append((time.time_ns(), str(author), data[:HEAD]))

        self._reading = asyncio.get_running_loop().create_task(read())
        return {}

    async def op_dial(self, addr: str) -> dict:
        from lattica._multiaddr import Multiaddr  # (in the agent's own process only)

        ma = Multiaddr(addr)
        assert ma.peer_id is not None, addr
        await self.d.connect(ma.peer_id, [ma.without_peer_id()])
        return {"peer": str(ma.peer_id)}

    async def op_peers(self, topic: str) -> dict:
        return {"subscribers": [str(p) for p in await self.d.ps_peers(topic)], "mesh": None}

    async def publish(self, topic: str, data: bytes) -> None:
        from lattica._protobuf import decode_fields, encode_fields, uvarint  # (in the agent's own process only)
        from lattica.bench._peers.p2pd import PS_PUBLISH, PUBSUB, read_delimited  # (in the agent's own process only)

        if self._control is None:
            self._control = await asyncio.open_unix_connection(str(self.d.control))
        reader, writer = self._control
        body = encode_fields([(1, PUBSUB), (8, encode_fields([(1, PS_PUBLISH), (2, topic.encode()), (3, data)]))])
        writer.write(uvarint(len(body)) + body)
        resp = decode_fields(await read_delimited(reader))
        if resp.get(1) != 0:
            raise RuntimeError(f"p2pd refused the publish: {resp!r}")

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


class _LatticaAgent(_Agent):
    """A Lattica node on the topic, receiving in a handler on its loop. ``mode``: ``strangers``, a
    libp2p topic open to strangers; ``open``, the same with ``mesh="open"``, every libp2p node a
    member (no strangers' budgets); ``native``, our own pub-sub between Lattica nodes (no libp2p
    topic: what ``lattica.pubsub`` does by default)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        import lattica  # (in the agent's own process only)
        from lattica.config import PubSubConfig  # (in the agent's own process only)

        self.admitted: dict[str, int] = {}  # strangers' RPCs looked at, per peer
        self.refused: dict[str, int] = {}  # ... and of them dropped unread

        if mode == "native":
            cfg = PubSubConfig(discover=False)
        else:
            cfg = PubSubConfig(libp2p_topics=(TOPIC,), open_topics=(TOPIC,), discover=False)
        self.node = lattica.Node(
            [LISTEN_TCP], membership=False, crdt=False, pubsub=cfg, mesh="open" if mode == "open" else None
        ).start()

    async def hello(self) -> dict:
        return {"peer": str(self.node.peer_id), "addrs": [str(a) for a in self.node.addrs]}

    def _on(self, msg: Any) -> None:
        self.received.append((time.time_ns(), msg.author, bytes(msg.data[:HEAD])))

    async def op_messages(self, topic: str) -> dict:
        self.received = [(t, str(a), d) for t, a, d in self.received]  # (str(PeerId) off the handler)
        return await super().op_messages(topic)

    async def op_subscribe(self, topic: str) -> dict:
        import lattica  # (in the agent's own process only)

        lattica.pubsub.subscribe(topic, handler=self._on, node=self.node)
        self._count_refusals()
        return {}

    def _count_refusals(self) -> None:
        """Count the strangers' RPCs the service drops unread (over the strangers' batch
        budgets, ``actors/pubsub/strangers.py``): a diagnostic, by wrapping its ``admit``."""
        strangers: Any = getattr(self._svc(), "_strangers", None)
        admit = getattr(strangers, "admit", None)
        if admit is None:
            return

        def counted(peer: Any) -> bool:
            ok: bool = admit(peer)
            self.admitted[str(peer)] = self.admitted.get(str(peer), 0) + 1
            if not ok:
                self.refused[str(peer)] = self.refused.get(str(peer), 0) + 1
            return ok

        strangers.admit = counted

    async def op_dial(self, addr: str) -> dict:
        info = await self.node.aconnect(addr)
        return {"peer": str(info.peer_id)}

    def _svc(self) -> Any:
        from lattica.bench import host_of  # (in the agent's own process only)

        return host_of(self.node).services.pubsub

    async def op_peers(self, topic: str) -> dict:
        svc = self._svc()
        return {
            "subscribers": sorted(str(p) for p in svc.router.topics.get(topic, ())),
            "mesh": [str(p) for p in svc.peers(topic)],
        }

    async def publish(self, topic: str, data: bytes) -> None:
        import lattica  # (in the agent's own process only)

        await lattica.pubsub.publish(topic, data, node=self.node)

    async def op_stats(self) -> dict:
        """The service's counters; the strangers' RPCs looked at and refused since the last call."""
        s = self._svc().stats()
        figures = {k: s[k] for k in ("published", "delivered", "copies", "rejected", "dropped_to_peers")}
        out = {**figures, "strangers_rpcs": self.admitted, "refused": self.refused}
        self.admitted, self.refused = {}, {}
        return out

    def close(self) -> None:
        self.node.stop()


def _serve(kind: str, arg: str) -> None:
    """``python -m lattica.bench.gossipsub_mixed go P2PD | lattica strangers|open|native``: one node's agent,
    answering peer.mjs's protocol on stdin/stdout until ``stop`` or the end of stdin."""
    agent: _GoAgent | _LatticaAgent
    if kind == "go":
        agent = _GoAgent(pathlib.Path(arg))
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        def submit(coro: Coroutine[Any, Any, dict]) -> dict:
            return asyncio.run_coroutine_threadsafe(coro, loop).result()
    else:
        agent = _LatticaAgent(arg)
        node = agent.node

        def submit(coro: Coroutine[Any, Any, dict]) -> dict:
            return node.run(coro)

    try:
        _say(submit(agent.hello()))
        for line in sys.stdin:
            req = json.loads(line)
            rid, op = req.pop("id"), req.pop("op")
            if op == "stop":
                _say({"id": rid, "ok": {}})
                break
            try:
                _say({"id": rid, "ok": submit(getattr(agent, f"op_{op}")(**req))})
            except Exception as e:  # noqa: BLE001 -- the driver is told
                _say({"id": rid, "error": f"{type(e).__name__}: {e}"})
    finally:
        agent.close()


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# -- the driver ----------------------------------------------------------------------------------


class _PyAgent(LinePeer):
    what = "a gossipsub-mixed agent"


@contextlib.contextmanager
def _agent(kind: str, found: dict[str, pathlib.Path], mode: str) -> Iterator[LinePeer]:
    me = [sys.executable, "-m", "lattica.bench.gossipsub_mixed"]
    peer: LinePeer
    if kind == "go":
        peer = _PyAgent([*me, "go", str(found["go"])])
    elif kind == "lattica":
        peer = _PyAgent([*me, "lattica", mode])
    else:
        peer = JsPeer(found["js"], {"gossipsub": True})
    try:
        yield peer
    finally:
        peer.close()


def _tcp(peer: LinePeer) -> str:
    return next(a for a in peer.addrs if "/tcp/" in a)


def _ready(agents: list[LinePeer], links: tuple[tuple[int, int], ...]) -> bool:
    """Every node knows its neighbours subscribe, and has them in its mesh where it says."""
    for i, a in enumerate(agents):
        want = {agents[j].peer_id for j in neighbours(i, links)}
        got = a.call("peers", topic=TOPIC)
        if not want <= set(got["subscribers"]) or (got["mesh"] is not None and not want <= set(got["mesh"])):
            return False
    return True


def _clock_offset_us(peer: LinePeer) -> tuple[float, float]:
    """The peer's clock minus ours (time.time_ns), µs, from the tightest of 5 bracketed reads;
    and that read's half round trip, its uncertainty."""
    best: tuple[float, float] | None = None
    for _ in range(5):
        t0 = time.time_ns()
        t = int(peer.call("clock")["t_ns"])
        t1 = time.time_ns()
        cand = ((t - (t0 + t1) / 2) / 1e3, (t1 - t0) / 2e3)
        if best is None or cand[1] < best[1]:
            best = cand
    assert best is not None
    return best


def _round(
    agents: list[LinePeer], rnd: int, count: int, gap: float, size: int, drain: float, publishers: tuple[int, ...]
) -> list[list[dict]]:
    """Every node of ``publishers`` publishes ``count`` messages, paced and staggered, tagged with
    round ``rnd``; what every node received (until each has the others' messages of the round, or
    ``drain`` s after the last was published)."""
    n = len(publishers)
    gap_ns = int(gap * 1e9)
    start = time.time_ns() + int(0.3e9)
    for k, i in enumerate(publishers):
        agents[i].call(
            "paced",
            topic=TOPIC,
            start_ns=str(start + k * gap_ns // n),  # (a string: js's JSON numbers are doubles)
            gap_ns=str(gap_ns),
            count=count,
            tag=rnd * ROUND + i,
            size=size,
        )
    deadline = time.monotonic() + 0.3 + count * gap + 30
    for i in publishers:
        done = agents[i].call("paced_done", timeout=max(deadline - time.monotonic(), 1))
        if done["published"] != count:
            raise RuntimeError(f"node {i} published {done['published']} of {count}: {done['errors']}")
    got: list[list[dict]] = [[] for _ in agents]
    have: list[set[tuple[int, int]]] = [set() for _ in agents]
    wants = [count * sum(1 for p in publishers if p != i) for i in range(len(agents))]
    until = time.monotonic() + drain
    while True:
        for i, a in enumerate(agents):
            for r in a.call("messages", topic=TOPIC)["messages"]:
                got[i].append(r)
                _, tag, idx = _head(r)
                if tag // ROUND == rnd and tag % ROUND != i:
                    have[i].add((tag, idx))
        if all(len(h) >= w for h, w in zip(have, wants)) or time.monotonic() > until:
            return got
        time.sleep(0.1)


def _head(record: dict) -> tuple[int, int, int]:
    """A received message's publish time (ns), tag and index."""
    head = bytes.fromhex(record["data_hex"][: 2 * HEAD])
    return int.from_bytes(head[:8], "big"), head[8], int.from_bytes(head[9:13], "big")


def _pct(values: list[float], q: float) -> float:
    return values[min(int(len(values) * q), len(values) - 1)]


def _figures(
    case: str,
    kinds: tuple[str, ...],
    got: list[list[dict]],
    rnd: int,
    count: int,
    links: tuple[tuple[int, int], ...],
    publishers: tuple[int, ...],
) -> Iterator[dict[str, Any]]:
    """Rows: every (message, receiver) pair, then per publisher kind -> receiver kind (the mixed
    case), then per hop count (the receiver the publisher's neighbour or not). ``dup``: copies
    the application was given twice; ``late``: messages of the warm-up round still arriving."""
    n = len(kinds)
    seen: set[tuple[int, int, int]] = set()
    groups: dict[str, list[float]] = defaultdict(list)
    wants: dict[str, int] = defaultdict(int)
    dups: dict[str, int] = defaultdict(int)
    late = 0

    def names(src: int, dst: int) -> tuple[str, str, str]:
        return "all", f"{kinds[src]}->{kinds[dst]}", "1 hop" if dst in neighbours(src, links) else "2 hops"

    for src in publishers:
        for dst in range(n):
            if src != dst:
                for g in names(src, dst):
                    wants[g] += count
    for dst, records in enumerate(got):
        for r in records:
            t_pub, tag, idx = _head(r)
            src = tag % ROUND
            if tag // ROUND != rnd:
                late += 1
                continue
            if src >= n:
                raise RuntimeError(f"node {dst} was given a message it cannot have: {r}")
            if src == dst:
                continue  # (go and Lattica give a node's subscribers its own messages too)
            if (src, idx, dst) in seen:
                for g in names(src, dst):
                    dups[g] += 1
                continue
            seen.add((src, idx, dst))
            for g in names(src, dst):
                groups[g].append((int(r["t_ns"]) - t_pub) / 1e3)
    order = ["all"] + ([f"{a}->{b}" for a in KINDS for b in KINDS] if len(set(kinds)) > 1 else []) + ["1 hop", "2 hops"]
    for g in order:
        lat = sorted(groups[g])
        row: dict[str, Any] = {
            "bench": "gossipsub-mixed",
            "case": case,
            "pairs": g,
            "delivered": f"{len(lat)}/{wants[g]}",
            "p50_us": round(_pct(lat, 0.5)) if lat else None,
            "p99_us": round(_pct(lat, 0.99)) if lat else None,
            "max_us": round(lat[-1]) if lat else None,
            "dup": dups[g],
        }
        if g == "all":
            row["late"] = late
        yield row


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` and its children (a go agent's p2pd) have used; 0 where
    /proc cannot tell."""
    total = 0.0
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids = [pid, *map(int, f.read().split())]
        for p in pids:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0.0
    return total


def run_topology(
    case: str,
    kinds: tuple[str, ...],
    mode: str,
    links: tuple[tuple[int, int], ...],
    publishers: tuple[int, ...],
    found: dict[str, pathlib.Path],
    messages: int = 100,
    gap: float = 0.2,
    size: int = 128,
    warmup: int = 10,
    progress: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Nodes of ``kinds`` (the Lattica ones in ``mode``) linked as ``links``, the nodes of
    ``publishers`` publishing; the rows of ``_figures``, then a row of notes: seconds to a formed
    mesh, js's clock against ours, CPU per message per kind, the Lattica nodes' counters (and the
    strangers' RPCs they dropped unread)."""
    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        agents = [stack.enter_context(_agent(k, found, mode)) for k in kinds]
        for a in agents:
            a.call("subscribe", topic=TOPIC)
        for i, j in links:
            agents[i].call("dial", addr=_tcp(agents[j]))
        deadline = time.monotonic() + 30
        while not _ready(agents, links):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{case}: the nodes never saw their neighbours' subscriptions")
            time.sleep(0.1)
        time.sleep(2.0)  # (two heartbeats: go's meshes, which p2pd does not show, fill)
        ready_s = time.monotonic() - t0
        if progress:
            progress(
                f"{case}: {' '.join(kinds)} meshed in {ready_s:.1f} s; {min(warmup, messages)} each to warm up, then {messages}"
            )
        clocks = [_clock_offset_us(a) for a, k in zip(agents, kinds) if k == "js"]
        _round(agents, 0, min(warmup, messages), gap, size, 10, publishers)
        stats0 = [a.call("stats") if k == "lattica" else {} for a, k in zip(agents, kinds)]
        cpu0 = [_cpu_s(a.proc.pid) for a in agents]
        got = _round(agents, 1, messages, gap, size, 10, publishers)
        cpu = [_cpu_s(a.proc.pid) - c for a, c in zip(agents, cpu0)]
        stats = [a.call("stats") if k == "lattica" else {} for a, k in zip(agents, kinds)]
        clocks += [_clock_offset_us(a) for a, k in zip(agents, kinds) if k == "js"]
    yield from _figures(case, kinds, got, 1, messages, links, publishers)
    notes: dict[str, Any] = {"bench": "gossipsub-mixed", "case": case, "pairs": "notes", "ready_s": round(ready_s, 1)}
    if clocks:
        notes["js_clock_minus_ours_us"] = [f"{o:+.0f}±{u:.0f}" for o, u in clocks]
    if any(cpu):
        notes["cpu_ms_per_msg"] = {  # (during the measured round, per node, per message the topic carried)
            k: round(
                1e3 * sum(c for c, kk in zip(cpu, kinds) if kk == k) / kinds.count(k) / (len(publishers) * messages), 2
            )
            for k in KINDS
            if k in kinds
        }
    kind_of = {a.peer_id: k for a, k in zip(agents, kinds)}
    for s0, s, k in zip(stats0, stats, kinds):
        if k != "lattica":
            continue
        notes.setdefault("lattica_delivered_copies", []).append(
            f"{s['delivered'] - s0['delivered']}/{s['copies'] - s0['copies']}"
        )
        if s["strangers_rpcs"]:  # (during the measured round)
            looked: dict[str, int] = defaultdict(int)
            refused: dict[str, int] = defaultdict(int)
            for peer, n in s["strangers_rpcs"].items():
                looked[kind_of.get(peer, "?")] += n
            for peer, n in s["refused"].items():
                refused[kind_of.get(peer, "?")] += n
            notes.setdefault("lattica_strangers_rpcs_refused", []).append(
                ", ".join(f"{k} {refused[k]}/{looked[k]}" for k in sorted(looked))
            )
        for key in ("rejected", "dropped_to_peers"):
            if s[key] - s0[key]:
                notes.setdefault(f"lattica_{key}", []).append(s[key] - s0[key])
    yield notes


def bench_gossipsub_mixed(
    found: dict[str, pathlib.Path],
    cases: tuple[str, ...] = tuple(CASES),
    messages: int = 100,
    gap: float = 0.2,
    size: int = 128,
    progress: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Each case's rows, in the order of ``cases`` (``CASES``: the mixed topic as documented, the
    mixed topic in an open mesh, then the one-implementation baselines)."""
    if size < HEAD:
        raise ValueError(f"a message carries its publish time, publisher and index: at least {HEAD} bytes")
    for case in cases:
        kinds, mode = CASES[case]  # (6 nodes linked as LINKS, every one publishing)
        yield from run_topology(
            case, kinds, mode, LINKS, tuple(range(len(kinds))), found, messages, gap, size, 10, progress
        )


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
