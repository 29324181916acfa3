"""Sharded inference with failover (issue 21; docs/shards.md).

A tiny deterministic transformer split into 4 pipeline stages, each served by two replicas on
different node processes (4 processes) and registered as shards in the DHT. This process
generates tokens through the first stage's stub; each stage forwards its activations to the next
stage's stub. Mid-generation one stage node is SIGKILLed: the stubs fail over to the other
replicas, and the tokens are the same as the whole model gives in one process.

    python examples/sharded_inference.py [--tokens 40] [--kill-at 15 | --no-kill]
"""

from __future__ import annotations

import argparse

from lattica.mesh.inference import TinyLM, generate, pipeline


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--kill-at", type=int, default=15, help="SIGKILL a stage node before this token")
    p.add_argument("--no-kill", action="store_true")
    args = p.parse_args()
    prompt = [1, 2, 3, 4]
    reference = TinyLM(0).generate(prompt, args.tokens)
    with pipeline(processes=4, stages=4) as (node, procs, hosts):
        for i, stages in hosts.items():
            print(f"node process {procs[i].pid} serves stages {stages}")
        victim = None if args.no_kill else procs[1]
        r = generate(node, prompt, args.tokens, kill=victim, kill_at=args.kill_at, say=print)
    print("tokens:", r["tokens"])
    print(f"same tokens as one process: {r['tokens'] == reference}")
    print(f"{r['tokens_s']:.0f} tokens/s through 4 stages (p50 {r['token_ms_p50']:.1f} ms a token)")
    if not args.no_kill:
        print(f"failover pause after the SIGKILL: {r['pause_ms']:.0f} ms")


if __name__ == "__main__":
    main()
