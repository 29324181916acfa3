"""One node's report for the dashboard: who it is, how it is reached, its peers and paths, its
actors (with supervision trees), its DHT, content transfers, topics and documents. Plain data
(str, int, float, bool, lists, dicts), bounded in size: it travels as a call's answer."""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from lattica.runtime import Runtime

__all__ = ["node_report", "NAME", "MAX_ACTORS", "MAX_PEERS", "MAX_CHILDREN"]

NAME = "dashboard"  # the system actor every node runs

MAX_ACTORS = 5000  # actors listed per node (the rest counted)
MAX_PEERS = 1000  # connections listed per node
MAX_CHILDREN = 500  # children listed per supervisor
_TREE_WAIT = 0.5  # seconds a supervisor that is still starting gets to list its children


async def node_report(rt: Runtime) -> dict[str, Any]:
    """This node, as its dashboard and every other node's dashboard show it."""
    host = rt.host
    services = rt.services
    actors, supervisors = await _actors(rt)
    out: dict[str, Any] = {
        "peer_id": str(rt.peer_id),
        "agent": host.node.agent_version,
        "pid": os.getpid(),
        "time": time.time(),
        "addrs": [str(a) for a in host.advertised_addrs()][:32],
        "nat": _nat(host),
        "labels": dict(host.node.labels),
        "peers": _peers(host),
        "actors": actors,
        "actor_count": len(rt.actors),
        "supervisors": supervisors,
        "dht": _dht(services.get("dht")),
        "content": _content(services.get("content")),
        "pubsub": _pubsub(services.get("pubsub")),
        "crdt": _crdt(services.get("crdt")),
    }
    relay = services.get("relay")
    if relay is not None:
        out["relay"] = _relay(relay)
    return out


def _nat(host: Any) -> dict[str, Any]:
    nat = getattr(host, "nat", None)
    if nat is None:
        return {"reachability": "unknown", "reason": "no AutoNAT on this node"}
    s = nat.snapshot()
    return {"reachability": s.reachability, "mapping": s.mapping, "reason": s.reason, "observed": s.observed[:8],
            "public": s.public[:8], "relays": s.relays[:8], "checked_at": s.checked_at}


_PATH_FIGURES = ("rtt_ms", "bytes_sent", "bytes_received")


def _peers(host: Any) -> list[dict[str, Any]]:
    rows = []
    for peer, conn in list(host.conns.items())[:MAX_PEERS]:
        info = host.info.get(conn)
        remote = str(conn.remote_addr)
        row = {"peer_id": str(peer), "transport": conn.transport, "direction": conn.direction,
               "path": "relayed" if "/p2p-circuit" in remote else "direct", "remote": remote,
               "circle": info.circle if info is not None else "unidentified", "agent": info.agent_version if info is not None else ""}
        stats = conn.path_stats()  # (a relayed path's are end to end: timed by the mux, counted on the circuit)
        if stats:
            row.update({k: round(v, 3) if k == "rtt_ms" else int(v) for k, v in stats.items() if k in _PATH_FIGURES})
        rows.append(row)
    return rows


async def _actors(rt: Runtime) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from lattica.supervisor import Supervisor  # (not at start: a node that runs no supervisor never loads it)

    from lattica.remote import class_path  # (with the supervisor, above)

    spawner = rt.services.get("spawner")
    library = spawner.code if spawner is not None else None
    rows, trees = [], []
    for name, a in list(rt.actors.items())[:MAX_ACTORS]:
        sender = library.sender_of(name) if library is not None else None
        job = spawner.jobs.of(name) if spawner is not None else None
        rows.append({"name": name, "class": class_path(a.cls), "state": a.state, "system": a.system,
                     "mailbox": len(a.waiting), "running": len(a.live), "calls": a.calls, "errors": a.errors,
                     "failure": a.failure[2][:200] if a.failure else None,
                     "code": str(sender) if sender is not None else None, "job": str(job) if job is not None else None})
        if isinstance(a.instance, Supervisor.cls) and a.state == "running":
            trees.append(await _tree(name, a.instance))
    return rows, trees


async def _tree(name: str, sup: Any) -> dict[str, Any]:
    try:
        children = await asyncio.wait_for(sup.which_children(), _TREE_WAIT)
    except (asyncio.TimeoutError, Exception):  # (still starting, or it failed: shown without children)
        children = []
    return {"name": name, "strategy": sup.strategy, "children": children[:MAX_CHILDREN]}


def _dht(dht: Any) -> dict[str, Any] | None:
    if dht is None:
        return None
    return {"table": len(dht.table), "records": dht.store.record_count, "rejected": dht.rejected}


def _content(content: Any) -> dict[str, Any] | None:
    if content is None:
        return None
    return {"transfers": content.transfers()[:64], "served_blocks": content.served_blocks, "served_bytes": content.served_bytes}


def _pubsub(pubsub: Any) -> dict[str, Any] | None:
    if pubsub is None:
        return None
    topics = pubsub.topics()
    return {"topics": [{"topic": t, "mesh": len(pubsub.peers(t))} for t in topics[:256]], "published": pubsub.published,
            "delivered": pubsub.delivered, "rejected": pubsub.rejected}


def _crdt(crdt: Any) -> dict[str, Any] | None:
    if crdt is None:
        return None
    docs = []
    for replica in list(crdt.docs.values())[:256]:
        st = replica.stats()
        docs.append({k: st[k] for k in ("name", "id", "applied", "refused", "peers", "log_bytes") if k in st})
    return {"docs": docs}


def _relay(relay: Any) -> dict[str, Any]:
    return {"reservations": len(relay.reservations), "circuits": sum(relay.circuits.values()), "total_circuits": relay.total_circuits,
            "bytes_relayed": relay.bytes_relayed}
