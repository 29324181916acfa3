"""What each ``lattica bench NAME`` will run and about how long, said on stderr before it starts
(a run of minutes says so first). One table, ``PLANS``, for every benchmark; the estimates come
from runs on the project's 2-core VM and are rough (a loaded machine takes longer)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NamedTuple, TextIO

__all__ = ["Plan", "PLANS", "IN_ALL", "announce", "plan_of", "rpc_configs", "attack_configs", "transports", "polls"]


class Plan(NamedTuple):
    """What a benchmark runs (a few words), its estimated seconds, and an optional hint."""

    what: str
    seconds: float
    hint: str = ""


def transports(args: argparse.Namespace) -> list[str]:
    """The transports a bench runs over: ``--transport``, or both."""
    return ["tcp", "quic"] if args.transport in (None, "both") else [args.transport]


def polls(args: argparse.Namespace) -> list[float]:
    """The loop busy-poll windows compared: ``--busy-poll-us``, or 0 (the plain loop) and the
    busy poll's window."""
    from lattica._loop import BUSY_POLL_US  # (the bench's lazy imports: see lattica.cli)

    return [args.busy_poll_us] if args.busy_poll_us is not None else [0.0, BUSY_POLL_US]


def rpc_configs(args: argparse.Namespace) -> tuple[list[str], list[str], list[int], list[int], list[float]]:
    """``bench rpc``'s transports, actor kinds, payloads, calls in flight and loops: Table 1's first
    row unless asked for more, or for the whole ``--matrix``."""
    from lattica._loop import DEFAULT_BUSY_POLL_US  # (the bench's lazy imports: see lattica.cli)

    matrix = args.matrix
    kinds = ["async", "sync"] if args.actor == "both" or (args.actor is None and matrix) else [args.actor or "async"]
    rpc_transports = transports(args) if args.transport is not None or matrix else ["tcp"]
    payloads = args.payload or ([128, 262144] if matrix else [128])
    concurrencies = args.concurrency or ([1000, 1] if matrix else [1000])
    rpc_polls = polls(args) if args.busy_poll_us is not None or matrix else [DEFAULT_BUSY_POLL_US]
    return rpc_transports, kinds, payloads, concurrencies, rpc_polls


def attack_configs(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[int, ...], float, bool]:
    """``bench attack``'s attacks, numbers of stranger identities, seconds per phase and whether
    the attackers get a core of their own."""
    from lattica.bench.attack import ATTACKS, IDENTITIES  # (the bench's lazy imports: see lattica.cli)

    return (
        tuple(args.attack or ATTACKS),
        tuple(args.nodes or IDENTITIES),
        min(args.duration, 4.0),
        not getattr(args, "shared_cores", False),
    )


def _attack(a: argparse.Namespace) -> Plan:
    attacks, sizes, seconds, _ = attack_configs(a)
    n = len(attacks) * len(sizes)
    return Plan(
        f"a quiet phase and {_runs(n, 'attack')} ({'/'.join(attacks)} by {'/'.join(map(str, sizes))} stranger identities) "
        f"of {seconds:g} s each",
        10 + (n + 1) * (seconds + 4),
        "--attack NAME, --nodes N: fewer",
    )


def _runs(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _rpc(a: argparse.Namespace) -> Plan:
    t, k, p, c, b = rpc_configs(a)
    n = len(t) * len(k) * len(p) * len(c) * len(b)
    return Plan(
        f"{_runs(n, 'configuration')} of {a.duration:g} s",
        n * (a.duration + 2),
        "" if a.matrix else "--matrix: transports x actor kinds x payloads x calls in flight x loops",
    )


def _stream(a: argparse.Namespace) -> Plan:
    n = len(transports(a)) * len(polls(a))
    return Plan(
        f"{_runs(n, 'stream')} (transports x loops)" + (f" across an emulated {a.link} link" if a.link else ""),
        n * (30 if a.link else 4),
    )


def _ping(a: argparse.Namespace) -> Plan:
    ts, n = transports(a), len(polls(a))
    return Plan(
        f"{a.count} pings x {_runs(len(ts) * n, 'run')} (transports x loops)",
        n * sum(1 + a.count * (1e-4 if t == "tcp" else 4e-4) for t in ts),
    )


def _dht(a: argparse.Namespace) -> Plan:
    sizes = a.nodes or [2, 3]
    n = len(sizes) * len(polls(a))
    return Plan(
        f"{min(a.count, 5000)} puts and gets x {_runs(n, 'DHT')} of {'/'.join(map(str, sizes))} processes",
        n * (4 + min(a.count, 5000) * 2e-3),
    )


def _firstcall(a: argparse.Namespace) -> Plan:
    runs = a.runs or 5
    return Plan(
        f"{runs} fresh callers per transport"
        + (f", on loopback then across an emulated {a.link} link" if a.link else ""),
        len(transports(a)) * runs * (1.5 if a.link is None else 6),
    )


def _relay(a: argparse.Namespace) -> Plan:
    payloads = a.payload or [262144, 128]
    turn = min(a.duration, 3.0) + 1  # (each path driven that long per round, after a second's warm-up)
    return Plan(
        f"4 paths x {_runs(a.rounds, 'round')} x {_runs(len(payloads), 'payload')}",
        len(payloads) * (10 + a.rounds * 4 * turn),
    )


def _code(a: argparse.Namespace) -> Plan:
    sizes = 1 if a.size else 2
    return Plan(
        f"{a.runs or 20} spawns on {(a.nodes or [8])[0]} node processes x {_runs(sizes, 'package size')}",
        15 + sizes * 25,
    )


def _libp2p(a: argparse.Namespace) -> Plan:
    impls = a.impl or ["rust", "go", "js"]
    size = a.size or (64 << 20)
    pair = a.handshakes * 0.03 + a.pings * 1e-3 + size / 30e6  # (js's handshakes and pings are the slow ones)
    return Plan(
        f"{a.handshakes} handshakes, {a.pings} pings and {size >> 20} MiB on one stream per pair: Lattica -> Lattica, "
        f"then X -> X, X -> Lattica and Lattica -> X for {', '.join(impls)}, per transport",
        len(transports(a)) * (5 + pair + len(impls) * (5 + 3 * pair)),
    )


def _libp2p_content(a: argparse.Namespace) -> Plan:
    size = a.size or (256 << 20)
    return Plan(
        f"{size >> 20} MiB over Bitswap from an SDK node (beside SDK -> SDK) and from a Lattica node (beside our "
        f"protocol), {a.lookups} Kademlia lookups of each kind among 3 SDK + 3 Lattica nodes, a swarm of 4 fetchers "
        "with SDK providers",
        15 + a.lookups * 0.05 + 8 * size / (64 << 20),  # (256 MiB: 38 s on the 2-core VM, quiet; 52 s loaded)
        "--size, --lookups: smaller",
    )


def _gossipsub_mixed(a: argparse.Namespace) -> Plan:
    cases = a.case or ["mixed", "mixed-open", "go", "js", "lattica"]
    gap_ms = a.gap_ms or 200.0
    per_case = 14 + (10 + a.messages) * gap_ms / 1e3  # (6 processes up and meshed, then 2 paced rounds)
    return Plan(
        f"{_runs(len(cases), 'topic')} of 6 node processes ({', '.join(cases)}), each node publishing "
        f"{a.messages} messages every {gap_ms:g} ms",
        len(cases) * per_case,
        "--case NAME, --messages N: fewer",
    )


PLANS: dict[str, Callable[[argparse.Namespace], Plan]] = {
    "stream": _stream,
    "ping": _ping,
    "handshake": lambda a: Plan("200 handshakes per transport", 1.5 * len(transports(a))),
    "startup": lambda a: Plan("5 fresh node processes, TCP then TCP + QUIC", 15),
    "ciphers": lambda a: Plan("Noise's ciphers on 20,000 frames", 2),
    "dht": _dht,
    "dht-sim": lambda a: Plan(
        f"a simulated DHT of {'/'.join(map(str, a.nodes or [1000]))} nodes, {a.keys} keys", sum(a.nodes or [1000]) * 0.3
    ),
    "membership-sim": lambda a: Plan(
        f"simulated membership of {'/'.join(map(str, a.nodes or [200]))} nodes", sum(a.nodes or [200]) * 0.1
    ),
    "relay": _relay,
    "supervise": lambda a: Plan(
        f"{_runs(a.rounds, 'round')} per signal (SIGKILL, SIGSTOP), one node lost from a fresh 3-process mesh each",
        a.rounds * 2 * 3,
    ),
    "content": lambda a: Plan(
        f"publish, fetch and a swarm of {a.fetchers} fetchers of {(a.size or (256 << 20)) >> 20} MiB",
        30 + 4 * (a.fetchers + 1) * (a.size or (256 << 20)) / (256 << 20),
    ),
    "pubsub": lambda a: (
        Plan(
            f"5 processes of ours against 5 go-libp2p daemons, one publisher, {a.messages} messages every "
            f"{a.gap_ms or '5 then 2'} ms, {a.runs or 2} rounds each, alternating",
            (2 if a.gap_ms else 4) * (a.runs or 2) * 12,
        )
        if getattr(a, "against", None)
        else Plan("4 subscriber processes: latency, then a flood of 20,000 messages", 20)
    ),
    "pubsub-sim": lambda a: Plan(
        f"2 simulations (one with 10 % of nodes stopped) of {'/'.join(map(str, a.nodes or [200]))} routers",
        sum(a.nodes or [200]) * 0.3,
    ),
    "busy-poll": lambda a: Plan(
        "calls, one call (async and sync actors), a stream and pub-sub latency with the plain loop and the busy poll, "
        "quiet and beside "
        f"1 and 2 busy processes, {a.runs or 3} runs each",
        (a.runs or 3) * 2 * 3 * 30,
        "--runs 1: a quick look",
    ),
    "scale": lambda a: Plan(
        "cost curves: DHT tables of "
        + "/".join(map(str, a.nodes or [100, 1000, 3000, 10000]))
        + " nodes, pub-sub routers and membership views of "
        + "/".join(map(str, a.nodes or [100, 300, 1000]))
        + " and "
        + "/".join(map(str, a.nodes or [100, 200, 400]))
        + ", each cost fitted to a * N^b",
        sum(a.nodes) * 1.0 if a.nodes else 900,
        "--nodes N (repeatable): these sizes for every service",
    ),
    "ceilings": lambda a: Plan(
        "the machine's own figures: a plain TCP stream, sha2-256, AES-GCM, ChaCha20-Poly1305, plain UDP datagrams", 8
    ),
    "pubsub-nodes": lambda a: Plan(
        f"2 simulations (one with 10 % of nodes stopped) of {'/'.join(map(str, a.nodes or [200]))} full nodes on one loop",
        sum(a.nodes or [200]) * 2 * 4,
    ),
    "crdt": lambda a: Plan("compaction, then latency and a flood of 20,000 updates between node processes", 25),
    "crdt-sim": lambda a: Plan(
        f"{a.runs or 100} partitioned runs of {'/'.join(map(str, a.nodes or [20]))} replicas",
        (a.runs or 100) * sum(a.nodes or [20]) * 0.3,
    ),
    "shards": lambda a: Plan("a shard stub's calls and failover, then sharded inference, on 3 node processes", 30),
    "weightsync": lambda a: Plan("3 policies of 64 MiB to 8 worker processes", 40),
    "firstcall": _firstcall,
    "code": _code,
    "spill": lambda a: Plan(
        f"a 256 MiB echo by CID (spilled), by hand, and 60 MiB in the message, {a.runs or 3} runs each",
        6 * (a.runs or 3) + 5,
    ),
    "dashboard": lambda a: Plan(
        "a real mesh's picture, a simulated 200-node one, Table 1's 128 B run against a node serving 3 pages vs none "
        f"({a.runs or 3} rounds of {min(a.duration, 5.0):g} s each way), the buffers' memory per actor",
        25 + 2 * (a.runs or 3) * (min(a.duration, 5.0) + 3),
    ),
    "soak": lambda a: Plan(
        f"{a.soak_seconds:g} s of calls to {(a.nodes or [4])[0]} node processes", a.soak_seconds + 10
    ),
    "attack": _attack,
    "rpc": _rpc,
    "libp2p": _libp2p,
    "libp2p-content": _libp2p_content,
    "gossipsub-mixed": _gossipsub_mixed,
}


# what ``lattica bench all`` runs, in its order
IN_ALL = (
    "stream",
    "ping",
    "handshake",
    "startup",
    "ciphers",
    "dht",
    "relay",
    "supervise",
    "content",
    "pubsub",
    "crdt",
    "shards",
    "weightsync",
    "firstcall",
    "code",
    "spill",
    "dashboard",
    "attack",
    "rpc",
)


def plan_of(name: str, args: argparse.Namespace) -> Plan | None:
    """The plan of benchmark ``name`` for these arguments (None for one not in the table)."""
    if name == "all":
        plans = [p for p in (plan_of(n, args) for n in IN_ALL) if p is not None]
        return Plan(
            f"{len(IN_ALL)} benchmarks ({', '.join(IN_ALL)}), each announced as it starts",
            sum(p.seconds for p in plans),
        )
    make = PLANS.get(name)
    return make(args) if make is not None else None


def _about(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def announce(name: str, plan: Plan, out: TextIO | None = None) -> None:
    """One line before ``lattica bench NAME`` runs: ``lattica bench NAME: WHAT, about N s (HINT)``."""
    out = out or sys.stderr
    out.write(
        f"lattica bench {name}: {plan.what}, about {_about(plan.seconds)}"
        + (f" ({plan.hint})" if plan.hint else "")
        + "\n"
    )
    out.flush()
