"""``lattica bench``: its arguments and what runs each benchmark. Each benchmark's module is
imported when it runs (lazily, inside ``run``): `lattica bench rpc` must not load every
benchmark (and numpy, aioquic) before it starts."""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any


def print_row(result: dict, as_json: bool) -> None:
    """One figure: a line of ``key=value`` after the benchmark's name, or a JSON object."""
    if as_json:
        print(json.dumps(result), flush=True)
        return
    name = result.pop("bench", "")
    print(f"{name:<14} " + "  ".join(f"{k}={v}" for k, v in result.items()), flush=True)


# stream bytes across an emulated link: what one stream carries in seconds, not minutes
_LINK_STREAM_BYTES = {"lan": 1 << 30, "region": 256 << 20, "continent": 32 << 20}


def run(args: argparse.Namespace) -> None:
    """``lattica bench WHICH ...``: run the benchmarks asked for, printing one row per figure."""
    from lattica.bench import plan  # lazy: see the module docstring
    from lattica.bench import transport as tb  # lazy: see the module docstring

    transports, polls = plan.transports(args), plan.polls(args)
    which = args.which

    def starting(name: str) -> None:
        """Say what bench ``name`` runs and about how long, before it runs (lattica.bench.plan)."""
        known = plan.plan_of(name, args)
        if known is not None:
            plan.announce(name, known)

    if which == "all":
        starting("all")
    if which in ("stream", "all"):
        starting("stream")
        for t in transports:
            size = args.size or _LINK_STREAM_BYTES.get(args.link, (1 << 30) if t == "tcp" else (256 << 20))
            for bp in polls:
                print_row(tb.bench_stream(t, size, busy_poll_us=bp, link=args.link), args.json)
    if which in ("ping", "all"):
        starting("ping")
        for t in transports:
            for bp in polls:
                print_row(tb.bench_ping(t, args.count, busy_poll_us=bp), args.json)
    if which in ("handshake", "all"):
        starting("handshake")
        for t in transports:
            print_row(tb.bench_handshake(t), args.json)
    if which in ("startup", "all"):
        starting("startup")
        print_row(tb.bench_startup(("tcp",)), args.json)
        print_row(tb.bench_startup(("tcp", "quic")), args.json)
    if which in ("ciphers", "all"):
        starting("ciphers")
        print_row(tb.bench_noise_ciphers(), args.json)
    if which in ("dht", "all"):
        starting("dht")
        from lattica.bench.dht import bench_dht  # lazy: see the module docstring

        for n in args.nodes or [2, 3]:
            for bp in polls:
                print_row(bench_dht(n, min(args.count, 5000), busy_poll_us=bp), args.json)
    if which == "dht-sim":
        starting("dht-sim")
        from lattica.bench.dht import simulate  # lazy: see the module docstring

        for n in args.nodes or [1000]:
            print_row(
                simulate(n, keys=args.keys, progress=None if args.json else lambda m: print(f"  {m}", flush=True)),
                args.json,
            )
    if which == "membership-sim":
        starting("membership-sim")
        from lattica.bench.membership import simulate as simulate_membership  # lazy: see the module docstring

        for n in args.nodes or [200]:
            print_row(simulate_membership(n, settle=40.0), args.json)
    if which in ("relay", "all"):
        starting("relay")
        from lattica.bench.relay import bench_relay  # lazy: see the module docstring

        for payload in args.payload or [262144, 128]:
            for row in bench_relay(
                payload, concurrency=(args.concurrency or [32])[0], duration=min(args.duration, 3.0), rounds=args.rounds
            ):
                print_row(row, args.json)
    if which in ("supervise", "all"):
        starting("supervise")
        from lattica.bench.supervise import bench_supervise  # lazy: see the module docstring

        for row in bench_supervise(rounds=args.rounds):
            print_row(row, args.json)
    if which in ("content", "all"):
        starting("content")
        from lattica.bench.content import bench_content  # lazy: see the module docstring

        for row in bench_content(size=args.size or (256 << 20), fetchers=args.fetchers, rounds=min(args.rounds, 3)):
            print_row(row, args.json)
    if which == "pubsub" and args.against == "p2pd":
        starting("pubsub")
        from lattica.bench.libp2p import find_peers  # lazy: see the module docstring
        from lattica.bench.pubsub_p2pd import bench_pubsub_against_p2pd  # lazy: see the module docstring

        try:
            found = find_peers(pathlib.Path(args.peers), ("go",))
        except FileNotFoundError as e:
            raise SystemExit(f"lattica bench pubsub --against p2pd: p2pd is missing\n{e}") from None
        say = None if args.json else (lambda m: print(f"  {m}", flush=True))
        gaps = (args.gap_ms / 1e3,) if args.gap_ms else (0.005, 0.002)
        for row in bench_pubsub_against_p2pd(
            found, gaps, messages=args.messages, rounds=args.runs or 2, size=args.size or 128, progress=say
        ):
            print_row(row, args.json)
    elif which in ("pubsub", "all"):
        starting("pubsub")
        from lattica.bench.pubsub import bench_pubsub  # lazy: see the module docstring

        for row in bench_pubsub(subscribers=4, flood_messages=20_000):
            print_row(row, args.json)
    if which == "scale":
        starting("scale")
        from lattica.bench.scale import bench_scale  # lazy: see the module docstring

        say = None if args.json else (lambda m: print(f"  {m}", flush=True))
        every = {s: tuple(args.nodes) for s in ("dht", "pubsub", "membership")} if args.nodes else None
        for row in bench_scale(sizes=every, progress=say):
            print_row(row, args.json)
    if which == "ceilings":
        starting("ceilings")
        from lattica.bench.ceilings import machine_ceilings  # lazy: see the module docstring

        print_row(machine_ceilings(args.size or (1 << 30)), args.json)
    if which == "busy-poll":
        starting("busy-poll")
        from lattica._loop import BUSY_POLL_US  # lazy: see the module docstring
        from lattica.bench.busypoll import bench_busy_poll  # lazy: see the module docstring

        say = None if args.json else (lambda m: print(f"  {m}", flush=True))
        other = args.busy_poll_us if args.busy_poll_us else BUSY_POLL_US
        for row in bench_busy_poll((0.0, other), runs=args.runs or 3, progress=say):
            print_row(row, args.json)
    if which == "pubsub-sim":
        starting("pubsub-sim")
        from lattica.bench.pubsub import simulate as simulate_pubsub  # lazy: see the module docstring

        for n in args.nodes or [200]:
            print_row(simulate_pubsub(n, messages=1000), args.json)
            print_row(simulate_pubsub(n, messages=1000, kill=0.1, seed=2), args.json)
    if which == "pubsub-nodes":
        starting("pubsub-nodes")
        from lattica.bench.pubsub_nodes import simulate_nodes  # lazy: see the module docstring

        say = None if args.json else (lambda m: print(f"  {m}", flush=True))
        for n in args.nodes or [200]:
            print_row(simulate_nodes(n, messages=1000, progress=say), args.json)
            print_row(simulate_nodes(n, messages=1000, kill=0.1, seed=2, progress=say), args.json)
    if which in ("crdt", "all"):
        starting("crdt")
        from lattica.bench.crdt import bench_compaction, bench_crdt  # lazy: see the module docstring

        print_row(bench_compaction(), args.json)
        for row in bench_crdt():
            print_row(row, args.json)
    if which == "crdt-sim":
        starting("crdt-sim")
        from lattica.bench.crdt import simulate_crdt  # lazy: see the module docstring

        say = None if args.json else (lambda m: print(f"  {m}", flush=True))
        for n in args.nodes or [20]:
            print_row(
                simulate_crdt(n, runs=args.runs or 100, compact_every=args.compact_every, progress=say), args.json
            )
    if which in ("shards", "all"):
        starting("shards")
        from lattica.bench.shards import bench_inference, bench_shards  # lazy: see the module docstring

        for row in bench_shards():
            print_row(row, args.json)
        for row in bench_inference():
            print_row(row, args.json)
    if which in ("weightsync", "all"):
        starting("weightsync")
        from lattica.bench.weightsync import bench_weightsync  # lazy: see the module docstring

        for row in bench_weightsync():
            print_row(row, args.json)
    if which in ("firstcall", "all"):
        starting("firstcall")
        from lattica.bench.firstcall import bench_firstcall  # lazy: see the module docstring

        for t in transports:
            print_row(bench_firstcall(t, link=args.link, runs=args.runs or 5), args.json)
    if which in ("spill", "all"):
        starting("spill")
        from lattica.bench.spill import bench_spill  # lazy: see the module docstring

        for row in bench_spill(runs=args.runs or 3):
            print_row(row, args.json)
    if which in ("code", "all"):
        starting("code")
        from lattica.bench.code import bench_code  # lazy: see the module docstring

        sizes = (args.size,) if args.size else (100_000, 10_000_000)
        for row in bench_code(sizes, nodes=(args.nodes or [8])[0], spawns=args.runs or 20):
            print_row(row, args.json)
    if which == "soak":
        starting("soak")
        from lattica.bench.soak import soak  # lazy: see the module docstring

        print_row(soak(args.soak_seconds, processes=(args.nodes or [4])[0]), args.json)
    if which in ("dashboard", "all"):
        starting("dashboard")
        from lattica.bench.dashboard import bench_dashboard  # lazy: see the module docstring

        for row in bench_dashboard(cost_seconds=min(args.duration, 5.0), cost_rounds=args.runs or 3):
            print_row(row, args.json)
    if which in ("attack", "all"):
        starting("attack")
        from lattica.bench.attack import bench_attack  # lazy: see the module docstring

        for row in bench_attack(*plan.attack_configs(args)):
            print_row(row, args.json)
    if which == "libp2p":
        starting("libp2p")
        from lattica.bench.libp2p import IMPLEMENTATIONS, bench_libp2p, find_peers  # lazy: see the module docstring

        try:
            found = find_peers(pathlib.Path(args.peers), tuple(args.impl or IMPLEMENTATIONS))
        except FileNotFoundError as e:
            raise SystemExit(f"lattica bench libp2p: a peer is missing\n{e}") from None
        say = None if args.json else (lambda m: print(f"  {m}", flush=True))
        for row in bench_libp2p(
            found, transports, handshakes=args.handshakes, pings=args.pings, size=args.size or (64 << 20), progress=say
        ):
            print_row(row, args.json)
    if which == "gossipsub-mixed":
        starting("gossipsub-mixed")
        from lattica.bench.gossipsub_mixed import CASES, bench_gossipsub_mixed  # lazy: see the module docstring
        from lattica.bench.libp2p import find_peers  # lazy: see the module docstring

        cases = tuple(args.case or CASES)
        needed = tuple(k for k in ("go", "js") if any(k in CASES[c][0] for c in cases))
        try:
            found = find_peers(pathlib.Path(args.peers), needed)
        except FileNotFoundError as e:
            raise SystemExit(f"lattica bench gossipsub-mixed: a peer is missing\n{e}") from None
        say = None if args.json else (lambda m: print(f"  {m}", flush=True))
        for row in bench_gossipsub_mixed(
            found, cases, messages=args.messages, gap=(args.gap_ms or 200.0) / 1e3, size=args.size or 128, progress=say
        ):
            print_row(row, args.json)
    if which == "libp2p-content":
        starting("libp2p-content")
        from lattica.bench.libp2p import find_peers  # lazy: see the module docstring
        from lattica.bench.libp2p_content import bench_libp2p_content  # lazy: see the module docstring

        try:
            sdk = find_peers(pathlib.Path(args.peers), ("rust",))["rust"]
        except FileNotFoundError as e:
            raise SystemExit(f"lattica bench libp2p-content: the SDK peer is missing\n{e}") from None
        say = None if args.json else (lambda m: print(f"  {m}", flush=True))
        for row in bench_libp2p_content(sdk, size=args.size or (256 << 20), lookups=args.lookups, progress=say):
            print_row(row, args.json)
    if which in ("rpc", "all"):
        starting("rpc")
        from lattica.bench.rpc import bench_rpc  # lazy: see the module docstring

        rpc_transports, kinds, payloads, concurrencies, rpc_polls = plan.rpc_configs(args)
        for t in rpc_transports:
            for kind in kinds:
                for payload in payloads:
                    for conc in concurrencies:
                        for bp in rpc_polls:
                            print_row(
                                bench_rpc(payload, conc, args.duration, t, kind, busy_poll_us=bp, link=args.link),
                                args.json,
                            )


def add_parser(sub: Any) -> None:
    """The ``bench`` subcommand's grammar, on the command line's subparsers ``sub``."""
    s = sub.add_parser("bench", help="run benchmarks and print figures")
    s.add_argument(
        "which",
        choices=[
            "stream",
            "ping",
            "handshake",
            "startup",
            "firstcall",
            "ciphers",
            "rpc",
            "dht",
            "dht-sim",
            "membership-sim",
            "relay",
            "supervise",
            "content",
            "pubsub",
            "pubsub-sim",
            "pubsub-nodes",
            "busy-poll",
            "ceilings",
            "scale",
            "crdt",
            "crdt-sim",
            "shards",
            "weightsync",
            "dashboard",
            "soak",
            "code",
            "spill",
            "attack",
            "libp2p",
            "libp2p-content",
            "gossipsub-mixed",
            "all",
        ],
    )
    s.add_argument("--transport", choices=["tcp", "quic", "both"], default=None, help="default: both (rpc: tcp)")
    s.add_argument(
        "--size",
        type=int,
        default=0,
        help="stream bytes (default 1 GiB tcp, 256 MiB quic); content, libp2p-content: object bytes (default 256 MiB); "
        "libp2p: 64 MiB; gossipsub-mixed: message bytes (default 128)",
    )
    s.add_argument("--count", type=int, default=10000, help="pings")
    s.add_argument(
        "--payload",
        type=int,
        action="append",
        help="rpc payload bytes (repeatable; default 128; --matrix: 128 and 262144)",
    )
    s.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help="rpc calls in flight (repeatable; default 1000; --matrix: 1000 and 1)",
    )
    s.add_argument(
        "--matrix",
        action="store_true",
        help="rpc: every transport, actor kind, payload, calls in flight and loop (dozens of runs)",
    )
    s.add_argument("--duration", type=float, default=10.0, help="rpc seconds per run")
    s.add_argument(
        "--actor",
        choices=["async", "sync", "both"],
        default=None,
        help="rpc actor kind (default: async; --matrix: both)",
    )
    s.add_argument(
        "--busy-poll-us",
        type=float,
        default=None,
        help="node loop busy-poll window (µs); default: stream and ping compare 0 (the plain loop) with 200 side by side, the rest run the default loop",
    )
    s.add_argument("--nodes", type=int, action="append", help="dht: nodes (repeatable; default 2 and 3; dht-sim: 1000)")
    s.add_argument("--keys", type=int, default=200, help="dht-sim: keys stored and looked up")
    s.add_argument("--soak-seconds", type=float, default=300.0, help="soak: how long (not part of all)")
    s.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="supervise: node losses per signal (a fresh mesh each); relay: turns of every path",
    )
    s.add_argument(
        "--runs",
        type=int,
        default=None,
        help="crdt-sim: runs (random partitions each; default 100); firstcall: fresh callers (default 5); busy-poll: runs of each figure (default 3)",
    )
    s.add_argument(
        "--compact-every",
        type=int,
        default=0,
        help="crdt-sim: replicas checkpoint their logs this often (default 0: never)",
    )
    s.add_argument("--fetchers", type=int, default=8, help="content: fetchers of the swarm")
    s.add_argument(
        "--link",
        choices=["lan", "region", "continent"],
        default=None,
        help="stream, rpc, firstcall: run across an emulated link (root, Linux; lattica.bench.linkem) instead of loopback",
    )
    s.add_argument(
        "--attack",
        action="append",
        default=None,
        help="attack: which (repeatable; default every one: cpu (a control), have, calls, pubsub, streams, sockets, store, providers); --nodes: stranger identities (default 1, 8, 64)",
    )
    s.add_argument(
        "--shared-cores",
        action="store_true",
        help="attack: the attackers share the victim's cores (default: the last core is theirs alone)",
    )
    s.add_argument(
        "--peers",
        default=".interop",
        help="libp2p, libp2p-content, gossipsub-mixed: where `make interop-peers` installed rust-, go- and js-libp2p "
        "(default ./.interop)",
    )
    s.add_argument(
        "--impl",
        action="append",
        choices=["rust", "go", "js"],
        default=None,
        help="libp2p: which implementations (repeatable; default all three)",
    )
    s.add_argument("--handshakes", type=int, default=30, help="libp2p: fresh connections per pair")
    s.add_argument("--pings", type=int, default=1000, help="libp2p: pings per pair")
    s.add_argument("--lookups", type=int, default=100, help="libp2p-content: Kademlia lookups of each kind")
    s.add_argument(
        "--case",
        action="append",
        choices=["mixed", "mixed-open", "go", "js", "lattica"],
        default=None,
        help="gossipsub-mixed: which topics of 6 (repeatable; default all: 2 go + 2 js + 2 Lattica as documented, "
        "the same in an open mesh, then 6 go, 6 js, 6 Lattica)",
    )
    s.add_argument(
        "--messages", type=int, default=100, help="gossipsub-mixed, pubsub --against: messages each publisher sends"
    )
    s.add_argument(
        "--gap-ms",
        type=float,
        default=None,
        help="gossipsub-mixed: ms between one node's messages (default 200; the 6 staggered: the topic carries one "
        "every gap/6); pubsub --against: the one publisher's (default 5, then 2)",
    )
    s.add_argument(
        "--against",
        choices=["p2pd"],
        default=None,
        help="pubsub: 5 processes of ours beside 5 go-libp2p daemons (p2pd -pubsub), alternating",
    )
    s.add_argument("--json", action="store_true", help="one JSON object per line")
    s.set_defaults(fn=run)
