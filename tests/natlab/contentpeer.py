"""A content-plane lab node, written the way a user writes a script (``lattica.init`` +
``lattica.content``); modelled on coldpeer.py.

    python -u contentpeer.py provider --ip IP --blocks DIR --size BYTES --seed N --bootstrap ADDR ...
    python -u contentpeer.py fetcher --ip IP --blocks DIR --cid CID --provider PEERID --bootstrap ADDR ...

The provider starts a node, puts ``--size`` seeded random bytes (``random.Random(seed).randbytes``:
the test computes the same sha256), waits (at most ``--settle`` s) until peers have a path to it
(public, or holding a relay reservation), prints one JSON line ``{"event": "ready", "cid": ...}``
and then answers one JSON line per ``stats`` line read from stdin: the blocks and bytes it
served. It stays up until its stdin closes or it is killed.

The fetcher starts a fresh node with the bootstrap addresses, calls ``lattica.content.get(cid)``
and prints one JSON line before it ends: ``ok``, ``sha256``, ``size``, the times (seconds from the
start of ``lattica.init``: ``init_s``, ``first_byte_s``, ``get_s``; ``seconds``: the get alone),
the transport of its connection to the provider when the first bytes arrived (``first_path``),
every change of it while bytes arrived (``paths``) and when the get returned (``path``: ``tcp``,
``quic`` or ``relay``), and when bytes first arrived over a direct path (``direct_s``, None:
never), and how many bytes came from the provider and from others (``from_provider``,
``from_others``) and the other peers it asked (``others_asked``: [asked, failures] each). A
failed get adds what it saw (``session``, ``conns``, ``provider_addrs``, ``providers_now``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time

import lattica
import lattica.logging
from lattica.config import ContentConfig


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _settled(st: lattica.nat._manager.NatStatus) -> bool:
    """As coldpeer's callee: proven public, or holding a relay reservation."""
    return st.reachability == "public" or bool(st.relays)


def _transport(peer: lattica.PeerId) -> str | None:
    conn = lattica.node().host.conns.get(peer)
    return None if conn is None or conn.is_closed else conn.transport


def _diagnose(cid: str, provider: lattica.PeerId) -> dict:
    """What a failed get saw (for the test's report): the fetch's peers as its session sees them,
    our connections, and what a provider lookup finds now."""
    from lattica.content._cid import Cid

    host = lattica.node().host
    svc = host.services.content
    fetch = svc._fetches.get(Cid.parse(cid))
    stats = fetch.session.stats() if fetch is not None else svc.last_stats
    out: dict = {
        "fetch_running": fetch is not None,
        "session": {
            str(p)[-8:]: {
                "bytes": s.bytes,
                "asked": s.asked,
                "failures": s.failures,
                "active": s.active,
                "reason": s.reason,
            }
            for p, s in stats.items()
        },
        "conns": {str(p)[-8:]: c.transport for p, c in list(host.conns.items())},
        "provider_addrs": [str(a) for a in list(host.peer_addrs.get(provider, ()))],
    }
    try:
        found = lattica.content.providers(cid).result(15)
        out["providers_now"] = [str(p)[-8:] for p in found]
    except Exception as e:  # noqa: BLE001
        out["providers_now"] = f"{type(e).__name__}: {e}"
    return out


def provider(args: argparse.Namespace, listen: list[str], content: ContentConfig) -> None:
    t0 = time.perf_counter()
    lattica.init(listen, bootstrap=args.bootstrap, mdns=False, membership=args.membership, content=content)
    init_s = time.perf_counter() - t0
    data = random.Random(args.seed).randbytes(args.size)
    t1 = time.perf_counter()
    cid = lattica.content.put(data).result(60)  # chunk, store, pin, announce (in the background)
    put_s = time.perf_counter() - t1
    deadline = time.monotonic() + args.settle
    st = lattica.nat_status()
    while not _settled(st) and time.monotonic() < deadline:
        time.sleep(0.1)
        st = lattica.nat_status()
    _say(
        {
            "event": "ready",
            "peer_id": str(lattica.node().peer_id),
            "cid": cid,
            "sha256": hashlib.sha256(data).hexdigest(),
            "reachability": st.reachability,
            "relays": len(st.relays),
            "init_s": round(init_s, 3),
            "put_s": round(put_s, 3),
            "settle_s": round(time.perf_counter() - t0, 3),
        }
    )
    del data
    svc = lattica.node().host.services.content
    for line in sys.stdin:  # until the test closes our stdin (or kills us)
        if line.strip() == "stats":
            _say({"served_bytes": svc.served_bytes, "served_blocks": svc.served_blocks})


def fetcher(args: argparse.Namespace, listen: list[str], content: ContentConfig) -> None:
    t0 = time.perf_counter()
    since = lambda: round(time.perf_counter() - t0, 3)  # noqa: E731
    out: dict = {"event": "done"}
    try:
        lattica.init(listen, bootstrap=args.bootstrap, mdns=False, membership=args.membership, content=content)
    except lattica.errors.LatticaError as e:
        _say({**out, "ok": False, "error": f"init: {type(e).__name__}: {e}"})
        return
    out["init_s"] = since()
    peer = lattica.PeerId.from_string(args.provider)
    # the path to the provider whenever bytes came in (sampled on the node's loop; a connection
    # that only carried an AutoNAT dial-back does not count): the first, and every change
    seen: dict = {"first_path": None, "first_byte_s": None, "direct_s": None, "paths": []}
    last = [0]

    def progress(info: dict) -> None:  # on the node's loop, as the fetch goes on
        got = info.get("bytes") or 0
        if got <= last[0]:
            return
        last[0] = got
        path = _transport(peer)
        if seen["first_byte_s"] is None:
            seen["first_byte_s"], seen["first_path"] = since(), path
        if not seen["paths"] or seen["paths"][-1] != path:
            seen["paths"].append(path)
        if path not in (None, "relay") and seen["direct_s"] is None:
            seen["direct_s"] = since()

    t1 = time.perf_counter()
    try:
        data = lattica.content.get(args.cid, progress=progress).result(args.timeout)
    except Exception as e:  # noqa: BLE001 -- reported to the test, which decides
        _say(
            {
                **out,
                **seen,
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "path": _transport(peer),
                "get_s": since(),
                **_diagnose(args.cid, peer),
            }
        )
        return
    out["seconds"] = round(time.perf_counter() - t1, 3)
    out["get_s"] = since()
    out["path"] = _transport(peer)
    svc = lattica.node().host.services.content
    by_peer = {str(p): s.bytes for p, s in svc.last_stats.items() if s.bytes}
    # the other peers the fetch asked (e.g. providers that went away): [asked, failures] each
    out["others_asked"] = {
        str(p)[-8:]: [s.asked, s.failures] for p, s in svc.last_stats.items() if s.asked and str(p) != args.provider
    }
    out.update(
        seen,
        ok=True,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        from_provider=by_peer.get(args.provider, 0),
        from_others=sum(b for p, b in by_peer.items() if p != args.provider),
    )
    _say(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["provider", "fetcher"])
    p.add_argument("--ip", required=True)
    p.add_argument("--blocks", required=True, help="this node's blockstore directory")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--size", type=int, default=4 << 20, help="provider: bytes to put")
    p.add_argument("--seed", type=int, default=0, help="provider: seed of the random bytes")
    p.add_argument("--settle", type=float, default=20.0, help="provider: seconds to wait for a settled reachability")
    p.add_argument("--cid", help="fetcher: what to get")
    p.add_argument(
        "--provider", help="fetcher: the provider's PeerId (to watch the path to it; the get finds it alone)"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="fetcher: seconds for the get")
    p.add_argument(
        "--no-membership",
        dest="membership",
        action="store_false",
        help="stay out of membership gossip (a user's node joins it)",
    )
    p.add_argument("--log", help="log level for lattica's logs on stderr (debugging)")
    args = p.parse_args()
    if args.log:
        lattica.logging.configure(args.log)
    listen = [f"/ip4/{args.ip}/tcp/4001", f"/ip4/{args.ip}/udp/4001/quic-v1"]
    content = ContentConfig(blocks=args.blocks)
    (provider if args.role == "provider" else fetcher)(args, listen, content)


if __name__ == "__main__":
    main()
