"""Sharded inference between real node processes (lattica/mesh/inference.py, the example
examples/sharded_inference.py): 4 stages x 2 replicas on 4 processes; a stage node SIGKILLed
mid-generation costs a pause, and the tokens are the ones the whole model gives in one process;
a stage with no replica left is an error naming it, not a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest

from lattica.errors import ActorError
from lattica.mesh.inference import TinyLM, generate, pipeline

pytestmark = pytest.mark.timeout(180)

PROMPT = [1, 2, 3, 4]


def test_generation_survives_a_stage_node_killed_mid_way_with_the_same_tokens():
    n = 24
    reference = TinyLM(0).generate(PROMPT, n)
    assert len(set(reference)) > 3  # (a model that says one token over and over would prove nothing)
    with pipeline(processes=4, stages=4) as (node, procs, hosts):
        assert all(len(stages) == 2 for stages in hosts.values())
        r = generate(node, PROMPT, n, kill=procs[1], kill_at=8)
        assert procs[1].proc.wait(10) == -signal.SIGKILL
    print(f"\ntokens/s {r['tokens_s']:.0f}, p50 {r['token_ms_p50']:.1f} ms a token, pause {r['pause_ms']:.0f} ms")
    assert r["tokens"] == reference


def test_a_stage_with_no_replica_left_is_an_error_naming_it():
    with pipeline(processes=4, stages=4) as (node, procs, hosts):
        assert generate(node, PROMPT, 2)["tokens"] == TinyLM(0).generate(PROMPT, 2)
        lost = [i for i, stages in hosts.items() if 2 in stages]
        for i in lost:  # both replicas of stage 2
            os.kill(procs[i].pid, signal.SIGKILL)
            procs[i].proc.wait(10)
        t0 = time.monotonic()
        with pytest.raises(ActorError, match="stage=2"):
            generate(node, PROMPT, 1)
        assert time.monotonic() - t0 < 60
