"""A picture of the mesh as terminal text (``lattica status``): nodes with their resources, user
actors (system actors counted apart) with their last error, actors that failed lately,
supervision trees and paths, one table each."""

from __future__ import annotations

from typing import Any

from lattica.actors.dashboard.clean import clean_member, clean_report, text

__all__ = ["render"]

MAX_ACTOR_LINES = 50
MAX_PATH_LINES = 200


def render(pic: Any) -> str:
    """The picture as text; everything in it is checked first (it may come from any dashboard,
    and each report from any member): no control characters reach the terminal."""
    nodes, reports = [], []
    for n in pic.get("nodes", []) if type(pic) is dict and type(pic.get("nodes")) is list else []:
        row = clean_member(n)
        if row is None:
            continue
        row["self"] = n.get("self") is True
        row["error"] = text(n.get("error"), 60)
        nodes.append(row)
        reports.append(clean_report(n.get("report")) or {})
    up = sum(1 for n in nodes if n.get("state") in ("alive", "suspect") and not n.get("observer"))
    down = sum(1 for n in nodes if n.get("state") not in ("alive", "suspect"))
    actors = [(n, a) for n, r in zip(nodes, reports) for a in r.get("actors", ()) if not a.get("system")]
    observers = {
        n["peer_id"] for n in nodes if n.get("observer")
    }  # (`lattica status`'s own node: its paths are not the mesh's)
    paths = [
        (n, p)
        for n, r in zip(nodes, reports)
        if not n.get("observer")
        for p in r.get("peers", ())
        if p.get("peer_id") not in observers
    ]
    direct = sum(1 for _, p in paths if p.get("path") == "direct")
    out = [
        f"mesh: {up} nodes up, {down} down or left; {len(actors)} actors; {direct} direct paths, {len(paths) - direct} relayed",
        "",
    ]

    rows: list[tuple[str, ...]] = [
        ("NODE", "STATE", "REACHABILITY", "ACTORS", "SYSTEM", "CPU", "MEMORY", "GPUS", "LOAD", "LABELS")
    ]
    for n, r in zip(nodes, reports):
        load = n.get("load")
        system = sum(1 for a in r.get("actors", ()) if a.get("system")) if r else 0
        rows.append(
            (
                _short(n.get("peer_id"))
                + (" (this)" if n.get("self") and not n.get("observer") else " (asking)" if n.get("observer") else ""),
                str(n.get("state") or ""),
                _reach(r.get("nat")) if r else (n.get("error") or ""),
                str(sum(1 for a in r.get("actors", ()) if not a.get("system"))) if r else "",
                str(system) if r else "",
                _num(n.get("cpu")),
                _bytes(n.get("memory")),
                _num(n.get("gpus")),
                _load(load),
                " ".join(f"{k}={v}" for k, v in (n.get("labels") or {}).items()),
            )
        )
    out += _table(rows)

    if actors:
        out += ["", "ACTORS"]
        rows = [("NODE", "NAME", "CLASS", "STATE", "MAILBOX", "CALLS", "ERRORS", "LAST ERROR")]
        for n, a in actors[:MAX_ACTOR_LINES]:
            err = a.get("last_error") or {}
            rows.append(
                (
                    _short(n.get("peer_id")),
                    str(a.get("name")),
                    str(a.get("class")),
                    str(a.get("state")),
                    str(a.get("mailbox")),
                    str(a.get("calls")),
                    str(a.get("errors")),
                    f"{err.get('type')}: {err.get('message')}"[:60] if err else "",
                )
            )
        out += _table(rows)
        if len(actors) > MAX_ACTOR_LINES:
            out.append(f"... and {len(actors) - MAX_ACTOR_LINES} more (--json lists them all)")

    ended = [(n, e) for n, r in zip(nodes, reports) for e in r.get("ended", ()) if e.get("state") == "failed"]
    if ended:
        out += ["", "FAILED LATELY"]
        rows = [("NODE", "NAME", "CLASS", "WHY")]
        for n, e in ended[-MAX_ACTOR_LINES:]:
            rows.append(
                (_short(n.get("peer_id")), str(e.get("name")), str(e.get("class")), str(e.get("reason") or "")[:80])
            )
        out += _table(rows)

    trees = [(n, s) for n, r in zip(nodes, reports) for s in r.get("supervisors", ())][:MAX_ACTOR_LINES]
    if trees:
        out += ["", "SUPERVISORS"]
        for n, s in trees:
            out.append(f"{s.get('name')} ({s.get('strategy')}) on {_short(n.get('peer_id'))}")
            children = s.get("children", ())
            for c in children[:MAX_ACTOR_LINES]:
                where = f"on {_short(c.get('node'))}" if c.get("node") else "not running"
                out.append(f"  └ {c.get('id')}  {c.get('class')}  {where}  restarts {_num(c.get('restarts'))}")
            if len(children) > MAX_ACTOR_LINES:
                out.append(f"  └ ... and {len(children) - MAX_ACTOR_LINES} more")

    if paths:
        paths, more = paths[:MAX_PATH_LINES], len(paths) - MAX_PATH_LINES
        out += ["", "PATHS"]
        rows = [("FROM", "TO", "PATH", "TRANSPORT", "DIALED", "RTT")]
        for n, p in paths:
            rtt = p.get("rtt_ms")
            rows.append(
                (
                    _short(n.get("peer_id")),
                    _short(p.get("peer_id")),
                    str(p.get("path")),
                    str(p.get("transport")),
                    str(p.get("direction")),
                    f"{rtt:.2f} ms" if isinstance(rtt, (int, float)) else "",
                )
            )
        out += _table(rows)
        if more > 0:
            out.append(f"... and {more} more (--json lists them all)")
    return "\n".join(out)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def _short(pid: Any) -> str:
    return "…" + str(pid)[-8:] if pid else ""


def _num(v: Any) -> str:
    return "" if v is None else f"{v:g}" if isinstance(v, (int, float)) else str(v)


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return ""


def _load(load: Any) -> str:
    """A gossiped load as words: ``3 actors; cpu 2 reserved``."""
    if not isinstance(load, dict):
        return _num(load)
    parts = []
    if isinstance(load.get("actors"), (int, float)):
        parts.append(f"{load['actors']:g} actor{'' if load['actors'] == 1 else 's'}")
    reserved = load.get("reserved")
    kept = [
        f"{k} {_num(v)}"
        for k, v in (reserved.items() if isinstance(reserved, dict) else ())
        if isinstance(v, (int, float)) and v > 0
    ]
    if kept:
        parts.append(", ".join(kept) + " reserved")
    return "; ".join(parts)


def _reach(nat: Any) -> str:
    """Reachability; on a loopback-only node, "loopback only" (there is nothing to check)."""
    if not isinstance(nat, dict):
        return ""
    if nat.get("loopback") and nat.get("reachability") == "unknown":
        return "loopback only"
    return str(nat.get("reachability") or "")
