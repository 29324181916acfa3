"""Where to place an actor, from the local membership view (no central scheduler).

``candidates(nodes, need, labels, strategy)`` orders the members that fit: alive, carrying every
requested label, and with enough free ``cpu`` / ``memory`` / ``gpus`` (what a member offers minus
what its spawner has reserved, as gossiped in its ``load``). ``spread`` prefers the least loaded
member (fewest actors, then most free cpu); ``pack`` the fullest one that still fits (best fit).
The view lags a few seconds behind reality, so a caller placing many actors passes ``recent``
(how many it just sent to each member) and the target's spawner has the last word: it refuses a
reservation it cannot hold, and the caller tries the next candidate.

Pure functions over ``lattica.nodes()``-shaped rows; the spawning glue lives elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lattica.errors import PlacementError

__all__ = ["RESOURCES", "candidates", "free", "fits"]

RESOURCES = ("cpu", "memory", "gpus")
STRATEGIES = ("spread", "pack")


def free(node: Mapping[str, Any]) -> dict[str, float]:
    """What ``node`` can still give: offered minus reserved, per resource."""
    reserved = (node.get("load") or {}).get("reserved") or {}
    return {r: float(node.get(r) or 0) - float(reserved.get(r) or 0) for r in RESOURCES}


def fits(node: Mapping[str, Any], need: Mapping[str, float], labels: Mapping[str, str], taken: int = 0) -> bool:
    """Alive, labelled as asked, and with room for ``need`` (after ``taken`` more of it)."""
    if node.get("state") != "alive":
        return False
    have = node.get("labels") or {}
    if any(have.get(k) != v for k, v in labels.items()):
        return False
    room = free(node)
    return all(room.get(r, 0.0) - taken * amount >= amount for r, amount in need.items())


def candidates(
    nodes: list[Mapping[str, Any]],
    need: Mapping[str, float] | None = None,
    labels: Mapping[str, str] | None = None,
    strategy: str = "spread",
    recent: Mapping[str, int] | None = None,
) -> list[str]:
    """Peer ids of the members that fit, best first; PlacementError (saying why) if none does."""
    need = dict(need or {})
    labels = dict(labels or {})
    recent = recent or {}
    unknown = set(need) - set(RESOURCES)
    if unknown:
        raise PlacementError(f"unknown resources {sorted(unknown)}: placement knows {list(RESOURCES)}")
    if any(v < 0 for v in need.values()):
        raise PlacementError("resource amounts must not be negative")
    if strategy not in STRATEGIES:
        raise PlacementError(f"placement must be one of {STRATEGIES}, not {strategy!r}")
    ok = [n for n in nodes if fits(n, need, labels, recent.get(n["peer_id"], 0))]
    if not ok:
        alive = [n for n in nodes if n.get("state") == "alive"]
        raise PlacementError(
            f"no node fits resources={need} labels={labels}: {len(alive)} alive node(s)"
            + (f", offering at most {_best_offer(alive)}" if alive else "")
        )

    def actors(n: Mapping[str, Any]) -> int:
        return int((n.get("load") or {}).get("actors") or 0) + recent.get(n["peer_id"], 0)

    if strategy == "spread":
        ok.sort(key=lambda n: (actors(n), -free(n)["cpu"], n["peer_id"]))
    else:
        ok.sort(key=lambda n: (free(n)["cpu"] - recent.get(n["peer_id"], 0) * need.get("cpu", 0), -actors(n), n["peer_id"]))
    return [n["peer_id"] for n in ok]


def _best_offer(nodes: list[Mapping[str, Any]]) -> dict[str, float]:
    return {r: max(free(n)[r] for n in nodes) for r in RESOURCES}
