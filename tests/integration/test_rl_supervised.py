"""examples/rl_supervised.py for real: 4 node processes, a learner and 8 rollout workers under a
supervision tree; one worker node is SIGKILLed (or SIGSTOPped) mid-run. Its workers must come
back on the surviving nodes from their checkpoints, only the trajectories in flight may be lost,
and the learner must keep training to the end."""

from __future__ import annotations

import os
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples")
sys.path.insert(0, EXAMPLES)
import rl_supervised  # noqa: E402

ITERATIONS = 40


@pytest.mark.parametrize("chaos", ["kill", "stop"])
def test_rl_training_survives_the_loss_of_a_worker_node(chaos, capsys):
    lines: list[str] = []
    with rl_supervised.mesh() as procs:
        out = rl_supervised.train(procs, iterations=ITERATIONS, chaos=chaos, chaos_at=ITERATIONS // 2, say=lines.append)
    victim, hosted = out["victim"], out["hosted"]
    assert hosted >= 2  # spread: 8 workers over 3 nodes
    # the run completed: every iteration produced an update
    assert out["version"] == ITERATIONS
    # the victim's workers, and only they, were restarted, and elsewhere
    restarted = [h for h in out["history"] if h["event"] == "restarted"]
    assert len(restarted) == hosted
    assert all(h["from"] == victim and h["to"] != victim for h in restarted)
    assert all(k["node"] != victim for k in out["children"])
    assert sum(k["restarts"] for k in out["children"]) == hosted
    # ... from their checkpoints
    assert out["restored"] == hosted
    # only trajectories in flight to the lost node were lost
    assert out["lost"] <= hosted
    assert out["lost"] + out["collected"] == 8 * ITERATIONS
    # and the policy learned through it (chance is 1/4)
    early, late = sum(out["rewards"][:5]) / 5, sum(out["rewards"][-5:]) / 5
    assert late > early + 0.2, (early, late)
    with capsys.disabled():
        print(f"\nrl_supervised --chaos {chaos}: {lines[-1]}")
