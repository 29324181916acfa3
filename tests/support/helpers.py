"""Helpers shared by the integration tests (importable: tests/support is on sys.path)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Poll ``pred`` until it is truthy or ``timeout`` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


class Where:
    """Where the actors under test live: ``node`` is the caller's own node (``me``) or a peer."""

    def __init__(self, kind: str, me: Any, node: Any) -> None:
        self.kind = kind
        self.me = me
        self.node = node

    @property
    def remote(self) -> bool:
        return self.kind == "remote"

    def spawn(self, cls: Any, *args: Any, **opts: Any) -> Any:
        return cls.options(node=self.node.peer_id, **opts).remote(*args)

    def actor(self, ref: Any) -> Any:
        """The runtime's record of a live actor (for bounds that have no public observable)."""
        return self.node._host.runtime.actors.get(ref.name)


def on_loop(node: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` run on the node's loop (its tables are the loop's), its result returned."""

    async def call() -> Any:
        return fn()

    return node.run(call(), timeout=5)


def call_as(node: Any, ref: Any, method: str, *args: Any, timeout: float = 5, kwargs: dict | None = None) -> Any:
    """Call ``ref.method(*args, **kwargs)`` through ``node`` (a started Node) directly on its
    runtime: the raw system-actor calls a hostile peer would make."""

    async def go() -> Any:
        return await node._host.runtime.call(ref, method, args, kwargs or {}, timeout=timeout)

    return node.run(go(), timeout=timeout + 5)


def spawn_local(node: Any, cls: Any, *args: Any, name: str | None = None) -> Any:
    """Create an actor of ``cls`` (an @lattica.actor class) on ``node`` itself; its ref."""

    async def go() -> Any:
        return node._host.runtime.create(cls.cls, list(args), None, name).ref

    return node.run(go(), timeout=5)


def run_on_pty(
    args: list[str], stdout: Any = None, env: dict[str, str] | None = None, timeout: float = 30.0
) -> tuple[Any, bytes]:
    """Run ``args`` with its stdin and stderr on a terminal (a pty), as a user's would be, until
    it exits: the process (its ``stdout`` as asked: default not kept) and what it wrote there."""
    import os
    import pty
    import select
    import subprocess

    leader, follower = pty.openpty()
    p = subprocess.Popen(
        args, stdin=follower, stdout=subprocess.DEVNULL if stdout is None else stdout, stderr=follower, env=env
    )
    os.close(follower)
    seen = b""
    try:
        while p.poll() is None or select.select([leader], [], [], 0)[0]:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    seen += os.read(leader, 4096)
                except OSError:
                    break
        p.wait(timeout)
    finally:
        os.close(leader)
    return p, seen


def end_child(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """End a child that holds on until its stdin closes: close it, wait ``grace`` seconds, then
    kill it (and reap it either way)."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
