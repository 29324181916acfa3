"""A supervised local mesh: node processes running stateful children under a supervisor here,
and the loss of one of them (SIGKILL or SIGSTOP) measured from the signal to every child
answering again with its state (used by the demo and ``lattica bench supervise``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any, cast

from lattica._node import Node
from lattica._remote import ActorClass, actor
from lattica._runtime import current_actor
from lattica.mesh.process import ServerProcess
from lattica.supervisor import Supervisor

__all__ = ["Keeper", "supervised_mesh", "statuses", "lose"]

TCP = "/ip4/127.0.0.1/tcp/0"


@actor
class Keeper:
    """A child with state worth keeping: checkpointed by its supervisor, restored elsewhere."""

    def __init__(self) -> None:
        self.total = 0
        self.restored = False

    async def add(self, n: int) -> int:
        self.total += n
        return self.total

    async def status(self) -> dict:
        me = current_actor()
        assert me is not None  # (in an actor method)
        return {"total": self.total, "node": str(me.peer_id), "restored": self.restored}

    async def checkpoint(self) -> int:
        return self.total

    def restore(self, state: int) -> None:
        self.total, self.restored = state, True


@contextlib.contextmanager
def supervised_mesh(
    children: int = 6, processes: int = 3, cpus: int = 6, dashboard: Any = None
) -> Iterator[tuple[Node, list[ServerProcess], Any, list]]:
    """``processes`` node processes, a node here (offering no cpu) running a Supervisor with
    ``children`` Keepers spread over them, each given state (100, 200, ...) and checkpointed;
    ``dashboard``: the node here serves one (``Node(dashboard=...)``)."""
    opts = ("--resources", json.dumps({"cpu": cpus}))
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(ServerProcess([TCP], *opts)) for _ in range(processes)]
        here = stack.enter_context(Node([TCP], resources={"cpu": 0}, dashboard=dashboard))
        for p in procs:
            here.connect(p.addr("tcp"))
        deadline = time.monotonic() + 15
        while len(here.nodes()) < processes + 1 or not all("cpu" in m for m in here.nodes()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the mesh did not form: {here.nodes()}")
            time.sleep(0.05)

        async def start() -> tuple:
            # (``@actor`` made it an ActorClass; mypy keeps a decorated class's own type)
            sup = cast(ActorClass, Supervisor).remote(strategy="one_for_one", max_restarts=100, within=60)
            refs = [
                await sup.start_child.remote(Keeper, id=f"keeper-{i}", resources={"cpu": 1}, checkpoint_every=0.1)
                for i in range(children)
            ]
            for i, r in enumerate(refs):
                await r.add.remote(100 * (i + 1))
            while not all(k["checkpointed"] for k in await sup.which_children.remote()):
                await asyncio.sleep(0.05)
            return sup, refs

        sup, refs = here.run(start(), timeout=60)
        yield here, procs, sup, refs


def statuses(node: Node, refs: list) -> list[dict]:
    """Every child's status, asked through its stable ref (idempotent: re-sent if in flight when
    its node went away)."""

    async def ask() -> list:
        return [await r.status.options(idempotent=True).remote() for r in refs]

    return node.run(ask(), timeout=60)


def lose(node: Node, proc: ServerProcess, sig: int, sup: Any, refs: list) -> dict:
    """Send ``sig`` to ``proc``; time the verdict, the restarts and every child answering again."""
    before = statuses(node, refs)
    there = [i for i, s in enumerate(before) if s["node"] == proc.peer_id]
    down: list[float] = []
    node.run(_watch_member(node, proc.peer_id, down), timeout=10)
    t0 = time.time()
    os.kill(proc.pid, sig)
    after = statuses(node, refs)
    answered = time.time() - t0

    async def history() -> list:
        return await sup.history.remote()

    restarts = [h for h in node.run(history(), timeout=10) if h["event"] == "restarted" and h["t"] >= t0]
    return {
        "hosted": len(there),
        "verdict_s": (down[0] - t0) if down else None,
        "restarted_s": (max(h["t"] for h in restarts) - t0) if restarts else None,
        "answering_s": answered,
        "moved": sum(after[i]["node"] != proc.peer_id and after[i]["restored"] for i in there),
        "state_kept": [s["total"] for s in after] == [s["total"] for s in before],
        "statuses": after,
    }


async def _watch_member(node: Node, peer_id: str, out: list) -> None:
    host = node.host
    membership = host.services.membership if host is not None else None
    assert membership is not None  # (a started node runs membership unless told not to)

    def on_down(member: Any, reason: str) -> None:
        if member.id == peer_id and not out:
            out.append(time.time())

    membership.on_down.append(on_down)
