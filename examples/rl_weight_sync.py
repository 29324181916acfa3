"""RL weight sync across clusters (issue 21; docs/shards.md, "RL weight sync").

A trainer (this process) publishes each new policy as a safetensors object by CID and announces
its version on pub-sub; six rollout workers, supervised, one per node process and grouped into
three clusters, fetch each version by CID (swarming among themselves: the fleet feeds itself),
swap it in between rollouts and send their trajectories back. Mid-way one worker's process is
SIGKILLed: its supervisor restarts it on a spare process, where it starts at the newest version.

    python examples/rl_weight_sync.py [--versions 6] [--mib 16]
"""

from __future__ import annotations

import argparse
import os
import signal

import lattica
from lattica.mesh.weightsync import fleet, sync_versions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", type=int, default=6)
    p.add_argument("--mib", type=int, default=16, help="policy size")
    args = p.parse_args()
    size = args.mib << 20
    with fleet(workers=6, clusters=3, spare=1) as (me, procs, sup, refs, trainer):
        homes = [lattica.get(r.status.remote()) for r in refs]
        for i, h in enumerate(homes):
            print(f"worker w{i} ({h['cluster']}) on node process {h['pid']}")
        half = args.versions // 2

        def chaos(v: int) -> None:
            if v == half + 1:
                os.kill(homes[0]["pid"], signal.SIGKILL)
                print(
                    f"before v{v}: SIGKILL worker w0's node process {homes[0]['pid']} (its supervisor restarts it on the spare)"
                )

        sync_versions(me, trainer, 6, args.versions, size, between=chaos, say=print)
        st = lattica.get(trainer.status.remote())
        print(f"trajectories back at the trainer, steps per policy version: {st['samples']}")
        print(f"w0 now on node process {lattica.get(refs[0].status.remote())['pid']}, running v{st['running']['w0']}")


if __name__ == "__main__":
    main()
