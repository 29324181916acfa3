"""One node's report for the dashboard: who it is, how it is reached, its peers and paths, its
actors (with supervision trees), its DHT, content transfers, topics and documents. Plain data
(str, int, float, bool, lists, dicts), bounded in size: it travels as a call's answer."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls
    from lattica._runtime.local import EndedActor
    from lattica.actors.dashboard.usage import Usage
    from lattica.actors.spawner import Spawner
    from lattica.config import NodeConfig
    from lattica.services import NodeServices

__all__ = ["node_report", "actor_detail", "program", "NAME", "MAX_ACTORS", "MAX_PEERS", "MAX_CHILDREN", "MAX_ENDED"]

NAME = "dashboard"  # the system actor every node runs

MAX_ACTORS = 5000  # actors listed per node (the rest counted)
MAX_PEERS = 1000  # connections listed per node
MAX_CHILDREN = 500  # children listed per supervisor
MAX_ENDED = 64  # user actors that ended lately, listed per node
MAX_OUTPUT = 200  # lines of an actor's output in its detail
_TREE_WAIT = 0.5  # seconds a supervisor that is still starting gets to list its children


async def node_report(
    rt: Calls, services: NodeServices, config: NodeConfig, usage: Usage | None = None
) -> dict[str, Any]:
    """This node, as its dashboard and every other node's dashboard show it."""
    host = rt.host
    actors, supervisors = await _actors(rt, services.spawner)
    addrs = [str(a) for a in host.advertised_addrs()][:32]
    out: dict[str, Any] = {
        "peer_id": str(rt.peer_id),
        "agent": config.agent_version,
        "pid": os.getpid(),
        "program": program(),
        "time": time.time(),
        "addrs": addrs,
        "nat": _nat(host, addrs),
        "usage": usage.latest if usage is not None else {},
        "ended": [_ended_row(e) for e in list(rt.ended)[-MAX_ENDED:]],
        "labels": dict(config.labels),
        "peers": _peers(host),
        "actors": actors,
        "actor_count": len(rt.actors),
        "supervisors": supervisors,
        "dht": _dht(services.dht),
        "content": _content(services.content),
        "pubsub": _pubsub(services.pubsub),
        "crdt": _crdt(services.crdt),
    }
    relay = services.relay
    if relay is not None:
        out["relay"] = _relay(relay)
    return out


def program() -> str:
    """What this process runs, as a user would name it: ``train.py``, ``lattica node`` (only
    the program and a CLI's command: other arguments may hold secrets)."""
    argv = sys.argv or [""]
    name = os.path.basename(argv[0]) or "python"
    if name == "lattica" and len(argv) > 1:
        return f"lattica {argv[1]}"
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:  # python -m pkg.mod
        return f"python -m {spec.name.removesuffix('.__main__')}"
    return name


def _nat(host: Any, addrs: list[str]) -> dict[str, Any]:
    nat = getattr(host, "nat", None)
    loopback = bool(addrs) and all(a.startswith(("/ip4/127.", "/ip6/::1/")) for a in addrs)
    if nat is None:
        return {"reachability": "unknown", "reason": "no AutoNAT on this node", "loopback": loopback}
    s = nat.snapshot()
    return {
        "reachability": s.reachability,
        "mapping": s.mapping,
        "reason": s.reason,
        "observed": s.observed[:8],
        "public": s.public[:8],
        "relays": s.relays[:8],
        "checked_at": s.checked_at,
        "loopback": loopback,
    }


_PATH_FIGURES = ("rtt_ms", "bytes_sent", "bytes_received")


def _peers(host: Any) -> list[dict[str, Any]]:
    rows = []
    for peer, conn in list(host.conns.items())[:MAX_PEERS]:
        info = host.info.get(conn)
        remote = str(conn.remote_addr)
        row = {
            "peer_id": str(peer),
            "transport": conn.transport,
            "direction": conn.direction,
            "path": "relayed" if "/p2p-circuit" in remote else "direct",
            "remote": remote,
            "circle": info.circle if info is not None else "unidentified",
            "agent": info.agent_version if info is not None else "",
        }
        stats = conn.path_stats()  # (a relayed path's are end to end: timed by the mux, counted on the circuit)
        if stats:
            row.update({k: round(v, 3) if k == "rtt_ms" else int(v) for k, v in stats.items() if k in _PATH_FIGURES})
        rows.append(row)
    return rows


async def _actors(rt: Calls, spawner: Spawner) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from lattica._remote import ActorClass, class_path  # (with the supervisor, above)
    from lattica.supervisor import Supervisor  # (not at start: a node that runs no supervisor never loads it)

    library = spawner.code
    rows, trees = [], []
    for name, a in list(rt.actors.items())[:MAX_ACTORS]:
        sender = library.sender_of(name) if library is not None else None
        job = spawner.jobs.of(name) if spawner is not None else None
        rows.append(
            {
                "name": name,
                "class": class_path(a.cls),
                "state": a.state,
                "system": a.system,
                "mailbox": len(a.waiting),
                "running": len(a.live),
                "calls": a.calls,
                "errors": a.errors,
                "failure": a.failure[2][:200] if a.failure else None,
                "last_error": _last_error(a.recent_errors),
                "output": len(a.output.lines) if a.output is not None else 0,
                "started": a.started_at,
                "code": str(sender) if sender is not None else None,
                "job": str(job) if job is not None else None,
            }
        )
        # (``@actor`` made Supervisor an ActorClass: mypy does not apply class decorators)
        if isinstance(a.instance, cast(ActorClass, Supervisor).cls) and a.state == "running":
            trees.append(await _tree(name, a.instance))
    return rows, trees


async def _tree(name: str, sup: Any) -> dict[str, Any]:
    try:
        children = await asyncio.wait_for(sup.which_children(), _TREE_WAIT)
    except (TimeoutError, Exception):  # (still starting, or it failed: shown without children)
        children = []
    return {"name": name, "strategy": sup.strategy, "children": children[:MAX_CHILDREN]}


def _dht(dht: Any) -> dict[str, Any] | None:
    if dht is None:
        return None
    return {"table": len(dht.table), "records": dht.store.record_count, "rejected": dht.rejected}


def _content(content: Any) -> dict[str, Any] | None:
    if content is None:
        return None
    return {
        "transfers": content.transfers()[:64],
        "served_blocks": content.served_blocks,
        "served_bytes": content.served_bytes,
    }


def _pubsub(pubsub: Any) -> dict[str, Any] | None:
    if pubsub is None:
        return None
    topics = pubsub.topics()
    return {
        "topics": [{"topic": t, "mesh": len(pubsub.peers(t))} for t in topics[:256]],
        "published": pubsub.published,
        "delivered": pubsub.delivered,
        "rejected": pubsub.rejected,
    }


def _crdt(crdt: Any) -> dict[str, Any] | None:
    if crdt is None:
        return None
    docs = []
    for replica in list(crdt.docs.values())[:256]:
        st = replica.stats()
        docs.append({k: st[k] for k in ("name", "id", "applied", "refused", "peers", "log_bytes") if k in st})
    return {"docs": docs}


def _relay(relay: Any) -> dict[str, Any]:
    return {
        "reservations": len(relay.reservations),
        "circuits": sum(relay.circuits.values()),
        "total_circuits": relay.total_circuits,
        "bytes_relayed": relay.bytes_relayed,
    }


def _last_error(errors: Any) -> dict[str, Any] | None:
    if not errors:
        return None
    e = errors[-1]
    return {"type": e["type"], "message": e["message"][:200], "method": e["method"], "time": e["time"]}


def _ended_row(e: EndedActor) -> dict[str, Any]:
    from lattica._remote import class_path  # (with the supervisor, above)

    return {
        "name": e.name,
        "class": class_path(e.cls),
        "state": e.state,
        "reason": e.reason[:200],
        "calls": e.calls,
        "errors": e.error_count,
        "last_error": _last_error(e.errors),
        "output": len(e.output.lines) if e.output is not None else 0,
        "started": e.started_at,
        "ended": e.ended_at,
    }


def actor_detail(rt: Calls, name: str, usage: Usage | None = None) -> dict[str, Any] | None:
    """One actor's detail, live or ended lately: its last errors with their tracebacks, its
    recent output and its utilisation series. None when this node has no such actor."""
    from lattica._remote import class_path  # (with the supervisor, above)

    a = rt.actors.get(name)
    if a is not None and not a.system:
        out: dict[str, Any] = {
            "name": name,
            "class": class_path(a.cls),
            "state": a.state,
            "calls": a.calls,
            "errors": a.errors,
            "started": a.started_at,
            "failure": list(a.failure) if a.failure else None,
            "recent_errors": list(a.recent_errors or ()),
            "output": a.output.snapshot(MAX_OUTPUT) if a.output is not None else [],
            "dropped": a.output.dropped if a.output is not None else 0,
        }
        from lattica.actors.dashboard.footprint import footprint  # (an open panel asks: never at start)

        out["memory"] = footprint(a.instance) if a.instance is not None else None
        if usage is not None and out["memory"] is not None:
            usage.note_memory(name, float(out["memory"]["bytes"]))
        out["series"] = usage.actor_series(name) if usage is not None else None
        return out
    if a is not None:  # a system actor: its counters only (its output is the node's)
        return {
            "name": name,
            "class": class_path(a.cls),
            "state": a.state,
            "calls": a.calls,
            "errors": a.errors,
            "system": True,
            "recent_errors": list(a.recent_errors or ()),
            "output": [],
            "series": usage.actor_series(name) if usage is not None else None,
        }
    for e in reversed(rt.ended):
        if e.name == name:
            return {
                "name": name,
                "class": class_path(e.cls),
                "state": e.state,
                "reason": e.reason,
                "calls": e.calls,
                "errors": e.error_count,
                "started": e.started_at,
                "ended": e.ended_at,
                "failure": list(e.failure) if e.failure else None,
                "recent_errors": e.errors,
                "output": e.output.snapshot(MAX_OUTPUT) if e.output is not None else [],
                "dropped": e.output.dropped if e.output is not None else 0,
                "series": None,
            }
    return None
