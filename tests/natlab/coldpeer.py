"""A cold-start lab node, written the way a user writes a script (``lattica.init`` + names).

    python -u coldpeer.py callee --ip IP --name NAME --bootstrap ADDR [--bootstrap ADDR]
    python -u coldpeer.py caller --ip IP --name NAME --bootstrap ADDR [--bootstrap ADDR]

The callee starts a node (then prints ``{"event": "up"}``), spawns a ``Counter`` named NAME,
waits (at most ``--settle`` s) until peers have a path to it (public, or holding a relay
reservation), prints one JSON line ``{"event": "ready", ...}`` and stays up until it is killed.

The caller (with ``--go-on-stdin``: once a line comes on its stdin, so that a test can start
its process ahead) starts a fresh node, resolves NAME with ``lattica.get_actor`` until it
resolves, calls the actor, then watches (at most ``--direct-wait`` s) for the connection to
become direct and prints one JSON line with its times (milliseconds from the start of
``lattica.init``) before it ends: ``init_ms``, ``resolve_ms``, ``call_ms``, ``direct_ms`` (None:
never direct), ``path``.

With ``--calls-after-direct N`` the caller calls continuously instead: ``ref.incr.remote(1)`` back
to back (each waits for its reply, at most ``--call-timeout`` s) from the first call, through the
moment its connection to the callee turns direct, until N calls after it (or, never direct, until
``--direct-wait`` s after the first call and at least N calls). A failed call does not stop it:
each is recorded with its error and whether the path was direct when it was made. The JSON line
then also has ``calls``, ``failed``, ``errors`` (the first 5: ``error``, ``direct``, ``at_ms``),
``calls_direct`` (made on a direct path), ``paths`` (each change of the connection calls take:
``[ms, "relay#1"]``, ``[ms, "tcp#2"]``, ...; ``#n`` numbers the connections) and ``value`` (the counter's last value: the calls the
callee ran, up to the last reply; more than the successful calls when a failed one ran there
and only its reply was lost); ``call_ms`` is the first successful call. At most ``--calls-for``
s of calls in all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))

import lattica  # noqa: E402
import lattica.logging  # noqa: E402
import sample_actors as sa  # noqa: E402


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _settled(st: lattica.nat._manager.NatStatus) -> bool:
    """Peers have a path to us: proven public, or holding a relay reservation (private, or not
    proven either way: only helpers at fresh addresses tell a full cone from an address-restricted
    NAT, and a cold lab may have none)."""
    return st.reachability == "public" or bool(st.relays)


def callee(args: argparse.Namespace, listen: list[str]) -> None:
    t0 = time.perf_counter()
    lattica.init(listen, bootstrap=args.bootstrap, allow=["sample_actors.*"], mdns=False, membership=args.membership)
    _say({"event": "up"})
    ref = sa.Counter.options(name=args.name).remote(0)  # spawned here and registered in the DHT
    lattica.get(ref.get.remote())
    deadline = time.monotonic() + args.settle
    st = lattica.nat_status()
    while not _settled(st) and time.monotonic() < deadline:
        time.sleep(0.1)
        st = lattica.nat_status()
    _say(
        {
            "event": "ready",
            "peer_id": str(lattica.node().peer_id),
            "reachability": st.reachability,
            "relays": len(st.relays),
            "settle_ms": round((time.perf_counter() - t0) * 1e3, 1),
        }
    )
    sys.stdin.read()  # until the test closes our stdin (or kills us)


def caller(args: argparse.Namespace, listen: list[str]) -> None:
    if args.go_on_stdin:
        sys.stdin.readline()  # (started ahead: Python and the imports are up, no node yet)
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
    if args.calls_after_direct is not None:
        _call_continuously(args, ref, out, ms)
        return
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


def _path(host, peer) -> str | None:
    conn = host.conns.get(peer)
    return None if conn is None else conn.transport


def _watch_paths(host, peer, ms, changes: list, stop: threading.Event) -> None:
    """Every 10 ms: the connection calls to ``peer`` take (its transport, and a new number each
    time it is another connection), appended to ``changes`` as ``[ms, transport#n]`` on change."""
    seen: dict[int, int] = {}
    last = None
    while not stop.wait(0.01):
        conn = host.conns.get(peer)
        now = None if conn is None else f"{conn.transport}#{seen.setdefault(id(conn), len(seen) + 1)}"
        if now != last and len(changes) < 20:
            changes.append([ms(), now])
        last = now


def _call_continuously(args: argparse.Namespace, ref, out: dict, ms) -> None:
    """Calls back to back through the path's change (see the module docstring)."""
    host = lattica.node().host
    first = time.monotonic()
    calls = failed = calls_direct = after_direct = value = 0
    errors: list[dict] = []
    out["paths"] = []  # the connection's changes, see _watch_paths
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_paths, args=(host, ref.peer_id, ms, out["paths"], stop), daemon=True)
    watcher.start()
    while True:
        path = _path(host, ref.peer_id)
        direct = path not in (None, "relay")
        if direct and out.get("direct_ms") is None:
            # (when the watcher saw it: up to a call's round trip before this)
            out["direct_ms"] = next((t for t, p in out["paths"] if p and not p.startswith("relay")), ms())
        spent = time.monotonic() - first
        if (
            after_direct >= args.calls_after_direct
            or spent >= args.calls_for
            or (not direct and spent >= args.direct_wait and calls >= args.calls_after_direct)
        ):
            break
        calls += 1
        calls_direct += direct
        after_direct += out.get("direct_ms") is not None
        at = ms()
        try:
            got = lattica.get(ref.incr.remote(1), timeout=args.call_timeout)
        except Exception as e:  # noqa: BLE001 (whatever it is, count it and go on)
            failed += 1
            if len(errors) < 5:
                errors.append(
                    {
                        "error": f"{type(e).__name__}: {e}",
                        "direct": direct,
                        "path": path,
                        "at_ms": at,
                        "took_ms": round(ms() - at, 1),
                    }
                )
            continue
        value = got
        if out.get("call_ms") is None:
            out["call_ms"] = ms()
    stop.set()
    watcher.join()
    out.setdefault("direct_ms", None)
    out["path"] = _path(host, ref.peer_id)
    out.update(calls=calls, failed=failed, calls_direct=calls_direct, errors=errors, value=value)
    out["ok"] = out.get("call_ms") is not None
    if not out["ok"]:
        out["error"] = errors[0]["error"] if errors else "no call"
    _say(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["callee", "caller"])
    p.add_argument("--ip", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--settle", type=float, default=20.0, help="callee: seconds to wait for a settled reachability")
    p.add_argument("--timeout", type=float, default=20.0, help="caller: seconds to resolve and call")
    p.add_argument(
        "--direct-wait", type=float, default=5.0, help="caller: seconds to wait for a direct path after the first call"
    )
    p.add_argument(
        "--calls-after-direct",
        type=int,
        default=None,
        metavar="N",
        help="caller: call continuously from the first call until N calls after the path turned direct (failures recorded, not fatal)",
    )
    p.add_argument(
        "--call-timeout",
        type=float,
        default=10.0,
        help="caller, with --calls-after-direct: seconds each call waits for its reply",
    )
    p.add_argument(
        "--calls-for",
        type=float,
        default=120.0,
        help="caller, with --calls-after-direct: at most this many seconds of calls",
    )
    p.add_argument(
        "--go-on-stdin",
        action="store_true",
        help="caller: start only when a line comes on stdin (a test starts callers ahead of their turn)",
    )
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
    (callee if args.role == "callee" else caller)(args, listen)


if __name__ == "__main__":
    main()
