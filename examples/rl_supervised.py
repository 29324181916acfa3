"""Reinforcement learning under a supervision tree, surviving the loss of a node.

A learner and 8 rollout workers on a local mesh of 4 node processes (this one plus 3 started
here). Workers play a contextual-bandit environment with the current policy (a linear softmax
policy in numpy) and return trajectories; the learner takes a policy-gradient step on them and
pushes the new weights to every worker. The tree::

    rl (Supervisor, one_for_one)            on this node
    ├── learner (Learner)                   on this node
    └── workers (Supervisor, one_for_one)   on this node
        └── worker-0 .. worker-7            spread over the other nodes, 1 cpu each, checkpointed

Halfway through, one worker node is killed (``--chaos kill``: SIGKILL) or frozen (``--chaos
stop``: SIGSTOP, a silent loss). Its workers come back on the surviving nodes from their last
checkpoint; calls that were in flight to them fail with ``ActorRestarted`` and those trajectories
are counted as lost; the learner keeps training and the run completes.

Run: ``python examples/rl_supervised.py [--chaos kill|stop|none] [--iterations N]``. The
other nodes import this file as the module ``rl_supervised`` (it is put on their PYTHONPATH).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np

import lattica
from lattica.errors import ActorRestarted
from lattica.mesh.process import ServerProcess

OBS, ACTIONS = 6, 4
TCP = "/ip4/127.0.0.1/tcp/0"


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


@lattica.actor
class RolloutWorker:
    """Plays the environment with the latest weights it was sent; its state is checkpointed."""

    def __init__(self, env_id: int, index: int) -> None:
        self.index = index
        self.target = np.random.default_rng(env_id).standard_normal((OBS, ACTIONS))  # the hidden rule
        self.weights = np.zeros((OBS, ACTIONS))
        self.version = 0
        self.episodes = 0
        self.restored = False

    def rollout(self, steps: int) -> dict:
        """One episode of ``steps`` observations; runs on the worker's own thread."""
        rng = np.random.default_rng([self.index, self.episodes])
        obs = rng.standard_normal((steps, OBS))
        probs = _softmax(obs @ self.weights)
        actions = (probs.cumsum(axis=1) > rng.random((steps, 1))).argmax(axis=1)
        rewards = (actions == (obs @ self.target).argmax(axis=1)).astype(np.float64)
        self.episodes += 1
        return {
            "worker": self.index,
            "version": self.version,
            "obs": obs,
            "actions": actions,
            "rewards": rewards,
            "node": str(lattica.current_actor().peer_id),
            "restored": self.restored,
        }

    async def set_weights(self, weights: np.ndarray, version: int) -> None:
        if version >= self.version:  # idempotent: a repeated or late push changes nothing
            self.weights, self.version = weights, version

    async def checkpoint(self) -> dict:
        return {"weights": self.weights, "version": self.version, "episodes": self.episodes}

    def restore(self, state: dict) -> None:
        self.weights, self.version, self.episodes = state["weights"], state["version"], state["episodes"]
        self.restored = True


@lattica.actor
class Learner:
    """Policy-gradient (REINFORCE with a mean baseline) on the trajectories it is given."""

    def __init__(self, lr: float = 3.0) -> None:
        self.lr = lr
        self.weights = np.zeros((OBS, ACTIONS))
        self.version = 0
        self.workers: list = []

    async def attach(self, workers: list) -> None:
        self.workers = list(workers)

    async def step(self, trajectories: list[dict]) -> dict:
        """Update the policy from ``trajectories`` and push the new weights to every worker."""
        if not trajectories:
            return {"version": self.version, "reward": float("nan"), "samples": 0, "pushed": 0}
        obs = np.concatenate([t["obs"] for t in trajectories])
        actions = np.concatenate([t["actions"] for t in trajectories])
        rewards = np.concatenate([t["rewards"] for t in trajectories])
        probs = _softmax(obs @ self.weights)
        onehot = np.eye(ACTIONS)[actions]
        self.weights = self.weights + self.lr * obs.T @ ((onehot - probs) * (rewards - rewards.mean())[:, None]) / len(
            obs
        )
        self.version += 1
        # set_weights is idempotent: a push in flight when a worker's node died is sent again to
        # the worker's next incarnation
        pushes = [w.set_weights.options(idempotent=True).remote(self.weights, self.version) for w in self.workers]
        pushed = await asyncio.gather(*pushes, return_exceptions=True)
        return {
            "version": self.version,
            "reward": float(rewards.mean()),
            "samples": len(obs),
            "pushed": sum(not isinstance(r, BaseException) for r in pushed),
        }

    async def checkpoint(self) -> dict:
        return {"weights": self.weights, "version": self.version, "workers": self.workers}

    def restore(self, state: dict) -> None:
        self.weights, self.version, self.workers = state["weights"], state["version"], state["workers"]


@contextlib.contextmanager
def mesh(n: int = 3, cpus: int = 4) -> Iterator[list[ServerProcess]]:
    """``n`` node processes that may run this module's actors (``cpus`` each for placement)."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                ServerProcess([TCP], "--allow", "rl_supervised.*", "--resources", json.dumps({"cpu": cpus}), env=env)
            )
            for _ in range(n)
        ]


def train(
    procs: list[ServerProcess],
    iterations: int = 60,
    steps: int = 128,
    chaos: str = "none",
    chaos_at: int | None = None,
    say: Callable[[str], None] = print,
) -> dict:
    """Build the tree on this process's node, train, and (``chaos``) kill or freeze the node that
    hosts worker-0 at iteration ``chaos_at``. Returns what happened (see the keys at the end)."""
    me = lattica.init([TCP], bootstrap=[p.addr("tcp") for p in procs], allow=["rl_supervised.*"], resources={"cpu": 0})
    try:
        return _train(me, procs, iterations, steps, chaos, chaos_at, say)
    finally:
        lattica.shutdown()


def _train(
    me: lattica.Node,
    procs: list[ServerProcess],
    iterations: int,
    steps: int,
    chaos: str,
    chaos_at: int | None,
    say: Callable[[str], None],
) -> dict:
    deadline = time.monotonic() + 15
    while not (len(me.nodes()) == len(procs) + 1 and all("cpu" in r for r in me.nodes())):
        if time.monotonic() > deadline:
            raise lattica.errors.LatticaError(f"the mesh did not form: {me.nodes()}")
        time.sleep(0.05)
    here = str(me.peer_id)

    rl = lattica.Supervisor.options(name="rl").remote(strategy="one_for_one", max_restarts=20, within=60)
    learner = lattica.get(rl.start_child.remote(Learner, id="learner", node=here, checkpoint_every=1.0))
    sup_args = {"strategy": "one_for_one", "max_restarts": 20, "within": 60}
    wsup = lattica.get(rl.start_child.remote(lattica.Supervisor, kwargs=sup_args, id="workers", node=here))
    workers = lattica.get(
        [
            wsup.start_child.remote(
                RolloutWorker,
                args=(7, i),
                id=f"worker-{i}",
                restart="permanent",
                resources={"cpu": 1},
                placement="spread",
                checkpoint_every=0.25,
            )
            for i in range(8)
        ]
    )  # stable refs: valid across restarts
    lattica.get(learner.attach.remote(workers))
    homes = [k["node"] for k in lattica.get(wsup.which_children.remote())]
    short = {str(p.peer_id): f"node{i + 1}" for i, p in enumerate(procs)}
    say(f"8 workers placed: {', '.join(f'{short[n]}={homes.count(n)}' for n in sorted(set(homes)))}")

    chaos_at = iterations // 2 if chaos_at is None else chaos_at
    victim = next(p for p in procs if str(p.peer_id) == homes[0])
    hosted = homes.count(str(victim.peer_id))
    rewards: list[float] = []
    lost = collected = 0
    t_chaos = t_back = None
    t0 = time.monotonic()
    for it in range(iterations):
        futs = [w.rollout.remote(steps) for w in workers]
        if chaos != "none" and it == chaos_at:
            while not all(k["checkpointed"] for k in lattica.get(wsup.which_children.remote())):
                time.sleep(0.05)  # (a short run: let the supervisor hold a checkpoint of each worker first)
            os.kill(victim.proc.pid, signal.SIGKILL if chaos == "kill" else signal.SIGSTOP)  # type: ignore[union-attr]
            t_chaos = time.time()
            say(
                f"iteration {it}: {'SIGKILL' if chaos == 'kill' else 'SIGSTOP'} to {short[str(victim.peer_id)]}, host of {hosted} workers"
            )
        trajectories = []
        for f in futs:
            try:
                trajectories.append(lattica.get(f, timeout=60))
            except ActorRestarted:
                lost += 1  # it was in flight to an incarnation that is gone
        collected += len(trajectories)
        if (
            t_chaos is not None
            and t_back is None
            and len(trajectories) == len(workers)
            and all(t["node"] != str(victim.peer_id) for t in trajectories)
        ):
            t_back = time.time()
        stats = lattica.get(learner.step.remote(trajectories), timeout=60)
        rewards.append(stats["reward"])
        if it % 10 == 0 or it == iterations - 1:
            say(
                f"iteration {it}: mean reward {stats['reward']:.2f} over {stats['samples']} steps, weights v{stats['version']} pushed to {stats['pushed']} workers"
            )
    elapsed = time.monotonic() - t0

    kids = lattica.get(wsup.which_children.remote())
    history = lattica.get(wsup.history.remote())
    restarted = [h for h in history if h["event"] == "restarted"]
    if t_chaos is not None:
        last = max((h["t"] for h in restarted), default=t_chaos) - t_chaos
        say(
            f"{len(restarted)} workers restarted on {', '.join(sorted({short.get(h['to'], h['to']) for h in restarted}))} "
            f"{last:.2f} s after the {chaos}; all 8 answering again after {(t_back or time.time()) - t_chaos:.2f} s; "
            f"{lost} trajectories lost (in flight), {collected} collected"
        )
    if chaos == "stop":
        os.kill(victim.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
    restored = [w for w in lattica.get([w.rollout.remote(1) for w in workers]) if w["restored"]]
    result = {
        "iterations": iterations,
        "elapsed": elapsed,
        "rewards": rewards,
        "lost": lost,
        "collected": collected,
        "victim": str(victim.peer_id),
        "hosted": hosted,
        "homes": homes,
        "children": kids,
        "history": history,
        "restored": len(restored),
        "restart_s": (max((h["t"] for h in restarted), default=0) - t_chaos) if t_chaos else None,
        "answering_s": (t_back - t_chaos) if t_chaos and t_back else None,
        "version": stats["version"],
    }
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chaos", choices=("kill", "stop", "none"), default="kill")
    ap.add_argument("--iterations", type=int, default=60)
    args = ap.parse_args(argv)
    with mesh() as procs:
        out = train(procs, iterations=args.iterations, chaos=args.chaos)
    print(
        f"done: {out['iterations']} iterations in {out['elapsed']:.1f} s, mean reward {out['rewards'][0]:.2f} -> {out['rewards'][-1]:.2f}"
    )


if __name__ == "__main__":
    main()
