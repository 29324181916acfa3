"""A cold-start lab node, written the way a user writes a script (``lattica.init`` + names).

    python -u coldpeer.py callee --ip IP --name NAME --bootstrap ADDR [--bootstrap ADDR]
    python -u coldpeer.py caller --ip IP --name NAME --bootstrap ADDR [--bootstrap ADDR]

The callee starts a node, spawns a ``Counter`` named NAME, waits (at most ``--settle`` s) until
peers have a path to it (public, or holding a relay reservation), prints one JSON
line ``{"event": "ready", ...}`` and stays up until it is killed.

The caller starts a fresh node, resolves NAME with ``lattica.get_actor`` until it resolves, calls
the actor, then watches (at most ``--direct-wait`` s) for the connection to become direct and
prints one JSON line with its times (milliseconds from the start of ``lattica.init``) before it
ends: ``init_ms``, ``resolve_ms``, ``call_ms``, ``direct_ms`` (None: never direct), ``path``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))

import lattica  # noqa: E402
import lattica.logging  # noqa: E402
import sample_actors as sa  # noqa: E402


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _settled(st: lattica.nat.NatStatus) -> bool:
    """Peers have a path to us: proven public, or holding a relay reservation (private, or not
    proven either way: only helpers at fresh addresses tell a full cone from an address-restricted
    NAT, and a cold lab may have none)."""
    return st.reachability == "public" or bool(st.relays)


def callee(args: argparse.Namespace, listen: list[str]) -> None:
    t0 = time.perf_counter()
    lattica.init(listen, bootstrap=args.bootstrap, allow=["sample_actors.*"], mdns=False, membership=args.membership)
    ref = sa.Counter.options(name=args.name).remote(0)  # spawned here and registered in the DHT
    lattica.get(ref.get.remote())
    deadline = time.monotonic() + args.settle
    st = lattica.nat_status()
    while not _settled(st) and time.monotonic() < deadline:
        time.sleep(0.1)
        st = lattica.nat_status()
    _say({"event": "ready", "peer_id": str(lattica.node().peer_id), "reachability": st.reachability, "relays": len(st.relays), "settle_ms": round((time.perf_counter() - t0) * 1e3, 1)})
    sys.stdin.read()  # until the test closes our stdin (or kills us)


def caller(args: argparse.Namespace, listen: list[str]) -> None:
    t0 = time.perf_counter()
    ms = lambda: round((time.perf_counter() - t0) * 1e3, 1)  # noqa: E731
    out: dict = {"event": "done"}
    lattica.init(listen, bootstrap=args.bootstrap, mdns=False, membership=args.membership)
    out["init_ms"] = ms()
    deadline = time.monotonic() + args.timeout
    ref = None
    errors = []
    while ref is None:
        try:
            ref = lattica.get_actor(args.name, timeout=max(0.1, deadline - time.monotonic()))
        except lattica.errors.LatticaError as e:
            errors.append(f"{type(e).__name__}: {e}")
            if time.monotonic() >= deadline:
                _say({**out, "ok": False, "error": errors[-1], "tries": len(errors)})
                return
            time.sleep(0.05)
    out["resolve_ms"] = ms()
    out["tries"] = len(errors) + 1
    try:
        value = lattica.get(ref.incr.remote(1), timeout=max(0.1, deadline - time.monotonic()))
    except lattica.errors.LatticaError as e:
        _say({**out, "ok": False, "error": f"{type(e).__name__}: {e}"})
        return
    out["call_ms"] = ms()
    host = lattica.node().host
    first = time.monotonic()
    conn = host.conns.get(ref.peer_id)
    while (conn is None or conn.transport == "relay") and time.monotonic() - first < args.direct_wait:
        time.sleep(0.01)
        conn = host.conns.get(ref.peer_id)
    out["path"] = conn.transport if conn is not None else None
    out["direct_ms"] = ms() if conn is not None and conn.transport != "relay" else None
    out["ok"] = value == 1
    _say(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["callee", "caller"])
    p.add_argument("--ip", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--settle", type=float, default=20.0, help="callee: seconds to wait for a settled reachability")
    p.add_argument("--timeout", type=float, default=20.0, help="caller: seconds to resolve and call")
    p.add_argument("--direct-wait", type=float, default=5.0, help="caller: seconds to wait for a direct path after the first call")
    p.add_argument("--no-membership", dest="membership", action="store_false", help="stay out of membership gossip (a user's node joins it)")
    p.add_argument("--log", help="log level for lattica's logs on stderr (debugging)")
    args = p.parse_args()
    if args.log:
        lattica.logging.configure(args.log)
    listen = [f"/ip4/{args.ip}/tcp/4001", f"/ip4/{args.ip}/udp/4001/quic-v1"]
    (callee if args.role == "callee" else caller)(args, listen)


if __name__ == "__main__":
    main()
