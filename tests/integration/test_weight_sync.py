"""RL weight sync across clusters between real node processes (lattica/mesh/weightsync.py, the
example examples/rl_weight_sync.py): a trainer publishes policies by CID and announces them on
pub-sub; six supervised workers in three clusters fetch and run each version and send
trajectories back; a worker whose process was frozen through two versions goes straight to the
newest when it wakes; a worker whose process is SIGKILLed is restarted on a spare process and
runs the newest version there."""

from __future__ import annotations

import os
import signal
import time

import pytest

import lattica
from lattica.mesh.weightsync import fleet, sync_versions

pytestmark = pytest.mark.timeout(240)

MIB = 1 << 20


def _pid_of(refs, name_index):
    return lattica.get(refs[name_index].status.remote(), timeout=10)["pid"]


def test_workers_run_every_version_catch_up_after_a_freeze_and_after_a_restart_elsewhere():
    with fleet(workers=6, clusters=3, spare=1) as (me, procs, sup, refs, trainer):
        rows = sync_versions(me, trainer, 6, 2, 2 * MIB)
        assert [r["version"] for r in rows] == [1, 2]
        st = lattica.get(trainer.status.remote())
        assert set(st["running"].values()) == {2} and len(st["running"]) == 6
        assert sum(st["samples"].values()) > 0  # trajectories came back
        # freeze w0's process through two versions: the other five run them; w0 then goes to the newest
        frozen = _pid_of(refs, 0)
        os.kill(frozen, signal.SIGSTOP)
        try:
            sync_versions(me, trainer, 5, 2, 2 * MIB)
        finally:
            os.kill(frozen, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while lattica.get(trainer.status.remote())["running"].get("w0") != 4:
            assert time.monotonic() < deadline, lattica.get(trainer.status.remote())["running"]
            time.sleep(0.05)
        # SIGKILL w1's process: its supervisor restarts it on the spare, where it runs the newest
        victim = _pid_of(refs, 1)
        os.kill(victim, signal.SIGKILL)
        rows = sync_versions(me, trainer, 6, 1, 2 * MIB, timeout=90)
        assert rows[0]["version"] == 5
        assert _pid_of(refs, 1) != victim  # (the stable ref follows it to its new process)
        homes = {lattica.get(r.status.remote(), timeout=10)["pid"] for r in refs}
        assert victim not in homes and len(homes) == 6


def test_a_policy_whose_blocks_one_peer_corrupts_is_fetched_from_the_others(tmp_path):
    """A worker that holds the policy and answers every block with garbage (right size, wrong
    bytes): a fresh worker's fetch drops it at its first block and takes the policy, verified,
    from the trainer."""
    import numpy as np

    from lattica.config import ContentConfig

    def node(name):
        return lattica.Node(["/ip4/127.0.0.1/tcp/0"], content=ContentConfig(blocks=str(tmp_path / name)))

    policy = np.random.default_rng(7).standard_normal(3 * MIB // 4).astype(np.float32)
    with node("trainer") as trainer, node("liar") as liar, node("fresh") as fresh:
        cid = lattica.content.put_weights({"policy": policy}, chunk_size=256 << 10, node=trainer).result(30)
        liar.connect(trainer.addrs[0])
        assert np.array_equal(lattica.content.get_weights(cid, node=liar).result(30)["policy"], policy)
        svc = liar._host.services.content
        real = svc.store.get
        svc.store.get = lambda c, **kw: bytes(len(real(c)))  # (the liar's blocks: zeros of the right size)
        fresh.connect(liar.addrs[0])
        fresh.connect(trainer.addrs[0])
        got = lattica.content.get_weights(cid, node=fresh).result(60)
        assert np.array_equal(got["policy"], policy)
        stats = {str(p): s for p, s in fresh._host.services.content.last_stats.items()}
        liar_stats = stats[str(liar.peer_id)]
        assert liar_stats.blocks == 0  # (no block of the liar's was used)
        # (asked first here, the liar is dropped at its first answer; were it never asked, the
        # fetch would not have tested it)
        assert liar_stats.asked == 0 or (liar_stats.dropped and "does not match its CID" in liar_stats.reason), (
            liar_stats
        )
