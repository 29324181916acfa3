"""What a member sent the dashboard (its report, its row of the membership view), checked and cut
before anything uses it: a member's data is drawn in a browser, logged in the event log and
printed in a terminal, and must not be able to break, flood or inject into any of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lattica._runtime.local import MAX_ERROR_TEXT, MAX_RECENT_ERRORS
from lattica._runtime.output import MAX_LINE
from lattica.actors.dashboard.report import MAX_ACTORS, MAX_CHILDREN, MAX_ENDED, MAX_OUTPUT, MAX_PEERS
from lattica.actors.dashboard.usage import ACTOR_FIELDS, NODE_FIELDS, SAMPLES

__all__ = ["clean_report", "clean_member", "clean_detail", "clean_series", "text", "number", "MAX_TEXT"]

MAX_TEXT = 300  # characters of any string from a report or a view row
_SUPERVISORS, _TRANSFERS, _TOPICS, _DOCS, _ADDRS, _LABELS = 64, 64, 256, 256, 32, 64
# C0, DEL, C1, and the marks that reorder or break what is drawn after them (bidi overrides and
# isolates, line and paragraph separators): never shown
_CONTROL = dict.fromkeys(
    [
        *range(0x00, 0x20),
        *range(0x7F, 0xA0),
        0x061C,
        0x200E,
        0x200F,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
        0x2028,
        0x2029,
    ],
    " ",
)


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


def _multiline(limit: int) -> Any:
    """A cleaner keeping newlines and tabs (tracebacks, log records with theirs), cut to ``limit``."""

    def clean(v: Any) -> str | None:
        if type(v) is not str:
            return None
        return "\n".join(line.translate(_CONTROL).rstrip() for line in v[:limit].replace("\t", "    ").split("\n"))

    return clean


_LAST_ERROR = {"type": text, "message": text, "method": text, "time": number}


def _last_error(v: Any) -> dict[str, Any] | None:
    return _dict(v, _LAST_ERROR)


_ACTOR = {
    "name": text,
    "class": text,
    "state": text,
    "system": _flag,
    "mailbox": number,
    "running": number,
    "calls": number,
    "errors": number,
    "failure": text,
    "code": text,
    "job": text,
    "last_error": _last_error,
    "output": number,
    "started": number,
}
_ENDED = {
    "name": text,
    "class": text,
    "state": text,
    "reason": text,
    "calls": number,
    "errors": number,
    "last_error": _last_error,
    "output": number,
    "started": number,
    "ended": number,
}
_ERROR = {
    "time": number,
    "method": text,
    "kind": text,
    "type": text,
    "message": _multiline(MAX_ERROR_TEXT),
    "traceback": _multiline(MAX_ERROR_TEXT),
}
_PEER = {
    "peer_id": text,
    "transport": text,
    "direction": text,
    "path": text,
    "remote": text,
    "circle": text,
    "agent": text,
    "rtt_ms": number,
    "bytes_sent": number,
    "bytes_received": number,
}
_CHILD = {
    "id": text,
    "class": text,
    "restart": text,
    "node": text,
    "actor": text,
    "restarts": number,
    "checkpointed": _flag,
}
_TRANSFER = {"cid": text, "bytes": number, "total": number, "peers": number, "kinds": text, "seconds": number}


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
    supervisors = rep.get("supervisors")
    for s in supervisors[:_SUPERVISORS] if type(supervisors) is list else []:
        if type(s) is dict:
            sups.append(
                {
                    "name": text(s.get("name")),
                    "strategy": text(s.get("strategy")),
                    "children": _rows(s.get("children"), MAX_CHILDREN, _CHILD),
                }
            )
    content = _dict(rep.get("content"), {"served_blocks": number, "served_bytes": number})
    if content is not None:
        content["transfers"] = _rows(rep["content"].get("transfers"), _TRANSFERS, _TRANSFER)
    pubsub = _dict(rep.get("pubsub"), {"published": number, "delivered": number, "rejected": number})
    if pubsub is not None:
        pubsub["topics"] = _rows(rep["pubsub"].get("topics"), _TOPICS, {"topic": text, "mesh": number})
    crdt = None
    if type(rep.get("crdt")) is dict:
        crdt = {
            "docs": _rows(
                rep["crdt"].get("docs"),
                _DOCS,
                {"name": text, "id": text, "applied": number, "refused": number, "peers": number, "log_bytes": number},
            )
        }
    nat = _dict(
        rep.get("nat"), {"reachability": text, "mapping": text, "reason": text, "checked_at": number, "loopback": _flag}
    )
    if nat is not None:
        for k in ("observed", "public", "relays"):
            nat[k] = _texts(rep["nat"].get(k), 8)
    labels = rep.get("labels")
    return {
        "peer_id": text(rep.get("peer_id")),
        "agent": text(rep.get("agent")),
        "pid": number(rep.get("pid")),
        "time": number(rep.get("time")),
        "program": text(rep.get("program"), 120),
        "usage": _dict(rep.get("usage"), dict.fromkeys(NODE_FIELDS, number)) or {},
        "ended": _rows(rep.get("ended"), MAX_ENDED, _ENDED),
        "addrs": _texts(rep.get("addrs"), _ADDRS),
        "nat": nat,
        "labels": {
            text(k, 64): text(v, 256) for k, v in list(labels.items())[:_LABELS] if type(k) is str and type(v) is str
        }
        if type(labels) is dict
        else {},
        "peers": _rows(rep.get("peers"), MAX_PEERS, _PEER),
        "actors": _rows(rep.get("actors"), MAX_ACTORS, _ACTOR),
        "actor_count": number(rep.get("actor_count")),
        "supervisors": sups,
        "dht": _dict(rep.get("dht"), {"table": number, "records": number, "rejected": number}),
        "content": content,
        "pubsub": pubsub,
        "crdt": crdt,
        "relay": _dict(
            rep.get("relay"),
            {"reservations": number, "circuits": number, "total_circuits": number, "bytes_relayed": number},
        ),
    }


def clean_member(row: Any) -> dict[str, Any] | None:
    """A membership view row (what each member says about itself) fit to show."""
    if type(row) is not dict or type(row.get("peer_id")) is not str:
        return None
    labels = row.get("labels")
    load = row.get("load")
    out: dict[str, Any] = {
        "peer_id": text(row["peer_id"], 128),
        "state": text(row.get("state"), 16),
        "incarnation": number(row.get("incarnation")),
        "cpu": number(row.get("cpu")),
        "memory": number(row.get("memory")),
        "gpus": number(row.get("gpus")),
        "labels": {
            text(k, 64): text(v, 256) for k, v in list(labels.items())[:_LABELS] if type(k) is str and type(v) is str
        }
        if type(labels) is dict
        else {},
        "addrs": _texts(row.get("addrs"), 8),
    }
    if type(load) is dict:
        reserved = load.get("reserved")
        out["load"] = {
            "actors": number(load.get("actors")),
            **(
                {"reserved": {text(k, 16): number(v) for k, v in list(reserved.items())[:8] if type(k) is str}}
                if type(reserved) is dict
                else {}
            ),
        }
    if row.get("observer") is True:
        out["observer"] = True
    return out


def clean_series(v: Any, fields: tuple[str, ...]) -> dict[str, Any] | None:
    """Utilisation samples from a member: ``time`` and each of ``fields``, lists of numbers of one
    length (at most SAMPLES), else None."""
    if type(v) is not dict or type(v.get("time")) is not list:
        return None
    times = [number(t) for t in v["time"][-SAMPLES:]]
    out: dict[str, Any] = {"every": number(v.get("every")), "time": times}
    for f in fields:
        col = v.get(f)
        if type(col) is not list or len(col) < len(times):
            return None
        out[f] = [number(x) for x in col[-len(times) :]] if times else []
    return out


def clean_detail(v: Any) -> dict[str, Any] | None:
    """One actor's detail from a member (its errors with tracebacks, its output, its series)
    fit to show; None when it is not one."""
    if type(v) is not dict:
        return None
    fields: dict[str, Callable[[Any], Any]] = {
        "name": text,
        "class": text,
        "state": text,
        "reason": text,
        "calls": number,
        "errors": number,
        "started": number,
        "ended": number,
        "dropped": number,
        "system": _flag,
    }
    out = {k: f(v.get(k)) for k, f in fields.items()}
    failure = v.get("failure")
    out["failure"] = [_multiline(MAX_ERROR_TEXT)(x) for x in failure[:3]] if type(failure) is list else None
    out["recent_errors"] = _rows(v.get("recent_errors"), MAX_RECENT_ERRORS, _ERROR)
    lines = v.get("output")
    out["output"] = (
        [
            [number(x[0]), text(x[1], 8), _multiline(MAX_LINE)(x[2])]
            for x in lines[-MAX_OUTPUT:]
            if type(x) in (list, tuple) and len(x) == 3
        ]
        if type(lines) is list
        else []
    )
    out["series"] = clean_series(v.get("series"), ACTOR_FIELDS)
    out["memory"] = _dict(v.get("memory"), {"bytes": number, "objects": number, "complete": _flag})
    return out
