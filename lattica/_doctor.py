"""``lattica doctor``: where this machine stands on the mesh, and why, in plain words.

Starts a short-lived node, joins through the given bootstrap peers, waits (bounded) for AutoNAT's
verdict and relay reservations, optionally reaches one peer by PeerId, and reports reachability,
NAT mapping type, observed addresses, reservations, direct vs relayed peers and hole-punch
outcomes. Every failure is reported once with its reason; nothing retries without end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lattica import dht
from lattica._identity import PeerId
from lattica._node import Node
from lattica._runtime import spawner_ref
from lattica.errors import LatticaError, PermissionDenied

__all__ = ["diagnose", "render"]

_MAPPING_WORDS = {
    "endpoint-independent": "endpoint-independent (cone): hole punching works with most peers",
    "endpoint-dependent": "endpoint-dependent (symmetric): direct paths need many-port probing; "
    "with another symmetric NAT traffic stays relayed (it still works)",
    "unknown": "unknown (it takes two peers at different IPs to tell)",
}


def _why(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    low = text.lower()
    if "refused" in low:
        return f"nothing listens there or a firewall rejects it ({text})"
    if "timed out" in low or "timeout" in low:
        return f"no answer: the address is unreachable from here or packets are dropped ({text})"
    if "mismatch" in low:
        return f"a different node answers at that address ({text})"
    return text


def diagnose(
    listen: list[str],
    bootstrap: list[str],
    peer: str | None = None,
    wait: float = 20.0,
    mesh: Any = None,
    progress: Callable[[float, float, str], None] | None = None,
    stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the checks and return the report (a JSON-able dict); ``progress(waited, wait,
    reachability)`` while it waits for the AutoNAT verdict; ``stage(text)`` as each check starts."""
    say = stage or (lambda _text: None)
    report: dict[str, Any] = {"bootstrap": [], "problems": []}
    say("starting a node")
    with Node(listen, mesh=mesh) as node:
        report["peer_id"] = str(node.peer_id)
        report["mesh"] = node.trust.describe()
        report["listening"] = [str(a) for a in node.addrs]
        for addr in bootstrap:
            say(f"connecting to {addr}")
            t0 = time.perf_counter()
            try:
                info = node.connect(addr, timeout=10)
                report["bootstrap"].append(
                    {
                        "addr": addr,
                        "ok": True,
                        "transport": info.transport,
                        "ms": round((time.perf_counter() - t0) * 1e3, 1),
                    }
                )
            except (LatticaError, ValueError) as e:
                report["bootstrap"].append({"addr": addr, "ok": False, "why": _why(e)})
                report["problems"].append(f"cannot reach bootstrap peer {addr}: {_why(e)}")
        joined = any(b["ok"] for b in report["bootstrap"])
        if not bootstrap:
            report["problems"].append("no bootstrap peer given: nobody can tell us how we look from outside")
        elif not joined:
            report["problems"].append(
                "no bootstrap peer answered: check the addresses, this machine's outbound connectivity, and that they run"
            )
        joining = dht.bootstrap(node=node) if joined else None  # meanwhile AutoNAT runs
        status = node.nat_status()
        deadline = time.monotonic() + (wait if joined else 0)
        started = time.monotonic()
        if joined:
            say(f"waiting up to {wait:g} s for the AutoNAT verdict and the DHT ({status.reachability} so far)")
        while time.monotonic() < deadline:
            status = node.nat_status()
            if status.reachability == "public" or (status.reachability == "private" and status.relays):
                break
            if progress is not None:
                progress(time.monotonic() - started, wait, status.reachability)
            time.sleep(0.1)
        if joining is not None:
            try:
                joining.result(max(deadline - time.monotonic(), 1.0))
            except Exception as e:  # noqa: BLE001 -- reported, not fatal
                report["problems"].append(f"joining the DHT failed: {_why(e)}")
        report["nat"] = {
            "reachability": status.reachability,
            "reason": status.reason,
            "mapping": status.mapping,
            "observed": status.observed,
            "public": status.public,
            "relays": status.relays,
        }
        if status.reachability == "private" and not status.relays:
            report["problems"].append(
                "private and holding no relay reservation: peers cannot reach this node (start a relay with `lattica relay` on a public host, or pass one)"
            )
        if status.reachability == "unknown" and joined:
            report["problems"].append(f"reachability still unknown after {wait:g} s: {status.reason}")
        if peer is not None:
            say(f"reaching {peer}")
            report["peer"] = _reach(node, peer)
            if not report["peer"]["ok"]:
                report["problems"].append(f"cannot reach {peer}: {report['peer']['why']}")
            elif report["peer"].get("refused"):
                report["problems"].append(
                    f"{peer} does not take this node as a member of its mesh, so it refuses our calls: {report['peer']['refused']}"
                )
        peers = node.peers()
        report["strangers"] = [
            {"peer": str(p.peer_id), "why": p.circle_reason} for p in peers if p.circle == "stranger"
        ]
        report["peers"] = {
            "direct": sum(p.transport != "relay" for p in peers),
            "relayed": sum(p.transport == "relay" for p in peers),
        }
        report["holepunch"] = node.run(_punches(node), timeout=5)
    return report


async def _names(node: Node, peer: PeerId) -> Any:
    return await node.host.runtime.call(spawner_ref(peer), "names", (), {}, timeout=5)  # type: ignore[union-attr]


async def _punches(node: Node) -> dict:
    hp = node.host.services.holepunch if node.host is not None else None
    return hp.status() if hp is not None else {}


def _reach(node: Node, target: str) -> dict[str, Any]:
    try:
        pid = PeerId.from_string(target)
    except (LatticaError, ValueError) as e:
        return {"ok": False, "why": f"not a PeerId: {e}"}
    t0 = time.perf_counter()

    async def dial() -> str:
        return (await node.host.get_connection(pid)).transport  # type: ignore[union-attr]

    try:
        first = node.run(dial(), timeout=20)
    except (LatticaError, TimeoutError) as e:
        return {"ok": False, "why": _why(e)}
    out: dict[str, Any] = {"ok": True, "first": first, "ms": round((time.perf_counter() - t0) * 1e3, 1)}
    end = time.monotonic() + (10 if first == "relay" else 0)
    while time.monotonic() < end:  # a relayed connection: give hole punching its three attempts
        path = next((p.transport for p in node.peers() if p.peer_id == pid), None)
        if path not in (None, "relay"):
            out["direct_after_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
            break
        time.sleep(0.05)
    out["path"] = next((p.transport for p in node.peers() if p.peer_id == pid), None)
    try:  # a members-only call tells whether it admits us (the refusal says why not)
        node.run(_names(node, pid), timeout=10)
    except PermissionDenied as e:
        out["refused"] = str(e)
    except (LatticaError, TimeoutError):
        pass
    if out["path"] == "relay":
        out["why_relayed"] = (
            "hole punching did not get through (both NATs symmetric, or a firewall drops the probes); calls work over the relay"
        )
    return out


def render(r: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    lines = [f"peer id       {r['peer_id']}", f"mesh          {r['mesh']}"]
    lines += [f"listening     {a}" for a in r["listening"]]
    for b in r["bootstrap"]:
        lines.append(
            f"bootstrap     {b['addr']}: "
            + (f"connected over {b['transport']} in {b['ms']} ms" if b["ok"] else f"FAILED: {b['why']}")
        )
    nat = r.get("nat", {})
    if nat:
        lines.append(f"reachability  {nat['reachability']}: {nat['reason']}")
        lines.append(f"NAT mapping   {_MAPPING_WORDS.get(nat['mapping'], nat['mapping'])}")
        lines += [f"observed      {a}" for a in nat["observed"]] or ["observed      (no peer has told us yet)"]
        lines += [f"public        {a}" for a in nat["public"]]
        lines += [f"relay         {a}" for a in nat["relays"]] or ["relay         (no reservation)"]
    if "peer" in r:
        p = r["peer"]
        if p["ok"]:
            text = f"reached over {p['first']} in {p['ms']} ms"
            if "direct_after_ms" in p:
                text += f", direct over {p['path']} after {p['direct_after_ms']} ms (hole punch)"
            elif p["path"] == "relay":
                text += f"; stays relayed: {p['why_relayed']}"
            lines.append(f"target peer   {text}")
            lines.append(
                f"membership    {'REFUSED: ' + p['refused'] if p.get('refused') else 'it takes us as a member'}"
            )
        else:
            lines.append(f"target peer   FAILED: {p['why']}")
    lines.append(f"peers         {r['peers']['direct']} direct, {r['peers']['relayed']} relayed")
    lines += [f"not in mesh   {s['peer']}: {s['why']}" for s in r.get("strangers", [])]
    hp = r.get("holepunch") or {}
    if hp:
        lines.append(
            f"hole punches  {hp['attempts']} attempts, {hp['direct']} direct, {hp['failed']} failed, {hp['refused']} refused"
        )
    lines.append("")
    lines += [f"problem: {p}" for p in r["problems"]] or ["no problems found"]
    return "\n".join(lines)
