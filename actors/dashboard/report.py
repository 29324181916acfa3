"""One node's report for the dashboard: who it is, how it is reached, its peers and paths, its
actors (with supervision trees), its DHT, content transfers, topics and documents. Plain data
(str, int, float, bool, lists, dicts), bounded in size: it travels as a call's answer."""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

from lattica.supervisor import Supervisor

if TYPE_CHECKING:
    from lattica.runtime import Runtime

__all__ = ["node_report", "clean_report", "clean_member", "text", "number", "MAX_ACTORS", "MAX_PEERS", "MAX_TEXT"]

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


def _peers(host: Any) -> list[dict[str, Any]]:
    rows = []
    for peer, conn in list(host.conns.items())[:MAX_PEERS]:
        info = host.info.get(conn)
        remote = str(conn.remote_addr)
        row = {"peer_id": str(peer), "transport": conn.transport, "direction": conn.direction,
               "path": "relayed" if "/p2p-circuit" in remote else "direct", "remote": remote,
               "circle": info.circle if info is not None else "unidentified", "agent": info.agent_version if info is not None else ""}
        if row["path"] == "direct":  # (a circuit's socket goes to the relay: its figures are not the peer's)
            stats = conn.path_stats()
            if stats:
                row.update({k: round(v, 3) if k == "rtt_ms" else int(v) for k, v in stats.items()})
        rows.append(row)
    return rows


async def _actors(rt: Runtime) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, trees = [], []
    for name, a in list(rt.actors.items())[:MAX_ACTORS]:
        cls = a.cls
        rows.append({"name": name, "class": f"{cls.__module__}.{cls.__qualname__}", "state": a.state, "system": a.system,
                     "mailbox": len(a.waiting), "running": len(a.live), "calls": a.calls, "errors": a.errors,
                     "failure": a.failure[2][:200] if a.failure else None})
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


# -- what a member sent: checked and cut before anything uses it --------------------------------

MAX_TEXT = 300  # characters of any string from a report or a view row
_SUPERVISORS, _TRANSFERS, _TOPICS, _DOCS, _ADDRS, _LABELS = 64, 64, 256, 256, 32, 64
_CONTROL = dict.fromkeys([*range(0x00, 0x20), *range(0x7F, 0xA0)], " ")  # C0, DEL, C1: never shown


def text(v: Any, limit: int = MAX_TEXT) -> str | None:
    """A string fit to show (control characters blanked, cut to ``limit``), or None."""
    if type(v) is not str:
        return None
    return v[:limit].translate(_CONTROL)


def number(v: Any) -> float | int | None:
    """A finite number (bools are not numbers here), or None."""
    if type(v) is int:
        return v if -(1 << 62) < v < 1 << 62 else None
    if type(v) is float and v == v and v not in (float("inf"), float("-inf")):
        return v
    return None


def _texts(v: Any, n: int) -> list[str]:
    return [t for t in (text(x) for x in v[:n]) if t is not None] if type(v) is list else []


def _rows(v: Any, n: int, fields: dict[str, Any]) -> list[dict[str, Any]]:
    """Up to ``n`` dicts of ``v``, each keeping only ``fields`` (name -> cleaner)."""
    if type(v) is not list:
        return []
    return [{k: f(row.get(k)) for k, f in fields.items()} for row in v[:n] if type(row) is dict]


def _flag(v: Any) -> bool:
    return v is True


_ACTOR = {"name": text, "class": text, "state": text, "system": _flag, "mailbox": number, "running": number, "calls": number,
          "errors": number, "failure": text}
_PEER = {"peer_id": text, "transport": text, "direction": text, "path": text, "remote": text, "circle": text, "agent": text,
         "rtt_ms": number, "bytes_sent": number, "bytes_received": number}
_CHILD = {"id": text, "class": text, "restart": text, "node": text, "actor": text, "restarts": number, "checkpointed": _flag}
_TRANSFER = {"cid": text, "bytes": number, "total": number, "peers": number, "seconds": number}


def _dict(v: Any, fields: dict[str, Any]) -> dict[str, Any] | None:
    return {k: f(v.get(k)) for k, f in fields.items()} if type(v) is dict else None


def clean_report(rep: Any) -> dict[str, Any] | None:
    """A member's report as the dashboard uses it: only the known fields, each of its type
    (else None), strings cut and without control characters, lists bounded. None when it is
    not a report at all. A member's data is drawn, logged and printed: it must not be able to
    break, flood or inject into any of that."""
    if type(rep) is not dict:
        return None
    sups = []
    for s in rep.get("supervisors")[:_SUPERVISORS] if type(rep.get("supervisors")) is list else []:
        if type(s) is dict:
            sups.append({"name": text(s.get("name")), "strategy": text(s.get("strategy")), "children": _rows(s.get("children"), MAX_CHILDREN, _CHILD)})
    content = _dict(rep.get("content"), {"served_blocks": number, "served_bytes": number})
    if content is not None:
        content["transfers"] = _rows(rep["content"].get("transfers"), _TRANSFERS, _TRANSFER)
    pubsub = _dict(rep.get("pubsub"), {"published": number, "delivered": number, "rejected": number})
    if pubsub is not None:
        pubsub["topics"] = _rows(rep["pubsub"].get("topics"), _TOPICS, {"topic": text, "mesh": number})
    crdt = None
    if type(rep.get("crdt")) is dict:
        crdt = {"docs": _rows(rep["crdt"].get("docs"), _DOCS, {"name": text, "id": text, "applied": number, "refused": number, "peers": number, "log_bytes": number})}
    nat = _dict(rep.get("nat"), {"reachability": text, "mapping": text, "reason": text, "checked_at": number})
    if nat is not None:
        for k in ("observed", "public", "relays"):
            nat[k] = _texts(rep["nat"].get(k), 8)
    labels = rep.get("labels")
    return {
        "peer_id": text(rep.get("peer_id")), "agent": text(rep.get("agent")), "pid": number(rep.get("pid")), "time": number(rep.get("time")),
        "addrs": _texts(rep.get("addrs"), _ADDRS), "nat": nat,
        "labels": {text(k, 64): text(v, 256) for k, v in list(labels.items())[:_LABELS] if type(k) is str and type(v) is str} if type(labels) is dict else {},
        "peers": _rows(rep.get("peers"), MAX_PEERS, _PEER), "actors": _rows(rep.get("actors"), MAX_ACTORS, _ACTOR),
        "actor_count": number(rep.get("actor_count")), "supervisors": sups,
        "dht": _dict(rep.get("dht"), {"table": number, "records": number, "rejected": number}), "content": content, "pubsub": pubsub, "crdt": crdt,
        "relay": _dict(rep.get("relay"), {"reservations": number, "circuits": number, "total_circuits": number, "bytes_relayed": number}),
    }


def clean_member(row: Any) -> dict[str, Any] | None:
    """A membership view row (what each member says about itself) fit to show."""
    if type(row) is not dict or type(row.get("peer_id")) is not str:
        return None
    labels = row.get("labels")
    load = row.get("load")
    out: dict[str, Any] = {"peer_id": text(row["peer_id"], 128), "state": text(row.get("state"), 16), "incarnation": number(row.get("incarnation")),
                           "cpu": number(row.get("cpu")), "memory": number(row.get("memory")), "gpus": number(row.get("gpus")),
                           "labels": {text(k, 64): text(v, 256) for k, v in list(labels.items())[:_LABELS] if type(k) is str and type(v) is str} if type(labels) is dict else {},
                           "addrs": _texts(row.get("addrs"), 8)}
    if type(load) is dict:
        reserved = load.get("reserved")
        out["load"] = {"actors": number(load.get("actors")),
                       **({"reserved": {text(k, 16): number(v) for k, v in list(reserved.items())[:8] if type(k) is str}} if type(reserved) is dict else {})}
    if row.get("observer") is True:
        out["observer"] = True
    return out
