"""``lattica bench spill``: a call whose argument and result are over the 64 MiB message cap, so
both travel by CID on their own (lattica._runtime.spill), against the same bytes moved the way a
user would by hand (``content.put`` here, the CID in the call, ``content.get`` there, and back),
and against an array just under the cap that travels in the message; an echo actor in another
process, the same run, medians of ``runs``."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from lattica._node import Node
from lattica._remote import actor
from lattica.bench.rpc import SyncEcho, spawn_on
from lattica.bench.transport import server
from lattica.content import get as content_get
from lattica.content import put as content_put

__all__ = ["bench_spill", "ByHand"]


@actor
class ByHand:
    """What a user writes without spilling: fetch the argument by CID, put the result, return its CID."""

    def echo(self, cid: str) -> str:
        data = content_get(cid).result()
        return str(content_put(data).result())


def bench_spill(mb: int = 256, runs: int = 3) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(1)
    with server("tcp") as (srv, _), Node([]) as node:
        node.connect(srv.addr("tcp"))
        echo = spawn_on(node, SyncEcho, srv.peer_id)
        hand = spawn_on(node, ByHand, srv.peer_id)

        async def call(handle: Any, *args: Any) -> Any:
            return await handle.remote(*args)

        def by_spill(x: np.ndarray) -> float:
            t0 = time.perf_counter()
            back = node.run(call(echo.echo, x), timeout=600)
            took = time.perf_counter() - t0
            assert back.nbytes == x.nbytes and back[-1] == x[-1]
            return took

        def by_hand(x: np.ndarray) -> float:
            t0 = time.perf_counter()
            cid = content_put(x.tobytes(), node=node).result(timeout=600)
            out = node.run(call(hand.echo, str(cid)), timeout=600)
            back = content_get(out, node=node).result(timeout=600)
            took = time.perf_counter() - t0
            assert len(back) == x.nbytes
            return took

        for case, fn, size in (
            (f"{mb} MiB echo, spilled by CID both ways", by_spill, mb << 20),
            (f"{mb} MiB echo, by hand: put, CID in the call, get, put, get", by_hand, mb << 20),
            ("60 MiB echo in the message (under the cap)", by_spill, 60 << 20),
        ):
            # (new bytes every run: nothing is found already stored on either side)
            times = [fn(rng.integers(0, 255, size, dtype=np.uint8)) for _ in range(runs)]
            s = statistics.median(times)
            rows.append(
                {
                    "bench": "spill",
                    "case": case,
                    "runs": runs,
                    "median_s": round(s, 3),
                    "mb_s": round(2 * size / s / 1e6, 1),
                }
            )  # (both ways)
    return rows
