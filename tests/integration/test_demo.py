"""``make demo`` runs ``lattica demo``: it must run to its end on this machine, with its checks
true (sharded results correct, the supervised workers moved and restored after each loss)."""

from __future__ import annotations

import subprocess
import sys


def test_the_demo_runs_to_the_end_and_its_checks_hold():
    out = subprocess.run([sys.executable, "-m", "lattica.cli", "demo"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "results correct: True" in text
    assert "C resolves 'shard-0' by name" in text
    moved = [line for line in text.splitlines() if "moved and restored from checkpoints" in line]
    assert len(moved) == 2, text
    for line in moved:  # "(k of k moved ...)": every worker of the lost node came back with its state
        k, _, n = line.rsplit("(", 1)[1].split()[:3]
        assert k == n and int(k) > 0, line
    assert "[100, 200, 300, 400, 500, 600]" in moved[-1]
    assert "same tokens as the model in one process: True" in text
    assert text.rstrip().endswith("done.")
