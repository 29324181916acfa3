"""``lattica bench weightsync``: RL weight sync across a fleet (lattica/mesh/weightsync.py): the
time from a policy's announcement until every worker runs it, against one worker fetching a
policy alone, and how many times the policy's size the trainer uploaded (the fleet should mostly
feed itself). ``workers`` node processes on loopback, each its own blockstore; two cores.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

__all__ = ["bench_weightsync"]


def bench_weightsync(workers: int = 8, mib: int = 64, versions: int = 3) -> Iterator[dict[str, Any]]:
    """See the module docstring."""
    import lattica  # (the user API; this bench only)
    from lattica.mesh.weightsync import CHUNK, fleet, sync_versions  # (likewise)

    size = mib << 20
    with fleet(workers=workers, clusters=3, spare=0) as (me, procs, sup, refs, trainer):
        import numpy as np  # (likewise)

        alone = []
        for i in range(2):  # one worker fetching a policy nobody else wants
            cid = lattica.content.put_weights(
                {"policy": np.random.default_rng(1000 + i).standard_normal(size // 4).astype(np.float32)},
                chunk_size=CHUNK,
                node=me,
            ).result(120)
            alone.append(lattica.get(refs[i].time_fetch.remote(cid), timeout=300))
        rows = sync_versions(me, trainer, workers, versions, size, timeout=300)
        single = statistics.median(alone)
        synced = statistics.median(r["all_running_s"] for r in rows)
        yield {
            "bench": "weightsync",
            "workers": workers,
            "mib": mib,
            "versions": versions,
            "one_fetch_s": round(single, 2),
            "all_running_s_p50": round(synced, 2),
            "all_running_s": [r["all_running_s"] for r in rows],
            "vs_one_fetch_x": round(synced / single, 2),
            "trainer_uploaded_x": [r["uploaded_x"] for r in rows],
        }
