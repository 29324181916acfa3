"""Sharded inference across NATs: the 4-stage pipeline of lattica/mesh/inference.py with its 4
stage nodes behind four NAT kinds (each node serves two stages, so every stage has a replica on
two NATed nodes) and the client behind a fifth; two public relays bootstrap and do not serve.
The client generates through the stubs (stage to stage, relayed or direct as the ladder gives),
one stage node is SIGKILLed between two halves, and the tokens must equal the model's in one
process. Prints tokens/s and the first token's time after the kill (the failover pause).
"""

from __future__ import annotations

import signal
import time

import pytest

from lattica.mesh.inference import TinyLM

from .lab import Lab, TwoRelays
from .test_matrix import Proc, _settled

STAGE_KINDS = ("full_cone", "address_restricted", "port_restricted", "symmetric")
PROMPT = [1, 2, 3, 4]


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


def test_a_pipeline_behind_nats_generates_the_same_tokens_through_a_stage_node_s_death():
    half = 16
    reference = TinyLM(0).generate(PROMPT, 2 * half)
    with Lab(prefix="nlin") as lab:
        relays = TwoRelays(lab)
        stage_sites = [lab.add_site(k) for k in STAGE_KINDS]
        client_site = lab.add_site("port_restricted")
        boot = relays.start().boot
        stages = [Proc(lab, site.host, boot) for site in stage_sites]
        client = Proc(lab, client_site.host, boot)
        everyone = relays.procs + stages + [client]
        try:
            deadline = time.monotonic() + 60
            while not all(_settled(n.ask({"cmd": "status"})) for n in stages + [client]):
                assert time.monotonic() < deadline, "NAT status never settled"
                time.sleep(1)
            for s in range(4):  # stage s on node s and node s - 1, as pipeline() places them
                for i in (s, (s - 1) % 4):
                    assert stages[i].ask({"cmd": "stage", "stage": s, "stages": 4}).get("ok")
            t0 = time.monotonic()
            first = client.ask({"cmd": "generate", "prompt": PROMPT, "n": half}, timeout=120)
            assert "tokens" in first, first
            took = time.monotonic() - t0
            stages[1].p.send_signal(signal.SIGKILL)  # serves stages 1 and 2
            stages[1].p.wait(10)
            second = client.ask({"cmd": "generate", "prompt": PROMPT + first["tokens"], "n": half}, timeout=120)
            assert "tokens" in second, second
            assert first["tokens"] + second["tokens"] == reference
            steady = sorted(first["ms"][2:])
            print(
                f"\ninference across NATs: {half} tokens in {took:.1f} s (with the first lookups); steady "
                f"{steady[len(steady) // 2]:.0f} ms a token; the first token after a stage node's SIGKILL "
                f"{second['ms'][0]:.0f} ms, then {sorted(second['ms'])[len(second['ms']) // 2]:.0f} ms"
            )
        finally:
            for n in everyone:
                try:
                    if n.p.poll() is None:
                        n.p.stdin.write('{"cmd": "quit"}\n')
                        n.p.stdin.flush()
                except OSError:
                    pass
