"""Sharded inference on a local mesh (docs/shards.md): a tiny deterministic transformer in numpy,
split into pipeline stages; each stage served by two replicas on different node processes and
registered as a shard; a client generates tokens through the first stage's stub, each stage
forwarding its activations to the next through its own stub (no round trip to the client per
stage); and a stage node SIGKILLed mid-generation costs a short pause, not the generation. Used
by examples/sharded_inference.py, the demo and the tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from lattica._node import Node
from lattica._remote import ActorClass, actor
from lattica.mesh.process import ServerProcess

__all__ = ["TinyLM", "PipelineStage", "pipeline", "generate", "SERVICE"]

SERVICE = "tiny-lm"
TCP = "/ip4/127.0.0.1/tcp/0"
VOCAB, DIM, HEADS, LAYERS, CONTEXT = 64, 32, 2, 8, 48


class TinyLM:
    """A small GPT-style model (pre-norm blocks: causal self-attention and an MLP) with weights
    drawn from ``seed``: the same on every process, so any replica of a stage computes the same."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)

        def w(
            *shape: int,
        ) -> np.ndarray:  # (large: a random model this small says the same token over and over otherwise)
            return rng.standard_normal(shape) * 3.0 / np.sqrt(shape[0])

        self.embed = rng.standard_normal((VOCAB, DIM))
        self.pos = rng.standard_normal((CONTEXT, DIM))
        self.blocks = [
            dict(q=w(DIM, DIM), k=w(DIM, DIM), v=w(DIM, DIM), o=w(DIM, DIM), up=w(DIM, 4 * DIM), down=w(4 * DIM, DIM))
            for _ in range(LAYERS)
        ]

    @staticmethod
    def _norm(x: np.ndarray) -> np.ndarray:
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)

    def block(self, i: int, x: np.ndarray) -> np.ndarray:
        b = self.blocks[i]
        n, head = len(x), DIM // HEADS
        h = self._norm(x)
        q, k, v = (h @ b[m] for m in "qkv")
        out = np.empty_like(x)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for j in range(HEADS):
            s = slice(j * head, (j + 1) * head)
            att = q[:, s] @ k[:, s].T / np.sqrt(head) + mask
            att = np.exp(att - att.max(-1, keepdims=True))
            out[:, s] = (att / att.sum(-1, keepdims=True)) @ v[:, s]
        x = x + out @ b["o"]
        return x + np.maximum(self._norm(x) @ b["up"], 0) @ b["down"]

    def layers_of(self, stage: int, stages: int) -> range:
        per = LAYERS // stages
        return range(stage * per, (stage + 1) * per)

    def run_stage(self, stage: int, stages: int, x: np.ndarray) -> Any:
        """Stage ``stage`` of ``stages``: token ids in (the first), activations between, the next
        token out (the last)."""
        if stage == 0:
            x = self.embed[x] + self.pos[: len(x)]
        for i in self.layers_of(stage, stages):
            x = self.block(i, x)
        if stage == stages - 1:
            return int(np.argmax(self._norm(x[-1]) @ self.embed.T))
        return x

    def generate(self, prompt: list[int], n: int, stages: int = 4) -> list[int]:
        """The reference: the whole model in this process."""
        tokens = list(prompt)
        for _ in range(n):
            x: Any = np.array(tokens[-CONTEXT:])
            for s in range(stages):
                x = self.run_stage(s, stages, x)
            tokens.append(x)
        return tokens[len(prompt) :]


@actor
class PipelineStage:
    """One replica of one stage: computes its layers and hands the activations to the next
    stage's stub (the last returns the token; it comes back along the chain)."""

    def __init__(self, stage: int, stages: int, seed: int = 0, timeout: float = 2.0) -> None:
        self.stage, self.stages, self.timeout = stage, stages, timeout
        self.model = TinyLM(seed)
        self.next: Any = None

    async def forward(self, x: np.ndarray) -> int:
        y = self.model.run_stage(self.stage, self.stages, np.asarray(x))
        if self.stage == self.stages - 1:
            return y
        if self.next is None:
            import lattica.shards  # (in the node process, when the stage first forwards)

            # (within a few attempts: the caller's own attempt on this stage is timed out too)
            self.next = lattica.shards.stub(
                SERVICE, {"stage": self.stage + 1}, timeout=self.timeout, within=4 * self.timeout
            )
        return await self.next.forward.remote(y)

    async def where(self) -> int:
        return os.getpid()


@contextlib.contextmanager
def pipeline(processes: int = 4, stages: int = 4, seed: int = 0) -> Iterator[tuple[Node, list[ServerProcess], dict]]:
    """``processes`` node processes and a client node here; stage ``s`` served by a replica on
    process ``s`` and one on process ``s - 1`` (so losing any one process leaves every stage
    served). Yields the client node, the processes and ``{process index: [stages it hosts]}``."""
    import lattica.shards  # (the client side of the pipeline)

    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(ServerProcess([TCP])) for _ in range(processes)]
        node = stack.enter_context(Node([TCP]))
        for p in procs:
            node.connect(p.addr("tcp"))
        hosts: dict[int, list[int]] = {i: [] for i in range(processes)}
        for s in range(stages):
            for i in (s % processes, (s - 1) % processes):
                ref = node.run(_spawn(procs[i].peer_id, s, stages, seed), timeout=30)
                lattica.shards.serve(ref, SERVICE, {"stage": s}, node=node).result(10)
                hosts[i].append(s)
        deadline = time.monotonic() + 10
        for s in range(stages):
            while len(lattica.shards.providers(SERVICE, {"stage": s}, node=node).result(10)) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"stage {s} is not served twice")
                time.sleep(0.05)
        yield node, procs, hosts


async def _spawn(peer: str, stage: int, stages: int, seed: int) -> Any:
    # (``@actor`` made it an ActorClass; mypy keeps a decorated class's own type)
    ref = cast(ActorClass, PipelineStage).options(node=peer).remote(stage, stages, seed)
    await ref._spawn
    return ref


def generate(
    node: Node,
    prompt: list[int],
    n: int,
    *,
    kill: ServerProcess | None = None,
    kill_at: int = -1,
    say: Callable[[str], None] | None = None,
) -> dict:
    """Generate ``n`` tokens through the pipeline from ``node`` (``kill``: SIGKILL that process
    before token ``kill_at``). The tokens, seconds per token, and the pause the kill caused."""
    import lattica.shards  # (the client side of the pipeline)

    first = lattica.shards.stub(SERVICE, {"stage": 0}, timeout=5.0, node=node)
    tokens, took = list(prompt), []
    killed_at = None
    for i in range(n):
        if kill is not None and i == kill_at:
            os.kill(kill.pid, signal.SIGKILL)
            killed_at = i
            if say:
                say(f"  token {i}: SIGKILL the node process {kill.pid}")
        t0 = time.perf_counter()
        tokens.append(first.forward.remote(np.array(tokens[-CONTEXT:])).result(60))
        took.append(time.perf_counter() - t0)
    out = tokens[len(prompt) :]
    steady = sorted(took[:killed_at] if killed_at else took)
    median = steady[len(steady) // 2] if steady else 0.0
    pause = max(took[killed_at:]) - median if killed_at is not None else 0.0
    return {"tokens": out, "tokens_s": n / sum(took), "token_ms_p50": median * 1000, "pause_ms": pause * 1000}
