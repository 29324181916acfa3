"""Where to place an actor, from the local membership view (no central scheduler).

``candidates(nodes, need, labels, strategy)`` orders the members that fit: alive, carrying every
requested label, with enough free ``cpu`` / ``memory`` / ``gpus`` (what a member offers minus
what its spawner has reserved, as gossiped in its ``load``), and able to run the class (``runs``:
its allow-list names it, or its ``accept_code`` setting takes the code that travels with it).
``spread`` prefers the least loaded member (fewest actors, then most free cpu); ``pack`` the
fullest one that still fits (best fit). An administrator's placement (``admins_first``) ranks
administrators' nodes first: what a plain member's row claims decides only placements that no
administrator's node fits. The view lags a few seconds behind reality, so a caller placing many
actors passes ``recent`` (how many it just sent to each member) and the target's spawner has the
last word: it refuses a reservation it cannot hold, and the caller tries the next candidate.

Pure functions over ``lattica.nodes()``-shaped rows; the spawning glue lives elsewhere.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from lattica._runtime.limits import BUILTIN_ACTORS
from lattica.errors import PlacementError

__all__ = ["RESOURCES", "Spawnable", "candidates", "free", "fits", "runs"]

RESOURCES = ("cpu", "memory", "gpus")
MAX_LISTED = 16  # nodes a PlacementError names with the reason each was skipped
STRATEGIES = ("spread", "pack")


def free(node: Mapping[str, Any]) -> dict[str, float]:
    """What ``node`` can still give: offered minus reserved, per resource."""
    reserved = (node.get("load") or {}).get("reserved") or {}
    return {r: float(node.get(r) or 0) - float(reserved.get(r) or 0) for r in RESOURCES}


class Spawnable:
    """What is placed, as far as a node's willingness to run it goes: the class's path, whether
    its code travels with it (``code_admin``: None if it does not, else whether its sender
    administers the mesh), and the placing node (``home``: it runs its own classes)."""

    __slots__ = ("path", "code_admin", "home")

    def __init__(self, path: str, code_admin: bool | None = None, home: str | None = None) -> None:
        self.path = path
        self.code_admin = code_admin
        self.home = home


def runs(node: Mapping[str, Any], what: Spawnable) -> str | None:
    """Why ``node`` would refuse to run ``what`` (None: it would, as far as its gossip says)."""
    code = node.get("code")
    if not isinstance(code, Mapping) or node.get("peer_id") == what.home:
        return None  # (a node that does not say: its spawner has the last word)
    allow = code.get("allow") or []
    if what.path in BUILTIN_ACTORS or any(fnmatch.fnmatchcase(what.path, p) for p in allow):
        return None
    accept = code.get("accept", "admins")
    if what.code_admin is None:
        return f"its allow-list {list(allow) or '(empty)'} does not name {what.path} and its code does not travel"
    if accept == "nobody":
        return "it runs no code that travels (accept_code='nobody')"
    if accept == "admins" and not what.code_admin:
        return "it runs code only from administrators of its mesh (accept_code='admins')"
    return None


def fits(
    node: Mapping[str, Any],
    need: Mapping[str, float],
    labels: Mapping[str, str],
    taken: int = 0,
    what: Spawnable | None = None,
) -> bool:
    """Alive, labelled as asked, with room for ``need`` (after ``taken`` more of it), and willing
    to run ``what``."""
    return _misfit(node, need, labels, taken, what) is None


def _misfit(
    node: Mapping[str, Any], need: Mapping[str, float], labels: Mapping[str, str], taken: int, what: Spawnable | None
) -> str | None:
    """Why ``node`` does not fit (None: it does)."""
    if node.get("state") != "alive":
        return f"it is {node.get('state')}"
    have = node.get("labels") or {}
    wrong = {k: v for k, v in labels.items() if have.get(k) != v}
    if wrong:
        return f"it lacks the labels {wrong}"
    room = free(node)
    short = {r: amount for r, amount in need.items() if room.get(r, 0.0) - taken * amount < amount}
    if short:
        return f"it has { ({r: round(room.get(r, 0.0), 3) for r in short}) } free of {short}"
    return runs(node, what) if what is not None else None


def candidates(
    nodes: Sequence[Mapping[str, Any]],
    need: Mapping[str, float] | None = None,
    labels: Mapping[str, str] | None = None,
    strategy: str = "spread",
    recent: Mapping[str, int] | None = None,
    what: Spawnable | None = None,
    admins_first: bool = False,
) -> list[str]:
    """Peer ids of the members that fit, best first; PlacementError (saying why each node was
    skipped) if none does. ``admins_first`` (an administrator places): administrators' nodes
    that fit come before plain members', whatever resources those claim."""
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
    misfits = {n["peer_id"]: _misfit(n, need, labels, recent.get(n["peer_id"], 0), what) for n in nodes}
    ok = [n for n in nodes if misfits[n["peer_id"]] is None]
    if not ok:
        skipped = [f"{p[-8:]}: {why}" for p, why in misfits.items()]
        shown = "; ".join(skipped[:MAX_LISTED]) + (
            f"; and {len(skipped) - MAX_LISTED} more" if len(skipped) > MAX_LISTED else ""
        )
        for_what = f"{what.path} with " if what is not None else ""
        raise PlacementError(
            f"no node fits {for_what}resources={need} labels={labels}: " + (shown or "the membership view is empty")
        )

    def actors(n: Mapping[str, Any]) -> int:
        return int((n.get("load") or {}).get("actors") or 0) + recent.get(n["peer_id"], 0)

    def tier(n: Mapping[str, Any]) -> int:
        return 0 if not admins_first or n.get("admin") is True else 1

    if strategy == "spread":
        ok.sort(key=lambda n: (tier(n), actors(n), -free(n)["cpu"], n["peer_id"]))
    else:
        ok.sort(
            key=lambda n: (
                tier(n),
                free(n)["cpu"] - recent.get(n["peer_id"], 0) * need.get("cpu", 0),
                -actors(n),
                n["peer_id"],
            )
        )
    return [n["peer_id"] for n in ok]
