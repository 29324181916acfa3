"""The ``lattica`` command: run a node or relay, ping a peer, the DHT, content (put, get, the
blockstore), doctor, the demo, and the benchmarks."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from lattica import logging as lattica_logging
from lattica.bench import command as bench_command

if TYPE_CHECKING:
    from lattica._future import Future
    from lattica._host import Host
    from lattica._runtime import Runtime


# The subcommands import what they run inside their functions: `lattica doctor` must not load
# every service and benchmark (and numpy, aioquic) before it starts.


def _node(args: argparse.Namespace) -> None:
    from lattica._node import Node  # lazy: see the note above _node

    relay = getattr(args, "relay", False)
    mdns = False if getattr(args, "no_mdns", False) else None
    with Node(
        args.listen or ["/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"],
        key_path=args.key,
        relay=relay,
        mdns=mdns,
        mesh=args.mesh,
        dashboard=args.dashboard,
        allow=getattr(args, "allow", ()),
        accept_code=getattr(args, "accept_code", "admins"),
        **({"spill_limit": args.spill_limit} if getattr(args, "spill_limit", None) is not None else {}),
    ) as node:
        print(f"peer id: {node.peer_id}" + (" (relay and bootstrap)" if relay else ""))
        print(f"mesh: {node.trust.describe()}")
        if not relay:
            print(
                f"runs code from: {node.config.accept_code}"
                + (f"; installed classes allowed: {', '.join(node.config.allow)}" if node.config.allow else "")
            )
        for a in node.addrs:
            print(f"listening: {a}", flush=True)
        if node.dashboard_url:
            print(f"dashboard: {node.dashboard_url}", flush=True)
        for addr in args.connect:
            info = node.connect(addr)
            print(f"connected: {info.peer_id} over {info.transport}")
        if args.connect:
            from lattica import dht  # lazy: see the note above _node

            print(f"DHT routing table: {dht.bootstrap(node=node).result(30)} peers")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


def _mesh(args: argparse.Namespace) -> None:
    """Create, show and share mesh credentials (docs/security.md)."""
    from lattica import trust  # lazy: see the note above _node
    from lattica._identity import KeyPair, PeerId  # lazy: see the note above _node

    if args.op == "new":
        if not args.arg:
            sys.exit("lattica mesh new PATH: where to write the new mesh key")
        key = trust.MeshKey.generate()
        key.save(args.arg)
        print(
            f"created {key.name} in {args.arg} (mode 0600); start nodes with mesh={args.arg!r} or LATTICA_MESH={args.arg}"
        )
        return
    if args.op == "id":
        kp = KeyPair.load_or_create(args.arg or "lattica.key")
        print(kp.peer_id)
        return
    setting = args.mesh or os.environ.get(trust.ENV)
    source = "--mesh" if args.mesh else f"${trust.ENV}" if setting else str(trust.default_mesh_path())
    cred = trust.read_credential(setting or trust.default_mesh_path())
    if args.op == "show":
        if isinstance(cred, str):  # the only text read_credential returns is trust.OPEN
            print("open mesh: every authenticated peer is a member")
        elif isinstance(cred, trust.MeshKey):
            print(f"{cred.name}: this machine holds its key (from {source})")
        else:
            role = "an administrator" if cred.admin else "a member"
            print(
                f"{trust.mesh_name(cred.mesh)}: invited as {cred.peer} ({role}) until {time.strftime('%Y-%m-%d', time.gmtime(cred.expires))}"
            )
        return
    if not isinstance(cred, trust.MeshKey):
        sys.exit("this needs the mesh key (an invited node holds only its own certificate)")
    if args.op == "key":
        print("# secret: whoever has it joins the mesh and can invite others", file=sys.stderr)
        print(cred.to_text())
    elif args.op == "invite":
        if not args.arg:
            sys.exit("lattica mesh invite PEER_ID: the invited node's PeerId (`lattica mesh id` on it)")
        print(cred.issue(PeerId.from_string(args.arg), args.days * 86400.0, admin=args.admin).to_text())


def _ping(args: argparse.Namespace) -> None:
    from lattica._node import Node  # lazy: see the note above _node

    with Node([]) as node:
        info = node.connect(args.addr)
        rtts = node.ping_many(info.peer_id, args.count)
        for r in rtts:
            print(f"pong from {info.peer_id.short()} via {info.transport}: {r * 1e6:.0f} µs")


def _dht(args: argparse.Namespace) -> None:

    from lattica import dht  # lazy: see the note above _node
    from lattica._identity import PeerId  # lazy: see the note above _node
    from lattica._node import Node  # lazy: see the note above _node

    def shown(v: object) -> object:
        return v if isinstance(v, (str, int, float, bool, list, dict, type(None))) else repr(v)

    with Node([]) as node:
        for addr in args.bootstrap:
            node.connect(addr)
        dht.bootstrap(node=node).result(30)
        if args.op == "put":
            try:
                value = json.loads(args.value)
            except ValueError:
                value = args.value
            n = dht.put(args.key, value, subkey=args.subkey, ttl=args.ttl, node=node).result(60)
            print(json.dumps({"key": args.key, "replicas": n}))
        elif args.op == "get":
            rec = dht.get(args.key, node=node).result(60)
            items = {
                str(k) if k is not None else "": {
                    "value": shown(v.value),
                    "expires_in": round(v.expiration - time.time(), 1),
                }
                for k, v in (rec or {}).items()
            }
            print(json.dumps({"key": args.key, "found": rec is not None, "subkeys": items}))
            if rec is None:
                sys.exit(1)  # (a missing key is a failure a script can test for)
        elif args.op == "providers":
            peers = dht.find_providers(args.key, node=node).result(60)
            print(json.dumps({"cid": args.key, "providers": [str(p) for p in peers]}))
        else:
            addrs = dht.find_peer(PeerId.from_string(args.key), node=node).result(60)
            print(json.dumps({"peer": args.key, "addrs": [str(a) for a in addrs]}))


def _content_node(args: argparse.Namespace, listen: list[str] | None = None):  # -> Node
    from lattica._node import Node  # lazy: see the note above _node
    from lattica.config import ContentConfig  # lazy: see the note above _node

    blocks = (
        args.blocks or os.environ.get("LATTICA_BLOCKS") or os.path.join(os.path.expanduser("~"), ".lattica", "blocks")
    )
    # an explicit directory: if another node on this machine holds it, say so (a private store
    # would vanish with this command, and what it published with it)
    node = Node(listen or [], content=ContentConfig(blocks=blocks), key_path=getattr(args, "key", None))
    node.start()
    for addr in getattr(args, "bootstrap", []) or []:
        node.connect(addr)
    return node


class _Progress:
    """A one-line progress bar on stderr (a terminal only): percent, bytes, MB/s, peers; a log
    gets no rewritten lines. ``end()`` finishes a line left open, so what follows starts on its own."""

    def __init__(self) -> None:
        self._last = 0.0
        self.tty = sys.stderr.isatty()
        self.open = False  # a line is on the screen without its newline
        self.peers: int | None = None  # the peers the last report counted
        self.kinds = ""  # what they are ("2 lattica, 1 libp2p (agent)")
        self.held = 0  # bytes of the file held before the fetch (a resumed get's bar starts there)

    def say(self, text: str) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
            sys.stderr.flush()
            self.open = True

    def __call__(self, info: dict) -> None:
        self.peers = info.get("peers", self.peers)
        self.kinds = info.get("kinds", self.kinds)
        self.held = info.get("held", self.held)
        now = time.monotonic()
        if not info["done"] and (not self.tty or now - self._last < 0.2 or not info["bytes"]):
            return  # (a log gets the final line only; a terminal keeps "looking for providers" until bytes come)
        self._last = now
        total = info["total"]
        done = info["bytes"]
        pct = f"{100 * done / total:5.1f}%" if total else "  ?  "
        line = (
            f"{pct}  {done / 1e6:9.1f} MB  {info['mb_per_s']:8.1f} MB/s"
            + (f"  {info['peers']} peers" if "peers" in info else "")
            + (f" ({info['kinds']})" if info.get("kinds") else "")
        )
        if self.tty:
            self.say(line)
        else:
            sys.stderr.write(line)
            self.open = True
        if info["done"]:
            self.end()

    def end(self) -> None:
        if self.open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.open = False


def _wait(fut: Future) -> Any:
    """``fut.result()``; on Ctrl-C the work is cancelled where it runs before the node stops (a
    fetch given up ends at once, with its tasks), then the interrupt goes on."""
    try:
        return fut.result(None)
    except KeyboardInterrupt:
        fut.cancel()
        raise


def _put(args: argparse.Namespace) -> None:
    from lattica import content  # lazy: see the note above _node

    node = _content_node(args, args.listen or ["/ip4/0.0.0.0/tcp/0"])
    try:
        cid = _wait(
            content.put(args.file, chunk_size=args.chunk, progress=None if args.quiet else _Progress(), node=node)
        )
        print(cid, flush=True)
        if args.no_serve:
            return
        print(
            f"serving {cid} from {', '.join(str(a) for a in node.addrs)} (Ctrl-C to stop)", file=sys.stderr, flush=True
        )
        while True:
            time.sleep(3600)
    finally:
        node.stop()


def _get(args: argparse.Namespace) -> None:
    from lattica import content  # lazy: see the note above _node

    output = args.output
    if output is None and sys.stdout.isatty():
        output = args.cid  # (binary on a terminal helps no one: a file named after the CID, as `ipfs get` does)
    if output is not None:
        where = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(where):
            raise _CliError(f"cannot write {output}: the directory {where} does not exist")
    node = _content_node(args)
    try:
        progress = None if args.quiet else _Progress()
        if progress is not None:
            progress.say(f"looking for providers of {args.cid} ...")
        t0 = time.monotonic()
        try:
            if output is not None:
                _wait(content.get(args.cid, path=output, progress=progress, node=node))
                size = os.path.getsize(output)
            else:
                data = _wait(content.get(args.cid, progress=progress, node=node))
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
                size = len(data)
        except BaseException:
            if progress is not None:
                progress.end()  # (the error gets a line of its own)
            raise
        if progress is not None:
            progress.end()
            took = max(time.monotonic() - t0, 1e-9)
            peers, held = progress.peers, min(progress.held, size)
            sys.stderr.write(
                f"got {args.cid}: {size / 1e6:.1f} MB in {took:.1f} s ({(size - held) / took / 1e6:.1f} MB/s)"
                + (f" from {peers} peer{'s' * (peers != 1)}" if peers is not None else "")
                + (f" ({progress.kinds})" if progress.kinds else "")
                + (f", {held / 1e6:.1f} MB of it held already" if held else "")
                + (f", saved to {output}" if output is not None and args.output is None else "")
                + "\n"
            )
    finally:
        node.stop()


def _content(args: argparse.Namespace) -> None:
    from lattica import content  # lazy: see the note above _node

    node = _content_node(args)
    try:
        if args.op == "stat":
            print(json.dumps(content.stat(args.cid, node=node).result(60)))
        elif args.op == "pin":
            _wait(content.pin(args.cid, progress=None if args.quiet else _Progress(), node=node))
            print(json.dumps({"pinned": args.cid}))
        elif args.op == "unpin":
            print(json.dumps({"unpinned": content.unpin(args.cid, node=node).result(60)}))
        else:
            print(json.dumps(content.gc(node=node).result(None)))
    finally:
        node.stop()


def _doctor(args: argparse.Namespace) -> None:
    from lattica._doctor import diagnose, render  # lazy: see the note above _node

    def waiting(waited: float, wait: float, reachability: str) -> None:
        sys.stderr.write(f"\rwaiting for the AutoNAT verdict: {waited:4.1f} of {wait:g} s ({reachability} so far)")
        sys.stderr.flush()

    def stage(text: str) -> None:
        sys.stderr.write(f"lattica doctor: {text}\n")
        sys.stderr.flush()

    # a terminal: one line that counts up, erased; a log: a line per stage (no rewritten line)
    shown = not args.json and sys.stderr.isatty()
    report = diagnose(
        args.listen or ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"],
        args.bootstrap,
        args.peer,
        args.wait,
        args.mesh,
        progress=waiting if shown else None,
        stage=None if sys.stderr.isatty() else stage,
    )
    if shown:
        sys.stderr.write("\r\033[K")  # (the waiting line goes)
    print(json.dumps(report) if args.json else render(report), flush=True)
    if report["problems"]:
        sys.exit(1)


def _status(args: argparse.Namespace) -> None:
    """The mesh in the terminal (``ray status``): through a running dashboard, or by joining."""
    if args.dashboard:
        import urllib.error  # lazy: see the note above _node
        import urllib.request  # lazy: see the note above _node

        url = (
            args.dashboard.split("?")[0].rstrip("/")
            + "/api/mesh"
            + ("?" + args.dashboard.split("?", 1)[1] if "?" in args.dashboard else "")
        )
        try:
            with urllib.request.urlopen(url, timeout=args.wait + 10) as r:
                raw = r.read(_MAX_PICTURE + 1)
            if len(raw) > _MAX_PICTURE:
                raise _CliError(f"the dashboard at {args.dashboard} answered more than {_MAX_PICTURE >> 20} MiB")
            pic = json.loads(raw)
        except urllib.error.HTTPError as e:
            raise _CliError(
                f"the dashboard at {args.dashboard} answered {e.code}: {e.read().decode(errors='replace').strip()}"
            ) from None
        except (urllib.error.URLError, OSError) as e:
            raise _CliError(f"cannot reach the dashboard at {args.dashboard}: {getattr(e, 'reason', e)}") from None
        except ValueError:
            raise _CliError(
                f"the dashboard at {args.dashboard} did not answer with a picture of the mesh (JSON)"
            ) from None
    elif args.bootstrap:
        from lattica._node import Node  # lazy: see the note above _node
        from lattica.actors.dashboard.mesh import MeshWatch  # lazy: see the note above _node

        with Node([], membership=False, mesh=args.mesh) as node:
            info = node.connect(args.bootstrap[0], timeout=args.wait)
            for addr in args.bootstrap[1:]:
                node.connect(addr, timeout=args.wait)

            async def take() -> dict:
                host = cast("Host", node.host)  # a running node has a host, and it its runtime
                rt = cast("Runtime", host.runtime)
                report = host.services.dashboard.report
                return await MeshWatch(rt, report, timeout=args.wait, view_from=info.peer_id).picture()

            pic = node.run(take(), timeout=args.wait * 3 + 10)
    else:
        raise _CliError("give --bootstrap ADDR (any node of the mesh) or --dashboard URL (a node's dashboard)")
    if args.json:
        print(json.dumps(pic), flush=True)
        return
    from lattica.actors.dashboard.text import render  # lazy: see the note above _node

    try:
        shown = render(pic)
    except (TypeError, AttributeError, KeyError, ValueError):
        raise _CliError("the picture of the mesh is malformed (use --json to see it as it came)") from None
    print(shown, flush=True)


_MAX_PICTURE = 256 << 20  # bytes of a dashboard's answer `lattica status --dashboard` reads


class _CliError(Exception):
    """A mistake the user can fix: printed as one line, exit status 2."""


def _demo(args: argparse.Namespace) -> None:
    from lattica._demo import run  # lazy: see the note above _node

    run()


def parser() -> argparse.ArgumentParser:
    """The command line's grammar (the docs' commands are checked against it)."""
    p = argparse.ArgumentParser(prog="lattica", description="Lattica: a peer-to-peer actor framework")
    p.add_argument("--log", default=None, help="log level (debug, info, warning); off by default")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("node", help="run a node until interrupted")
    s.add_argument("--listen", action="append", default=[], help="multiaddr to listen on (repeatable)")
    s.add_argument("--no-mdns", action="store_true", help="do not discover or announce on the LAN with mDNS")
    s.add_argument("--key", default="lattica.key", help="key file, created if absent (default: %(default)s)")
    s.add_argument("--connect", action="append", default=[], help="peer multiaddr to dial at start")
    s.add_argument(
        "--mesh",
        default=None,
        help="mesh key or certificate file or text, or 'open' (default: LATTICA_MESH, else ~/.lattica/mesh.key)",
    )
    s.add_argument(
        "--dashboard",
        default=None,
        metavar="HOST:PORT",
        help="serve the mesh dashboard here (e.g. 127.0.0.1:8265; off loopback it needs the printed token)",
    )
    s.add_argument(
        "--accept-code",
        default="admins",
        choices=["admins", "members", "nobody"],
        help="whose code that travels with a spawn this node runs (default: %(default)s: administrators of its mesh)",
    )
    s.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="PATTERN",
        help="installed classes peers may spawn here, by module.Class pattern (e.g. 'myapp.*'; repeatable)",
    )
    s.add_argument(
        "--spill-limit",
        type=int,
        default=None,
        metavar="BYTES",
        help="a call's arguments or result over the 64 MiB message cap travel by CID up to this many bytes (default 1 GiB; 0: never)",
    )
    s.set_defaults(fn=_node)

    s = sub.add_parser("relay", help="run a public relay (and bootstrap node) until interrupted")
    s.add_argument("--listen", action="append", default=[], help="multiaddr to listen on (repeatable)")
    s.add_argument("--no-mdns", action="store_true", help="do not discover or announce on the LAN with mDNS")
    s.add_argument("--key", default="lattica-relay.key", help="key file, created if absent (default: %(default)s)")
    s.add_argument("--connect", action="append", default=[], help="peer multiaddr to dial at start")
    s.add_argument(
        "--mesh",
        default=None,
        help="mesh key or certificate file or text, or 'open' (default: LATTICA_MESH, else ~/.lattica/mesh.key)",
    )
    s.add_argument(
        "--dashboard",
        default=None,
        metavar="HOST:PORT",
        help="serve the mesh dashboard here (e.g. 127.0.0.1:8265; off loopback it needs the printed token)",
    )
    s.set_defaults(fn=_node, relay=True)

    s = sub.add_parser(
        "mesh", help="mesh credentials: new key, show, print the key, invite a node, print a node's PeerId"
    )
    s.add_argument("op", choices=["new", "show", "key", "invite", "id"])
    s.add_argument(
        "arg",
        nargs="?",
        default=None,
        help="new: key file to create; invite: the PeerId to admit; id: key file (default lattica.key)",
    )
    s.add_argument("--mesh", default=None, help="the mesh key to use (default: LATTICA_MESH, else ~/.lattica/mesh.key)")
    s.add_argument(
        "--days", type=float, default=30.0, help="invite: days the certificate is valid (default: %(default)s)"
    )
    s.add_argument(
        "--admin", action="store_true", help="invite: as an administrator (may stop and rewire any member's actors)"
    )
    s.set_defaults(fn=_mesh)

    s = sub.add_parser("ping", help="connect to a peer and ping it")
    s.add_argument("addr", help="peer multiaddr ending in /p2p/<PeerId>")
    s.add_argument("-c", "--count", type=int, default=5)
    s.set_defaults(fn=_ping)

    s = sub.add_parser("dht", help="put, get, find providers or a peer's addresses in the DHT")
    s.add_argument("op", choices=["put", "get", "providers", "peer"])
    s.add_argument("key", help="key (put/get), content id (providers) or PeerId (peer)")
    s.add_argument("value", nargs="?", default=None, help="put: the value (JSON if it parses, else text)")
    s.add_argument("--subkey", default=None, help="put: store under this subkey")
    s.add_argument("--ttl", type=float, default=3600.0, help="put: seconds the record lives (default: %(default)s)")
    s.add_argument(
        "--bootstrap", action="append", default=[], required=True, help="peer multiaddr to join through (repeatable)"
    )
    s.set_defaults(fn=_dht)

    blocks_help = "blockstore directory (default: LATTICA_BLOCKS, else ~/.lattica/blocks)"
    s = sub.add_parser("put", help="add a file to the blockstore, print its CID and serve it until interrupted")
    s.add_argument("file")
    s.add_argument("--chunk", type=int, default=None, help="chunk size in bytes (default 1 MiB, at most 2 MiB)")
    s.add_argument(
        "--listen", action="append", default=[], help="multiaddr to serve on (default: all interfaces, any port)"
    )
    s.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        help="peer multiaddr to join through, to announce the CID (repeatable)",
    )
    s.add_argument("--blocks", default=None, help=blocks_help)
    s.add_argument("--no-serve", action="store_true", help="store, pin and print the CID, then exit")
    s.add_argument(
        "--key",
        default=None,
        help="key file, created if absent: the PeerId that serves the file stays the same across runs (default: a fresh key)",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar while the file is hashed and stored")
    s.set_defaults(fn=_put)

    s = sub.add_parser("get", help="fetch a CID from the peers that hold it, with a progress bar")
    s.add_argument("cid")
    s.add_argument("-o", "--output", default=None, help="file to write (default: standard output)")
    s.add_argument("--bootstrap", action="append", default=[], help="peer multiaddr to join through (repeatable)")
    s.add_argument("--blocks", default=None, help=blocks_help)
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=_get)

    s = sub.add_parser("content", help="the local blockstore: stat [CID], pin CID, unpin CID, gc")
    s.add_argument("op", choices=["stat", "pin", "unpin", "gc"])
    s.add_argument("cid", nargs="?", default=None)
    s.add_argument("--bootstrap", action="append", default=[], help="pin: peer multiaddr to fetch through (repeatable)")
    s.add_argument("--blocks", default=None, help=blocks_help)
    s.add_argument("-q", "--quiet", action="store_true", help="pin: no progress bar while it fetches")
    s.set_defaults(fn=_content)

    s = sub.add_parser("doctor", help="reachability, NAT type, relays and paths, with reasons in plain words")
    s.add_argument(
        "--listen", action="append", default=[], help="multiaddr to listen on (default: all interfaces, any port)"
    )
    s.add_argument("--bootstrap", action="append", default=[], help="peer multiaddr to join through (repeatable)")
    s.add_argument("--peer", default=None, help="also reach this PeerId and report the path")
    s.add_argument(
        "--wait", type=float, default=20.0, help="seconds to wait for the AutoNAT verdict (default: %(default)s)"
    )
    s.add_argument("--json", action="store_true", help="the report as one JSON object")
    s.add_argument(
        "--mesh", default=None, help="mesh key or certificate (default: LATTICA_MESH, else ~/.lattica/mesh.key)"
    )
    s.set_defaults(fn=_doctor)

    s = sub.add_parser("status", help="the mesh at a glance: nodes, resources, actors, supervisors, paths")
    s.add_argument("--bootstrap", action="append", default=[], help="a node of the mesh to ask (repeatable)")
    s.add_argument(
        "--dashboard", default=None, help="or: a node's dashboard address (with ?token=... when it needs one)"
    )
    s.add_argument("--wait", type=float, default=5.0, help="seconds to wait for each node (default: %(default)s)")
    s.add_argument("--json", action="store_true", help="the picture as one JSON object")
    s.add_argument(
        "--mesh", default=None, help="mesh key or certificate (default: LATTICA_MESH, else ~/.lattica/mesh.key)"
    )
    s.set_defaults(fn=_status)

    s = sub.add_parser(
        "demo", help="a local mesh: identify, ping, sharded work, the DHT, supervised restarts after node loss"
    )
    s.set_defaults(fn=_demo)

    bench_command.add_parser(sub)

    return p


def main(argv: list[str] | None = None) -> None:
    from lattica._api import goodbye_on_sigterm  # lazy: see the note above _node

    args = parser().parse_args(argv)
    goodbye_on_sigterm()  # (a node stopped by kill, systemd or docker says goodbye)
    if args.log:
        lattica_logging.configure(args.log)
    try:
        args.fn(args)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # (`lattica status | head`: the reader has what it wanted)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error when Python flushes at exit)
        sys.exit(0)
    except Exception as e:
        if args.log == "debug" or not _explainable(e):
            raise  # (a bug, or asked for: the traceback)
        print(f"lattica {args.cmd}: {_say(e)}", file=sys.stderr, flush=True)
        sys.exit(2 if isinstance(e, (_CliError, ValueError)) else 1)


def _explainable(e: BaseException) -> bool:
    """Errors that say what went wrong in their message: a user's mistake or the network's."""
    from lattica.errors import LatticaError  # lazy: see the note above _node

    return isinstance(e, (_CliError, LatticaError, ValueError, OSError, TimeoutError))


def _say(e: BaseException) -> str:
    from lattica.errors import BlockNotFound, MultiaddrError  # lazy: see the note above _node

    text = str(e) or type(e).__name__
    if isinstance(e, MultiaddrError):
        text += " (a multiaddr looks like /ip4/1.2.3.4/tcp/4001/p2p/12D3KooW...)"
    if isinstance(e, (_CliError, BlockNotFound)):
        return text  # (the whole story: no traceback to offer)
    return text + "; run with --log debug for the traceback"


if __name__ == "__main__":
    main()
