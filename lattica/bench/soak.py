"""A soak of the failure detector with real processes under load (``lattica bench soak``).

``processes`` node processes, each connected to the ones started before it, and a node here
connected to all. Here, a steady stream of calls (``rate`` per second, 4 KiB each) goes to echo
actors on every process, and each process also runs numpy work on an actor thread. Once a second
every node's membership view is read; any member held suspect or dead while every process is
alive is a false verdict. Nothing is killed: the figure that matters is zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, cast

import numpy as np

from lattica._identity import PeerId
from lattica._node import Node
from lattica._remote import ActorClass, actor
from lattica.actors.membership import membership_ref
from lattica.bench import host_of, runtime_of
from lattica.bench.rpc import AsyncEcho
from lattica.mesh.process import ServerProcess

TCP = "/ip4/127.0.0.1/tcp/0"


@actor
class Cruncher:
    """CPU work on the actor's own thread (a sync method): matrix products for ``ms`` ms."""

    def crunch(self, ms: float) -> float:
        a = np.random.default_rng(0).standard_normal((128, 128))
        end = time.perf_counter() + ms / 1000
        n = 0
        while time.perf_counter() < end:
            a = np.tanh(a @ a.T / 128)
            n += 1
        return float(n)


def soak(seconds: float = 300.0, processes: int = 4, rate: float = 400.0, crunch_ms: float = 20.0) -> dict[str, Any]:
    """Run the soak; returns calls made, call errors, and suspect/dead observations (all should
    be 0 but the calls)."""
    with contextlib.ExitStack() as stack:
        procs: list[ServerProcess] = []
        for _ in range(processes):
            connect = [a for p in procs for a in ("--connect", p.addr("tcp"))]
            procs.append(stack.enter_context(ServerProcess([TCP], *connect)))
        here = stack.enter_context(Node([TCP]))
        for p in procs:
            here.connect(p.addr("tcp"))
        deadline = time.monotonic() + 15
        while len(here.nodes()) < processes + 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the mesh did not form: {here.nodes()}")
            time.sleep(0.05)
        peers = [PeerId.from_string(p.peer_id) for p in procs]
        return here.run(_load(here, peers, seconds, rate, crunch_ms), timeout=seconds + 120)


async def _load(here: Node, peers: list[PeerId], seconds: float, rate: float, crunch_ms: float) -> dict[str, Any]:
    # (``@actor`` made the classes ActorClasses; mypy keeps a decorated class's own type)
    echo_cls, cruncher_cls = cast(ActorClass, AsyncEcho), cast(ActorClass, Cruncher)
    echoes = [echo_cls.options(node=p).remote() for p in peers]
    crunchers = [cruncher_cls.options(node=p).remote() for p in peers]
    payload = bytes(4096)
    stats = {"calls": 0, "errors": 0, "suspect": 0, "dead": 0, "views": 0, "crunch": 0}
    verdicts: list[str] = []
    end = time.monotonic() + seconds
    host = host_of(here)
    rt = runtime_of(here)

    async def calls() -> None:
        i = 0
        pending: set[asyncio.Future] = set()
        t = time.monotonic()
        while time.monotonic() < end:
            ref = echoes[i % len(echoes)]
            i += 1
            fut = asyncio.ensure_future(_one(ref.echo.remote(payload)))
            pending.add(fut)
            fut.add_done_callback(pending.discard)
            t += 1 / rate
            await asyncio.sleep(max(0.0, t - time.monotonic()))
        await asyncio.gather(*pending)
        stats["calls"] = i

    async def _one(f: Any) -> None:
        try:
            await f
        except Exception:  # noqa: BLE001 -- counted: any failed call is a finding
            stats["errors"] += 1

    async def crunch(ref: Any) -> None:
        while time.monotonic() < end:
            try:
                await ref.crunch.remote(crunch_ms)
                stats["crunch"] += 1
            except Exception:  # noqa: BLE001
                stats["errors"] += 1
            await asyncio.sleep(crunch_ms / 1000)  # about half of one core per process

    async def watch() -> None:
        while time.monotonic() < end:
            await asyncio.sleep(1.0)
            membership = host.services.membership
            assert membership is not None  # (a Node runs membership unless told not to)
            views = [("here", membership.nodes())]
            for p in peers:
                try:
                    views.append((p.short(), await rt.call(membership_ref(p), "view", (), {}, timeout=5)))
                except Exception as e:  # noqa: BLE001
                    stats["errors"] += 1
                    verdicts.append(f"view of {p.short()} failed: {e}")
            for who, view in views:
                stats["views"] += 1
                for m in view:
                    if m["state"] in ("suspect", "dead"):
                        stats[m["state"]] += 1
                        verdicts.append(f"{who} held {m['peer_id'][-8:]} {m['state']}")

    await asyncio.gather(calls(), watch(), *(crunch(c) for c in crunchers))
    return {"bench": "soak", "seconds": seconds, "processes": len(peers), **stats, "verdicts": verdicts[:10]}
