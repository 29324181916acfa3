"""``lattica bench attack``: what strangers can cost an honest member (issue 46). A victim node in
a process of its own; two members in this one measure, round after round, a call to an actor on
the victim, a DHT lookup through it (the providers of a key one member provides), a content
``have`` of 16 CIDs and a pub-sub delivery from one member to the other through it; quiet, then
while a third process attacks the victim as 1, 8 and 64 stranger identities (each a node of a
mesh of its own), one attack at a time, and a control ("cpu": the attackers' process busy
without sending anything). Per phase: each measure's p99, how many were lost (failed,
undelivered, or the member hidden among providers), the victim's and the attackers' shares of
one core while it was measured, and the victim's resident memory.

Everything runs on 127.0.0.1, where the per-IP budgets (handshakes, hinted dials) stand aside: the
figures are those of identities spread over many addresses, the attacker's best case. The
attackers get a core of their own (``split_cores``; ``--shared-cores``: not), as if they ran on
another machine."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from lattica import codec, dht, pubsub
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._node import Node
from lattica._remote import actor
from lattica.actors.content import content_ref
from lattica.actors.dht.actor import dht_ref
from lattica.actors.pubsub import pubsub_ref
from lattica.actors.pubsub.bundle import Bundle
from lattica.bench import host_of, runtime_of
from lattica.bench.rpc import spawn_on
from lattica.config import ContentConfig, PubSubConfig
from lattica.content._cid import Cid
from lattica.dht._records import Entry, entry_to_wire
from lattica.errors import LatticaError
from lattica.trust import MeshKey

__all__ = ["ATTACKS", "bench_attack", "Echo"]

# "cpu": the control. The attackers' process busy on its own, sending nothing: what sharing the
# machine's 2 cores with any busy process costs the victim (the floor under every other figure)
ATTACKS = ("cpu", "have", "calls", "pubsub", "streams", "sockets", "store", "providers")
IDENTITIES = (1, 8, 64)
OPEN_TOPIC = "bench-attack-open"  # open to strangers on the victim (the pub-sub attack's target)
TOPIC = "bench-attack-members"  # the members' delivery is measured on this one
LOOKUP_KEY = b"bench-attack-providers"  # a member provides it; strangers crowd it in "providers"
_LOOPBACK = "/ip4/127.0.0.1/tcp/0"


@actor
class Echo:
    """What the member calls on the victim."""

    async def ping(self) -> int:
        return 1


# -- the victim (its own process) ------------------------------------------------------------------


def _cores(split: bool) -> tuple[set[int] | None, set[int] | None]:
    """(the victim's and members' cores, the attackers' cores): with ``split`` and two or more
    cores, the last for the attackers, the rest for the others (as if the attackers ran on a
    machine of their own); else (None, None): everyone shares every core."""
    if not split or not hasattr(os, "sched_getaffinity"):
        return None, None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, None
    return set(cores[:-1]), {cores[-1]}


def _pin(cores: set[int] | None) -> None:
    """Keep this thread, and the threads it starts from now on, on ``cores`` (None: as it is)."""
    if cores is not None:
        os.sched_setaffinity(0, cores)


def _victim(mesh: str, pipe: Any, cores: set[int] | None = None) -> None:

    _pin(cores)
    node = Node(
        [_LOOPBACK],
        mesh=MeshKey.from_text(mesh),
        allow=["lattica.bench.attack.*"],
        pubsub=PubSubConfig(open_topics=(OPEN_TOPIC,)),
        content=ContentConfig(blocks="memory"),
    ).start()
    pubsub.subscribe(OPEN_TOPIC, handler=lambda m: None, node=node)
    pubsub.subscribe(TOPIC, handler=lambda m: None, node=node)  # (the members' messages go through it)
    pipe.send(str(node.addrs[0]))
    while pipe.recv() != "stop":
        pass
    node.stop()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds ``pid`` has used (proc(5): fields 14 and 15 of its stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()  # (after the command name, which may hold spaces)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measured(members: _Members, pid: int, seconds: float, attackers: int | None = None) -> dict[str, Any]:
    """The members' measures for ``seconds``, with the victim's share of one core meanwhile
    (what the phase cost the victim itself, apart from the machine's two cores being shared)
    and the attackers' (what they took of the two cores the victim and the members share)."""
    pids = {"victim": pid, **({"attackers": attackers} if attackers is not None else {})}
    cpu, t0 = {k: _cpu_seconds(p) for k, p in pids.items()}, time.monotonic()
    got = members.measure(seconds)
    took = time.monotonic() - t0
    for k, p in pids.items():
        got[f"{k}_cpu_pct"] = round(100 * (_cpu_seconds(p) - cpu[k]) / took, 1)
    got["victim_rss_mb"] = round(_rss_mb(pid), 1)
    return got


# -- the attackers (another process) ---------------------------------------------------------------


def _attackers(kind: str, n: int, victim: str, seconds: float, pipe: Any, cores: set[int] | None = None) -> None:

    _pin(cores)
    addr = Multiaddr(victim)
    listen = [_LOOPBACK] if kind == "providers" else []  # (a provider record is kept only for a dialable peer)
    nodes = [
        Node(listen, mesh=MeshKey.generate(), pubsub=False, content=False, membership=False).start() for _ in range(n)
    ]
    try:
        for s in nodes:
            s.connect(addr)
        pipe.send("ready")
        end = time.monotonic() + seconds
        futs = [asyncio.run_coroutine_threadsafe(_ATTACK[kind](s, addr, end), host_of(s).loop) for s in nodes]
        for f in futs:
            with contextlib.suppress(Exception):
                f.result(seconds + 30)
    finally:
        for s in nodes:
            s.stop()
        pipe.send("done")


async def _calls_at_once(end: float, at_once: int, one: Callable[[int], Any]) -> None:

    async def worker(w: int) -> None:
        i = 0
        while time.monotonic() < end:
            try:
                await one(w * 1_000_000 + i)
            except (TimeoutError, LatticaError):
                await asyncio.sleep(0.01)  # (refused: ask again, as a flood does)
            i += 1

    await asyncio.gather(*(worker(w) for w in range(at_once)))


async def _have(s: Any, addr: Any, end: float) -> None:

    cids = [Cid.of(os.urandom(8)).bytes for _ in range(1024)]
    ref = content_ref(addr.peer_id)
    await _calls_at_once(end, 4, lambda i: s._host.runtime.call(ref, "have", (cids,), {}, timeout=10))


async def _calls(s: Any, addr: Any, end: float) -> None:

    ref = dht_ref(addr.peer_id)
    await _calls_at_once(end, 32, lambda i: s._host.runtime.call(ref, "ping", (), {}, timeout=10))


async def _pubsub(s: Any, addr: Any, end: float) -> None:

    authors = [KeyPair.generate() for _ in range(16)]  # throwaway author keys
    ref = pubsub_ref(addr.peer_id)
    body = b"".join(bytes(c) for c in codec.encode("flood"))

    def batch() -> list:
        out = []
        for i in range(256):
            kp, seqno = authors[i % 16], time.time_ns() + i
            signed = Bundle([body], [])
            out.append(
                [
                    OPEN_TOPIC,
                    kp.peer_id.to_bytes(),
                    seqno,
                    [body],
                    kp.sign(signed.signed_bytes(OPEN_TOPIC, kp.peer_id.to_bytes(), seqno)),
                ]
            )
        return [[], out, [], [], [], [], []]

    await _calls_at_once(end, 2, lambda i: s._host.runtime.call(ref, "open_rpc", (batch(),), {}, timeout=10))


async def _streams(s: Any, addr: Any, end: float) -> None:

    while time.monotonic() < end:
        try:
            conn = s._host.conns.get(addr.peer_id)
            if conn is None or conn.is_closed:
                await s._host.connect([addr], addr.peer_id, 10.0)
                continue
            for _ in range(200):
                (await conn.open_stream()).reset()
        except LatticaError:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.005)


async def _sockets(s: Any, addr: Any, end: float) -> None:
    host, port = addr.without_peer_id().host_port()
    held: list[asyncio.StreamWriter] = []
    while time.monotonic() < end:  # 16 silent sockets per identity, renewed before the node's 3 s
        for _ in range(16):
            with contextlib.suppress(OSError):
                held.append((await asyncio.open_connection(host, port))[1])
        await asyncio.sleep(2.0)
        while len(held) > 32:
            held.pop(0).close()
    for w in held:
        w.close()


async def _store(s: Any, addr: Any, end: float) -> None:

    ref, value = dht_ref(addr.peer_id), os.urandom(16 * 1024)
    me = str(s.peer_id).encode()

    def one(i: int) -> Any:
        return s._host.runtime.call(
            ref,
            "store",
            (b"junk/" + me + b"/%d" % i, entry_to_wire(b"", Entry(value, time.time() + 86_000))),
            {},
            timeout=10,
        )

    await _calls_at_once(end, 8, one)


async def _providers(s: Any, addr: Any, end: float) -> None:

    with contextlib.suppress(LatticaError):
        await s._host.runtime.call(dht_ref(addr.peer_id), "add_provider", (LOOKUP_KEY, 3600.0), {}, timeout=10)
    while time.monotonic() < end:
        await asyncio.sleep(0.1)


async def _cpu(s: Any, addr: Any, end: float) -> None:
    while time.monotonic() < end:
        sum(range(20_000))  # (about a millisecond of work between yields)
        await asyncio.sleep(0)


_ATTACK: dict[str, Callable[[Any, Any, float], Any]] = {
    "cpu": _cpu,
    "have": _have,
    "calls": _calls,
    "pubsub": _pubsub,
    "streams": _streams,
    "sockets": _sockets,
    "store": _store,
    "providers": _providers,
}


@contextlib.contextmanager
def _attacking(kind: str, n: int, victim: str, seconds: float, cores: set[int] | None) -> Iterator[int]:
    """The attackers' process, attacking (yields its pid)."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_attackers, args=(kind, n, victim, seconds, theirs, cores), daemon=True)
    proc.start()
    try:
        if not ours.poll(60) or ours.recv() != "ready":
            raise RuntimeError(f"the {kind} attackers did not start")
        yield proc.pid  # type: ignore[misc]
    finally:
        proc.join(seconds + 40)
        if proc.is_alive():
            proc.kill()


# -- the members' measures -------------------------------------------------------------------------


class _Members:
    """Two members of the victim's mesh and what they measure of it."""

    def __init__(self, mesh: Any, victim: str) -> None:

        addr = Multiaddr(victim)
        # (no listen addresses, no topic discovery: a and b reach each other only through the
        # victim; c provides the key a looks up, and is dialable, as providers are)
        quiet = PubSubConfig(discover=False)
        self.a = Node([], mesh=mesh, pubsub=quiet).start()
        self.b = Node([], mesh=mesh, pubsub=quiet).start()
        self.c = Node([_LOOPBACK], mesh=mesh, pubsub=False, membership=False).start()
        for m in (self.a, self.b, self.c):
            m.connect(addr)
            dht.bootstrap(node=m).result(10)
        self.echo = spawn_on(self.a, Echo, addr.peer_id)
        victim_id = addr.peer_id
        assert victim_id is not None  # (the victim's address ends in /p2p/<its id>)
        self.have_ref = content_ref(victim_id)
        self.cids = [Cid.of(os.urandom(8)).bytes for _ in range(16)]
        dht.provide(LOOKUP_KEY, node=self.c).result(10)
        self.sent: dict[int, float] = {}
        self.delivered: dict[int, float] = {}
        self._lock = threading.Lock()
        pubsub.subscribe(TOPIC, handler=self._heard, node=self.b)
        pubsub.subscribe(TOPIC, handler=lambda m: None, node=self.a)
        deadline = time.monotonic() + 20
        while addr.peer_id not in pubsub.peers(TOPIC, node=self.a) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # (the victim's mesh for the topic forms)

    def _heard(self, msg: Any) -> None:
        with self._lock:
            self.delivered.setdefault(msg.data, time.perf_counter())

    def close(self) -> None:
        for m in (self.a, self.b, self.c):
            m.stop()

    def measure(self, seconds: float) -> dict[str, Any]:
        """Rounds of the four measures for ``seconds``: p99s (ms), lost and failed counts."""

        times: dict[str, list[float]] = {"call": [], "lookup": [], "have": []}
        failed = hidden = 0
        first = len(self.sent)

        async def call() -> Any:
            return await self.echo.ping.remote()

        async def have() -> Any:
            return await runtime_of(self.a).call(self.have_ref, "have", (self.cids,), {}, timeout=10)

        end = time.monotonic() + seconds
        i = first
        while time.monotonic() < end:
            for what, fn in (
                ("call", lambda: self.a.run(call(), timeout=10)),
                ("lookup", lambda: dht.find_providers(LOOKUP_KEY, count=6, node=self.a).result(10)),
                ("have", lambda: self.a.run(have(), timeout=10)),
            ):
                t0 = time.perf_counter()
                try:
                    out = fn()
                except (LatticaError, TimeoutError):
                    failed += 1
                    continue
                times[what].append(time.perf_counter() - t0)
                if what == "lookup" and self.c.peer_id not in out:
                    hidden += 1
            self.sent[i] = time.perf_counter()
            with contextlib.suppress(LatticaError):
                pubsub.publish(TOPIC, i, node=self.a)
            i += 1
        time.sleep(2.0)  # (the last deliveries)
        with self._lock:
            lat = [self.delivered[k] - self.sent[k] for k in range(first, i) if k in self.delivered]
        out = {f"{k}_p99_ms": round(_p99(v) * 1e3, 2) for k, v in times.items()}
        out["pubsub_p99_ms"] = round(_p99(lat) * 1e3, 2)
        out["failed"], out["hidden"], out["undelivered"] = failed, hidden, i - first - len(lat)
        out["lost"] = failed + hidden + out["undelivered"]
        out["rounds"] = i - first
        return out


def _p99(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    if len(xs) < 2:
        return xs[0]
    return statistics.quantiles(xs, n=100)[98]


def bench_attack(
    attacks: tuple[str, ...] = ATTACKS,
    identities: tuple[int, ...] = IDENTITIES,
    seconds: float = 4.0,
    split_cores: bool = True,
) -> list[dict[str, Any]]:
    """One row quiet, then one per attack and number of identities, each against the quiet row.
    ``split_cores``: the attackers get a core of their own (the last), the victim and the
    members the others, as if the attackers ran elsewhere: what the figures then show is what
    the attack costs the victim, not what the attackers' own work takes of a shared machine."""
    unknown = [a for a in attacks if a not in _ATTACK]
    if unknown:
        raise ValueError(f"unknown attack {unknown[0]!r}: bench attack knows {', '.join(ATTACKS)}")

    key = MeshKey.generate()
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    ours_cores, attackers_cores = _cores(split_cores)
    before = os.sched_getaffinity(0) if ours_cores is not None else None
    _pin(ours_cores)  # (the members' nodes start their threads here, after this)
    victim = ctx.Process(target=_victim, args=(key.to_text(), theirs, ours_cores), daemon=True)
    victim.start()
    assert victim.pid is not None  # (started)
    rows: list[dict[str, Any]] = []
    members = None
    try:
        if not ours.poll(60):
            raise RuntimeError("the victim node did not start")
        addr = ours.recv()
        members = _Members(key, addr)
        members.measure(1.0)  # (warm)
        quiet = _measured(members, victim.pid, seconds)
        quiet.update(
            bench="attack",
            attack="quiet",
            identities=0,
            attackers_cores=sorted(attackers_cores) if attackers_cores else "shared",
        )
        rows.append(quiet)
        for kind in attacks:
            for n in identities:
                with _attacking(kind, n, addr, seconds + 1.0, attackers_cores) as attackers:
                    got = _measured(members, victim.pid, seconds, attackers)
                got.update(bench="attack", attack=kind, identities=n)
                worst = max(
                    got[f"{k}_p99_ms"] / quiet[f"{k}_p99_ms"]
                    for k in ("call", "lookup", "have", "pubsub")
                    if quiet[f"{k}_p99_ms"] > 0
                )
                got["x_quiet"] = round(worst, 2)
                rows.append(got)
                time.sleep(1.0)  # (the victim settles: dropped connections, refused streams)
    finally:
        if members is not None:
            members.close()
        with contextlib.suppress(OSError, BrokenPipeError):
            ours.send("stop")
        victim.join(20)
        if victim.is_alive():
            victim.kill()
        if before is not None:
            os.sched_setaffinity(0, before)
    return rows
